"""Detection latency: how long after a fault fires does the supervisor name the rank?

- killed rank: the rank's `fault` event (written just before SIGKILL) -> the `detect` event;
- silently exited rank (exit code 0, no traceback): the `fault` event -> the `detect` event;
- stopped rank (SIGSTOP, a hang): the `fault` event -> the `detect` event.
Usage: python bench/detection.py [--repeats 5]
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
    args = p.parse_args()
    kinds = {"killed": chaos.kill, "silently exited": chaos.crash_silently, "stopped": chaos.hang}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for i in range(args.repeats):
            for name, fault in kinds.items():
                sc = scenario_from(args.workload, world_size=4, steps=6, max_generations=1,
                                   faults=[fault(rank=2, at_step=3, phase="backward")])
                times[name].append(latency(session.execute(sc, Path(tmp) / f"{name}-{i}")))
                print(f"{name:15s} run {i}: {times[name][-1]:.3f} s", flush=True)
    for name, ts in times.items():
        print(f"{name} rank detected after: median {statistics.median(ts):.3f} s, "
              f"max {max(ts):.3f} s over {len(ts)} runs")


if __name__ == "__main__":
    main()
