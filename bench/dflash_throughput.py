"""Tokens/s of the target + drafter pipeline per topology, and the probe's cost per step on it.

1. Runs the bundled ``dflash`` workload fault-free at each topology of 4 ranks (and 2+1, 1+1),
   interleaved and repeated, and prints the drafter role's steady rate (raw wall clock, and per
   CPU other processes left), where each role waited, and the queue depth.
2. Times the probe calls one dflash drafter step makes (begin, a samples + tokens record, four
   fault points, a loss record, end) with an active probe writing to a real file, against the
   median drafter step time measured in (1).

Usage: python bench/dflash_throughput.py [--repeats 3] [--steps 20]
"""
import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from pytest_reshard.checkers import role_rate
from pytest_reshard.probe import Run
from pytest_reshard.session import Session, scenario_from

TOPOLOGIES = [{"target": 2, "drafter": 2}, {"target": 3, "drafter": 1},
              {"target": 1, "drafter": 3}, {"target": 2, "drafter": 1}, {"target": 1, "drafter": 1}]


def name(t: dict) -> str:
    return f"{t['target']}+{t['drafter']}"


def probe_cost(tmp: Path, steps: int = 5000) -> float:
    run_dir = tmp / "probe"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "plan-g0.json").write_text(json.dumps(
        {"seed": 0, "world_size": 1, "roles": ["drafter"], "faults": []}))
    run = Run({"RESHARD_DIR": str(run_dir), "RESHARD_GENERATION": "0", "RANK": "0",
               "WORLD_SIZE": "1", "RESHARD_SUPERVISOR_PID": str(os.getpid())})
    ids = list(range(6))
    start = time.perf_counter()
    for step in range(steps):
        with run.step(step) as s:
            s.point("recv")
            s.record(samples=ids, epoch=0, tokens=288, wait_s=0.001)
            s.point("forward")
            s.point("backward")
            s.point("optimizer")
            s.record(loss=1.234, cpu_s=0.01, busy_s=0.02, cpus=2)
        run.reshard_requested()
        run.stop_requested()
    return (time.perf_counter() - start) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    rates: dict[str, list[tuple[float, float, float, float, float]]] = {}
    step_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for rep in range(args.repeats):
            for topo in TOPOLOGIES:  # interleaved: slow drift of the machine hits all alike
                world = sum(topo.values())
                h = session.execute(scenario_from("dflash", world_size=world, steps=args.steps,
                                                  roles=topo), Path(tmp) / f"{name(topo)}-{rep}")
                r, t = role_rate(h, 0, "drafter"), role_rate(h, 0, "target")
                ends = [h.end_times(0, s) for s in sorted(h.committed(0))]
                wall = max(ends[-1].values()) - max(ends[0].values())
                raw = r.tokens / wall
                rates.setdefault(name(topo), []).append((raw, r.rate, t.wait, r.wait, t.queue or 0))
                if topo == TOPOLOGIES[0]:
                    drafter = next(i for i, x in enumerate(h.generations[0].roles) if x == "drafter")
                    b = {e["step"]: e["t"] for e in h.rank_events("begin", gen=0, rank=drafter)}
                    step_s += [e["t"] - b[e["step"]] for e in h.rank_events("end", gen=0, rank=drafter)][3:]
        cost = probe_cost(Path(tmp))
    print(f"dflash tiny, {args.steps} steps, {args.repeats} interleaved repeats (median):")
    print(f"{'topology':>9} {'Ktok/s raw':>11} {'Ktok/s per free CPU':>20} {'targets wait':>13} "
          f"{'drafters wait':>14} {'queue':>6}")
    base = statistics.median(x[0] for x in rates["2+2"])
    for topo, xs in rates.items():
        med = [statistics.median(x[i] for x in xs) for i in range(5)]
        print(f"{topo:>9} {med[0] / 1e3:>11.1f} {med[1] / 1e3:>20.1f} {med[2]:>13.0%} "
              f"{med[3]:>14.0%} {med[4]:>6.1f}   ({med[0] / base:.2f}x of 2+2)")
    step = statistics.median(step_s)
    print(f"drafter step (2+2, median): {step * 1e3:.1f} ms; probe calls per step: "
          f"{cost * 1e6:.1f} us; overhead {100 * cost / step:.3f}% of a step")


if __name__ == "__main__":
    main()
