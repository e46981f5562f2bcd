"""Recovery time of a planned reshard under the harness: in place (the LM's ``--live``) against
save-exit-relaunch-load (a warm fork server, and cold interpreters), side by side.

The same scenario each way: the bundled LM (tiny), 4 ranks, ``shift_shards`` to 3 after step 3
and back to 4 after step 7, 12 steps; the three ways interleaved so they see the same machine
noise. For each change it measures, from the history alone, the seconds from the old world's
last step ending (its slowest rank) to every rank of the new world having begun its first step
("ready"), and to every rank having ended it ("+ first step"). A relaunch's time includes its
save, its processes exiting and starting, and its load; a live reshard's its in-memory handover.
Every run must pass every checker, or the numbers are not printed.

Usage: python bench/live_reshard.py [--repeats 3] [--ways live,fork,local] [--size tiny]
"""
import argparse
import statistics
import tempfile
from pathlib import Path

from pytest_reshard import chaos
from pytest_reshard.history import History
from pytest_reshard.session import Session, scenario_from

CHANGES = ((3, 3), (7, 4))  # (after step, to world size)
WAYS = {"live": ("fork", ["--live"]), "fork": ("fork", []), "local": ("local", [])}


def recovery_s(history: History, step: int, gen: int) -> tuple[float, float]:
    """The old world's last ``end`` of ``step`` (generation ``gen``) -> the new world's last
    first ``begin``, and its last first ``end`` (generation ``gen + 1``)."""
    def last(ev: str, g: int, s: int) -> float:
        return max(e["t"] for e in history.events
                   if e["ev"] == ev and e.get("gen") == g and e.get("step") == s)
    done = last("end", gen, step)
    return last("begin", gen + 1, step + 1) - done, last("end", gen + 1, step + 1) - done


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ways", default="live,fork,local")
    p.add_argument("--size", default="tiny")
    args = p.parse_args()
    ways = args.ways.split(",")
    unknown = set(ways) - set(WAYS)
    if unknown:
        raise SystemExit(f"unknown ways {sorted(unknown)}: use some of {', '.join(WAYS)}")
    faults = [chaos.shift_shards(to_world_size=n, at_step=s, notice_s=30) for s, n in CHANGES]
    ready: dict[tuple[str, int], list[float]] = {}
    stepped: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for i in range(args.repeats):
            for way in ways:
                launcher, extra = WAYS[way]
                sc = scenario_from("lm", world_size=4, steps=12, launcher=launcher,
                                   args=["--size", args.size, *extra], faults=faults)
                run_dir = Path(tmp) / f"{way}-{i}"
                history = session.execute(sc, run_dir)
                bad = {name: v for name, v in session.check(sc, history).items()
                       if v.status != "pass"}
                if bad:
                    raise SystemExit(f"{way} run {i} did not pass: " + "; ".join(
                        f"{k} {v.status}: {v.message}" for k, v in bad.items()))
                line = []
                for c, (step, _) in enumerate(CHANGES):
                    r, s = recovery_s(history, step, c)
                    ready.setdefault((way, c), []).append(r)
                    stepped.setdefault((way, c), []).append(s)
                    line.append(f"change {c}: ready {r:.3f} s, + first step {s:.3f} s")
                print(f"{way:5s} run {i}: " + "; ".join(line), flush=True)
    print(f"\nmedians of {args.repeats} (LM {args.size}, 4 -> 3 after step 3, 3 -> 4 after step 7)")
    print(f"{'change':8s} {'way':6s} {'ready s':>9s} {'+1st step s':>12s} {'vs live':>8s}")
    for c in range(len(CHANGES)):
        base = statistics.median(ready[("live", c)]) if "live" in ways else None
        for way in ways:
            r = statistics.median(ready[(way, c)])
            s = statistics.median(stepped[(way, c)])
            ratio = f"{r / base:.1f}x" if base else "-"
            print(f"{('4->3' if c == 0 else '3->4'):8s} {way:6s} {r:9.3f} {s:12.3f} {ratio:>8s}")


if __name__ == "__main__":
    main()
