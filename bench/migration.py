"""A migration against the in-place reshard and a relaunch, on the same LM, side by side.

The bundled LM (tiny), 4 ranks, 20 steps, a change after step 3, three ways interleaved so they
see the same machine noise:

- ``migrate``: ``chaos.migrate(2)`` with ``--live``: rank 2's shard goes to a new process while
  every rank trains on, swapped in at a step boundary;
- ``live``: ``chaos.shift_shards(to_world_size=3)`` with ``--live``: the in-place reshard (the
  processes re-form the group at once, the shards move while every rank waits);
- ``relaunch``: ``chaos.migrate(2)`` without ``--live``: save, exit, relaunch at the same size,
  load (the warm fork server).

From the history alone: the longest gap between two step ends (the last rank's) from the change's
notice to the new layout's first step, in seconds and in median steps (the steps outside the
change), and the time from the notice to that first step. Every run must pass every checker,
or the numbers are not printed.

Usage: python bench/migration.py [--repeats 3] [--ways migrate,live,relaunch]
"""
import argparse
import statistics
import tempfile
from pathlib import Path

from pytest_reshard import chaos
from pytest_reshard.history import History
from pytest_reshard.session import Session, scenario_from

AT = 3
WAYS = {"migrate": (["--live"], chaos.migrate(2, at_step=AT)),
        "live": (["--live"], chaos.shift_shards(to_world_size=3, at_step=AT)),
        "relaunch": ([], chaos.migrate(2, at_step=AT))}


def figures(history: History) -> tuple[float, float, float]:
    """(longest gap s, longest gap in median steps, notice -> new layout's first step end s)."""
    ends: list[tuple[int, int, float]] = []   # (gen, step, the last rank's end)
    for gen, g in history.generations.items():
        for step in sorted(history.ended(gen)):
            times = history.end_times(gen, step)
            if len(times) == g.world_size:
                ends.append((gen, step, max(times.values())))
    ends.sort(key=lambda e: e[2])
    notice = next(i for i, (gen, step, _) in enumerate(ends) if gen == 0 and step == AT)
    first = next(i for i, (gen, _, _) in enumerate(ends) if gen == 1)
    gaps = [(b[2] - a[2], i) for i, (a, b) in enumerate(zip(ends, ends[1:]))]
    window = [g for g, i in gaps if notice <= i < first]
    steady = [g for g, i in gaps if i < notice or i > first]  # the new world's first: warm-up
    longest = max(window)
    return longest, longest / statistics.median(steady), ends[first][2] - ends[notice][2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ways", default=",".join(WAYS))
    args = p.parse_args()
    ways = args.ways.split(",")
    unknown = set(ways) - set(WAYS)
    if unknown:
        raise SystemExit(f"unknown ways {sorted(unknown)}: use some of {', '.join(WAYS)}")
    got: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for i in range(args.repeats):
            for way in ways:
                extra, fault = WAYS[way]
                # max_stall_steps: on a busy machine of few cores the joiner's warm-up takes a
                # core from training (tests/scenarios/test_migrate.py)
                sc = scenario_from("lm", world_size=4, steps=20, args=extra, faults=[fault],
                                   max_stall_steps=3)
                history = session.execute(sc, Path(tmp) / f"{way}-{i}")
                bad = {name: v for name, v in session.check(sc, history).items()
                       if v.status != "pass"}
                if bad:
                    raise SystemExit(f"{way} run {i} did not pass: " + "; ".join(
                        f"{k} {v.status}: {v.message}" for k, v in bad.items()))
                got[way].append(figures(history))
                s, n, t = got[way][-1]
                print(f"{way:8s} run {i}: longest gap {s:.3f} s ({n:.1f} steps), notice -> "
                      f"first step on the new layout {t:.3f} s", flush=True)
    print(f"\nmedians of {args.repeats} (LM tiny, 4 ranks, the change after step {AT})")
    print(f"{'way':9s} {'longest gap s':>14s} {'in steps':>9s} {'vs migrate':>11s} "
          f"{'to new layout s':>16s}")
    base = statistics.median(g[0] for g in got["migrate"]) if "migrate" in got else None
    for way in ways:
        s, n, t = (statistics.median(g[k] for g in got[way]) for k in range(3))
        ratio = f"{s / base:.1f}x" if base else "-"
        print(f"{way:9s} {s:14.3f} {n:9.1f} {ratio:>11s} {t:16.3f}")


if __name__ == "__main__":
    main()
