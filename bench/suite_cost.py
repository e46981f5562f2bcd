"""What a user's chaos suite costs, and what the reference cache saves: the same scenarios run
side by side in one process: without the cache, with a cold cache, with a warm one (a later
session). Wall time, clean runs and the scenarios not ok per session.

    python bench/suite_cost.py                      # 20 scenarios of tests/workloads/toy_train.py
    python bench/suite_cost.py --catalogue          # 96: 24 each of four user-style scripts

The catalogue-sized suite is four small user-style scripts of tests/workloads (toy_train,
ddp_train, fidelity_train, verdict_train), 24 scenarios each over world sizes 2-4: kills,
planned reshards and preemptions at steps 2-6 of 8. ``--per-script N`` runs a fraction of it.
``--json`` prints one line ``JSON {...}`` (seconds, clean runs, scenarios not ok, and a number
that names the verdicts, equal when every scenario's verdicts are) for bench/before_after.py.
"""
import argparse
import hashlib
import inspect
import json
import os
import tempfile
import time
from pathlib import Path

from pytest_reshard import chaos
from pytest_reshard.session import Session, scenario_from

# The scripts of the commit under test (bench/before_after.py), else this checkout's.
WORKLOADS = Path(os.environ.get("RESHARD_BENCH_TREE", Path(__file__).resolve().parent.parent)) \
    / "tests" / "workloads"
CATALOGUE = ("toy_train", "ddp_train", "fidelity_train", "verdict_train")


def suite(n: int, script: str = "toy_train") -> list:
    """n scenarios over world sizes 2-4: kills, reshards, preemptions at varying steps."""
    out = []
    path = str(WORKLOADS / f"{script}.py")
    for i in range(n):
        size = 2 + i % 3
        kind = i % 3
        fault = (chaos.kill(rank=i % size, at_step=2 + i % 5) if kind == 0 else
                 chaos.shift_shards(to_world_size=max(1, size - 1), at_step=2 + i % 5) if kind == 1
                 else chaos.preempt(at_step=2 + i % 5))
        out.append(scenario_from(path, world_size=size, steps=8, args=["--ckpt-every", "2"],
                                 faults=[fault]))
    return out


def session(scenarios: list, folder: Path, cache: Path | None) -> tuple[float, int, int, list]:
    said: list[str] = []
    start = time.monotonic()
    failed = 0
    verdicts = []
    kw = {"reference_cache": cache} if cache is not None else {}
    with Session(folder, progress=said.append, **kw) as s:
        for i, sc in enumerate(scenarios):
            result = s.run(sc, f"s{i}")
            failed += not result.ok
            verdicts.append(sorted((k, v.status) for k, v in result.verdicts.items()))
    return time.monotonic() - start, sum(m.startswith("reference run") for m in said), failed, \
        verdicts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenarios", type=int, default=20, help="of toy_train (without --catalogue)")
    p.add_argument("--catalogue", action="store_true")
    p.add_argument("--per-script", type=int, default=24, help="with --catalogue")
    p.add_argument("--modes", default="no cache,cold cache,warm cache")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.catalogue:
        scenarios = [sc for script in CATALOGUE for sc in suite(args.per_script, script)]
    else:
        scenarios = suite(args.scenarios)
    modes = args.modes.split(",")
    if "reference_cache" not in inspect.signature(Session).parameters:  # an older commit
        modes = [m for m in modes if m == "no cache"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, mode in enumerate(modes):
            cache = None if mode == "no cache" else root / "cache"
            rows.append((mode, *session(scenarios, root / f"s{i}", cache)))
    base = rows[0][1]
    print(f"{len(scenarios)} scenarios")
    for name, wall, refs, failed, _ in rows:
        print(f"{name:10s} {wall:7.1f} s  ({wall / base:.2f}x)  clean runs {refs:2d}  "
              f"scenarios not ok {failed}")
    if args.json:
        out = {}
        for name, wall, refs, failed, verdicts in rows:
            out.update({f"{name} s": round(wall, 2), f"{name} clean runs": refs,
                        f"{name} not ok": failed,
                        f"{name} verdicts": int(hashlib.sha256(json.dumps(verdicts).encode())
                                                .hexdigest()[:8], 16)})
        print("JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
