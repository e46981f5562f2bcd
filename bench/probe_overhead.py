"""Probe overhead per training step, against the tiny LM's own step time, in one run.

1. Runs the bundled LM (tiny, 4 ranks, fault-free) under the harness and takes the median step
   time (begin -> end on rank 0) from its history.
2. Times the probe calls one such step makes (begin, a samples record, three fault points, a
   loss record, end: seven events) with an active probe writing to a real file.
Prints both and the ratio. Usage: python bench/probe_overhead.py
"""
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from pytest_reshard.probe import Run
from pytest_reshard.session import Session, scenario_from


def step_time(tmp: Path, workload: str) -> float:
    with Session(tmp) as session:
        history = session.execute(scenario_from(workload, world_size=4, steps=30), tmp / "lm")
    begins, durations = {}, []
    for e in history.events:
        if e.get("rank") == 0 and e["ev"] == "begin":
            begins[e["step"]] = e["t"]
        elif e.get("rank") == 0 and e["ev"] == "end":
            durations.append(e["t"] - begins[e["step"]])
    return statistics.median(durations[3:])  # skip warm-up steps


def probe_cost(tmp: Path, steps: int = 5000) -> float:
    run_dir = tmp / "probe"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "plan-g0.json").write_text(json.dumps(
        {"seed": 0, "world_size": 1, "roles": ["trainer"], "faults": []}))
    run = Run({"RESHARD_DIR": str(run_dir), "RESHARD_GENERATION": "0", "RANK": "0",
               "WORLD_SIZE": "1", "RESHARD_SUPERVISOR_PID": str(os.getpid())})
    ids = list(range(3))
    start = time.perf_counter()
    for step in range(steps):
        with run.step(step) as s:
            s.record(samples=ids, epoch=0)
            s.point("forward")
            s.point("backward")
            s.point("optimizer")
            s.record(loss=1.234)
        run.reshard_requested()
        run.stop_requested()
    return (time.perf_counter() - start) / steps


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        step = step_time(tmp, os.environ.get("WORKLOAD", "lm"))
        cost = probe_cost(tmp)
    print(f"tiny LM step (4 ranks, median): {step * 1e3:.2f} ms; probe calls per step: "
          f"{cost * 1e6:.1f} us; overhead {100 * cost / step:.2f}% of a step")


if __name__ == "__main__":
    main()
