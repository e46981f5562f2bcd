"""Detection latency: how long after a fault fires does the supervisor name the rank?

- killed rank: the rank's `fault` event (written just before SIGKILL) -> the `detect` event;
- silently exited rank (exit code 0, no traceback): the `fault` event -> the `detect` event;
- stopped rank (SIGSTOP, a hang): the `fault` event -> the `detect` event.
Usage: python bench/detection.py [--repeats 5] [--launchers fork,slurm]

With several launchers the runs interleave (same machine noise) and the medians are printed side
by side with each launcher's ratio to the first. ``slurm`` runs 2 nodes x 2 ranks on the cluster
in SLURM_CONF (``eval "$(.ci/slurm-cluster start /tmp/slurm)"``): its ranks report over the hub.
"""
import argparse
import statistics
import tempfile
from pathlib import Path

from pytest_reshard import chaos
from pytest_reshard.history import History
from pytest_reshard.session import Session, scenario_from


def latency(history: History) -> float:
    fault = next(e["t"] for e in history.events if e["ev"] == "fault")
    detect = next(e["t"] for e in history.events if e["ev"] == "detect")
    return detect - fault


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workload", default="lm")
    p.add_argument("--launchers", default="fork")
    args = p.parse_args()
    launchers = args.launchers.split(",")
    kinds = {"killed": chaos.kill, "silently exited": chaos.crash_silently, "stopped": chaos.hang}
    times = {(k, launcher): [] for k in kinds for launcher in launchers}
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for i in range(args.repeats):
            for name, fault in kinds.items():
                for launcher in launchers:
                    sc = scenario_from(args.workload, world_size=4, steps=6, max_generations=1,
                                       launcher=launcher, nodes=2 if launcher == "slurm" else 1,
                                       faults=[fault(rank=2, at_step=3, phase="backward")])
                    run = Path(tmp) / f"{name}-{launcher}-{i}"
                    times[name, launcher].append(latency(session.execute(sc, run)))
                    print(f"{name:15s} {launcher:8s} run {i}: {times[name, launcher][-1]:.3f} s",
                          flush=True)
    for name in kinds:
        base = statistics.median(times[name, launchers[0]])
        print(f"{name} rank detected after (median of {args.repeats}, max): " + ", ".join(
            f"{launcher} {statistics.median(times[name, launcher]):.3f} s "
            f"({max(times[name, launcher]):.3f} s"
            + (f", {statistics.median(times[name, launcher]) / base:.2f}x {launchers[0]})"
               if launcher != launchers[0] else ")") for launcher in launchers))


if __name__ == "__main__":
    main()
