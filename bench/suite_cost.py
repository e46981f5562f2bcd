"""What a user's chaos suite costs, and what the reference cache saves: the same 20 scenarios of a
user-style script (tests/workloads/toy_train.py) run three times side by side: without the cache,
with a cold cache, with a warm one (a later session). Wall time and clean runs per session.

Usage: python bench/suite_cost.py [--scenarios 20]
"""
import argparse
import tempfile
import time
from pathlib import Path

from pytest_reshard import chaos
from pytest_reshard.session import Session, scenario_from

TOY = str(Path(__file__).resolve().parent.parent / "tests" / "workloads" / "toy_train.py")


def suite(n: int) -> list:
    """n scenarios over world sizes 2-4: kills, reshards, preemptions at varying steps."""
    out = []
    for i in range(n):
        size = 2 + i % 3
        kind = i % 3
        fault = (chaos.kill(rank=i % size, at_step=2 + i % 5) if kind == 0 else
                 chaos.shift_shards(to_world_size=max(1, size - 1), at_step=2 + i % 5) if kind == 1
                 else chaos.preempt(at_step=2 + i % 5))
        out.append(scenario_from(TOY, world_size=size, steps=8, args=["--ckpt-every", "2"],
                                 faults=[fault]))
    return out


def session(scenarios: list, folder: Path, cache: Path | None) -> tuple[float, int, int]:
    said: list[str] = []
    start = time.monotonic()
    failed = 0
    with Session(folder, progress=said.append, reference_cache=cache) as s:
        for i, sc in enumerate(scenarios):
            failed += not s.run(sc, f"s{i}").ok
    return time.monotonic() - start, sum(m.startswith("reference run") for m in said), failed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenarios", type=int, default=20)
    args = p.parse_args()
    scenarios = suite(args.scenarios)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = [("no cache", *session(scenarios, root / "a", None)),
                ("cold cache", *session(scenarios, root / "b", root / "cache")),
                ("warm cache", *session(scenarios, root / "c", root / "cache"))]
    base = rows[0][1]
    for name, wall, refs, failed in rows:
        print(f"{name:10s} {wall:7.1f} s  ({wall / base:.2f}x)  clean runs {refs:2d}  "
              f"scenarios not ok {failed}")


if __name__ == "__main__":
    main()
