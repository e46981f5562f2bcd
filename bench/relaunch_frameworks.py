"""Relaunch latency with a framework preloaded: from the end of a generation to the next
generation's ranks up (their probe attached) and to its first step.

Runs the same planned reshard (2 -> 1 rank) of each framework script in tests/workloads/ (Hugging
Face Trainer, Lightning, Accelerate; torchtitan, whose data loader refuses a new world size, is
preempted instead and relaunched at 2 ranks) with the warm fork server, which preloads the framework as
the adapter's WorkloadSpec says, and with cold interpreters, interleaved so both see the same
machine noise; prints the medians and their ratio. Goal: ranks up within 0.5 s with the fork
server. Usage: python bench/relaunch_frameworks.py [--repeats 3] [--frameworks hf,lightning,accelerate,torchtitan]
An external Trainer script, registered through hf.workload and measured after the frameworks:
[--script PATH --name NAME --preload module,... --script-args="ARGS" --steps-arg=--max_steps]
"""
import argparse
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from relaunch import relaunch_s  # noqa: E402

from pytest_reshard import chaos  # noqa: E402
from pytest_reshard.session import Session, scenario_from  # noqa: E402

WORKLOADS = ROOT / "tests" / "workloads"
EXTERNAL: dict[str, list[str]] = {}  # --script: its name -> its command line


def register(framework: str) -> str:
    if framework in EXTERNAL:
        return framework
    if framework == "hf":
        from pytest_reshard.adapters import hf

        hf.workload("hf_train", WORKLOADS / "hf_train.py",
                    preload=("transformers.models.gpt2.modeling_gpt2",))
        return "hf_train"
    if framework == "lightning":
        from pytest_reshard.adapters import lightning

        lightning.workload("lightning_train", WORKLOADS / "lightning_train.py")
        return "lightning_train"
    if framework == "accelerate":
        from pytest_reshard.adapters import accelerate

        accelerate.workload("accelerate_train", WORKLOADS / "accelerate_train.py")
        return "accelerate_train"
    if framework == "torchtitan":
        from pytest_reshard.adapters import torchtitan

        torchtitan.workload("titan_train", WORKLOADS / "titan_train.py",
                            preload=("pytest_reshard.adapters.torchtitan_cpu",))
        return "titan_train"
    raise SystemExit(f"unknown framework {framework!r}: hf, lightning, accelerate, torchtitan")


def fault(framework: str) -> chaos.Fault:
    """A planned end after step 2: a shift to 1 rank, or for torchtitan (whose data loader
    refuses another degree) a preemption, relaunched at 2."""
    if framework == "torchtitan":  # 30 s, a spot VM's notice: a cold rank's exit can outlast 10 s
        return chaos.preempt(at_step=2, phase="forward", grace_s=30)
    return chaos.shift_shards(to_world_size=1, at_step=2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frameworks", default="hf,lightning,accelerate")
    p.add_argument("--script", help="an external Hugging Face Trainer script, also measured")
    p.add_argument("--name", help="its name in the table (default: the file's stem)")
    p.add_argument("--preload", default="", help="modules the fork server imports for it, "
                   "besides transformers (comma-separated)")
    p.add_argument("--script-args", default="", help="its command line, one string")
    p.add_argument("--steps-arg", help="its option for the step count (default: RESHARD_STEPS)")
    args = p.parse_args()
    frameworks = [f for f in args.frameworks.split(",") if f]
    if args.script:
        from pytest_reshard.adapters import hf

        name = args.name or Path(args.script).stem
        hf.workload(name, Path(args.script).resolve(), steps_arg=args.steps_arg,
                    preload=tuple(m for m in args.preload.split(",") if m))
        EXTERNAL[name] = shlex.split(args.script_args)
        frameworks.append(name)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for framework in frameworks:
            workload = register(framework)
            up: dict[str, list[float]] = {"fork": [], "local": []}
            first: dict[str, list[float]] = {"fork": [], "local": []}
            for i in range(args.repeats):
                for launcher in up:
                    sc = scenario_from(workload, world_size=2, steps=5, launcher=launcher,
                                       args=EXTERNAL.get(framework, []), faults=[fault(framework)])
                    history = session.execute(sc, Path(tmp) / f"{framework}-{launcher}-{i}")
                    up[launcher].append(relaunch_s(history, "start"))
                    first[launcher].append(relaunch_s(history))
                    print(f"{framework:10s} {launcher:5s} run {i}: ranks up {up[launcher][-1]:.3f} s, "
                          f"first step {first[launcher][-1]:.3f} s", flush=True)
            rows.append((framework, *(statistics.median(d[k]) for d in (up, first)
                                      for k in ("fork", "local"))))
    print(f"\nrelaunch (2 -> 1 rank; torchtitan 2 -> 2), median of {args.repeats}, seconds:")
    print(f"{'framework':10s} {'ranks up: fork':>15s} {'cold':>6s} {'ratio':>6s}   "
          f"{'first step: fork':>17s} {'cold':>6s}")
    for framework, up_fork, up_cold, first_fork, first_cold in rows:
        print(f"{framework:10s} {up_fork:15.3f} {up_cold:6.3f} {up_cold / up_fork:5.1f}x   "
              f"{first_fork:17.3f} {first_cold:6.3f}")


if __name__ == "__main__":
    main()
