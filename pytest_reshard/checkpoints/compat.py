"""Checkpoint compatibility across stacks: written under the old one, loaded and resharded under
the new one, and judged by state equivalence (the digests of every component, saved vs loaded).

    python -m pytest_reshard.checkpoints.compat save DIR   # old stack: the LM at 4 ranks writes a DCP checkpoint
    python -m pytest_reshard.checkpoints.compat load DIR   # new stack: the LM resumes from it at 3 ranks

``save`` runs the bundled LM for a few steps and keeps its last checkpoint and the digest of the
state it saved (``DIR/checkpoint/``, ``DIR/saved.json``). ``load`` starts the LM at a different
world size from that checkpoint, so DCP reshards it on load, lets it train two more steps, and
writes ``DIR/verdict.json``: pass when every component (model, optimizer, step, LR schedule, data
position, RNG) loaded equal to what the old stack saved and the run finished; fail naming the
components that differ; never a pass without a load to compare. The ``pytest-reshard gate``
command runs both (``pytest_reshard.gate.stacks``).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from pytest_reshard.contract import RunDir

SAVE_WORLD, LOAD_WORLD = 4, 3
SAVE_STEPS, MORE_STEPS = 6, 2


def _run_lm(run_dir: Path, world_size: int, steps: int, size: str) -> Any:
    """The LM under the supervisor (no reference runs: only its checkpoints matter here)."""
    from pytest_reshard import checkers
    from pytest_reshard.history import History
    from pytest_reshard.supervisor import Scenario, Supervisor

    scenario = Scenario(workload="lm", world_size=world_size, steps=steps, timeout_s=240,
                        args=["--size", size, "--ckpt-every", "3"])
    Supervisor(scenario, run_dir, progress=lambda m: print(f"  {m}", flush=True)).run()
    history = History.load(run_dir)
    return history, checkers.liveness(history)


def save(out: Path, size: str = "tiny") -> int:
    from pytest_reshard.fixtures._common import CheckpointStore
    from pytest_reshard.gate.baseline import environment

    run_dir = out / "save-run"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    history, live = _run_lm(run_dir, SAVE_WORLD, SAVE_STEPS, size)
    saves = [c for c in history.checkpoints("save") if c.digest]
    store = CheckpointStore(RunDir(run_dir).work / "ckpt")
    if live.status != "pass" or not saves or not store.committed():
        print(f"ckptcompat save: the LM did not write a checkpoint to compare ({live.message}); "
              f"logs in {run_dir / 'logs'}", file=sys.stderr)
        return 1
    step = store.committed()[-1]
    digest = next(c.digest for c in reversed(saves) if c.step == step)
    shutil.copytree(store.path(step), out / "checkpoint" / store.path(step).name)
    (out / "saved.json").write_text(json.dumps({
        "step": step, "world_size": SAVE_WORLD, "size": size, "digest": dict(digest),
        "environment": environment()}, indent=2))
    print(f"saved the state after step {step} at world size {SAVE_WORLD} to {out}")
    return 0


def judge(saved: dict[str, Any], loaded: dict[str, str] | None, *, loaded_world: int,
          finished: bool, why_not: str, new_env: dict[str, Any]) -> dict[str, Any]:
    """The verdict (pure): every saved component loaded equal, and the run went on."""
    old_t, new_t = saved.get("environment", {}).get("torch", "?"), new_env.get("torch", "?")
    what = (f"step {saved['step']} written by torch {old_t} at world size {saved['world_size']}, "
            f"loaded by torch {new_t} at world size {loaded_world}")
    if loaded is None:
        return {"status": "fail", "message": f"{what}: no load was recorded (the new stack started "
                f"fresh or died first){': ' + why_not if why_not else ''}"}
    common = sorted(set(saved["digest"]) & set(loaded))
    if not common:
        return {"status": "fail", "message": f"{what}: no component to compare (saved "
                f"{sorted(saved['digest'])}, loaded {sorted(loaded)})"}
    differ = [c for c in common if saved["digest"][c] != loaded[c]]
    if differ:
        return {"status": "fail", "differ": differ, "message": f"{what}: "
                + ", ".join(f"{c} {saved['digest'][c]} -> {loaded[c]}" for c in differ)
                + " (state differs after the load: the new stack reads this checkpoint wrong)"}
    if not finished:
        return {"status": "fail", "message": f"{what}: state equal ({len(common)} components) but "
                f"training did not go on: {why_not}"}
    return {"status": "pass", "message": f"{what}: {len(common)} of {len(common)} components "
            f"equal ({', '.join(common)}); trained {MORE_STEPS} more steps"}


def load(src: Path) -> int:
    from pytest_reshard.fixtures._common import CheckpointStore
    from pytest_reshard.gate.baseline import environment

    saved = json.loads((src / "saved.json").read_text())
    run_dir = src / "load-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    store = CheckpointStore(RunDir(run_dir).work / "ckpt")
    shutil.copytree(src / "checkpoint" / store.path(saved["step"]).name, store.path(saved["step"]))
    history, live = _run_lm(run_dir, LOAD_WORLD, saved["step"] + 1 + MORE_STEPS, saved["size"])
    loads = [c for c in history.checkpoints("load") if c.digest and c.step == saved["step"]]
    result = judge(saved, dict(loads[0].digest) if loads else None, loaded_world=LOAD_WORLD,
                   finished=live.status == "pass", why_not=live.message if live.status != "pass"
                   else "", new_env=environment())
    (src / "verdict.json").write_text(json.dumps(result, indent=2))
    print(f"{result['status'].upper()}: {result['message']}")
    return 0 if result["status"] == "pass" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_reshard.checkpoints.compat",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("save", "load"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--size", default="tiny", help="LM size for save (tiny, small, gpt2)")
    args = parser.parse_args(argv)
    return save(args.dir.resolve(), args.size) if args.action == "save" else load(args.dir.resolve())


if __name__ == "__main__":
    sys.exit(main())
