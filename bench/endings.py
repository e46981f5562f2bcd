"""False alarms from scripts that end normally: N consecutive scenarios of a DDP script that ends
with ``run.close(); dist.destroy_process_group()`` and falls off the end (no ``os._exit``).

Runs ``--runs`` scenarios (default 50) of tests/workloads/ddp_train.py (4 ranks, 30 steps, a
planned reshard 4 -> 3 at step 10, so two generations end per scenario) under ``--launcher``
(default fork), ``--parallel`` at a time (default 2, each in its own session and process), with
``--busy`` spinning processes on top (default 2) so the load average stays at 4 or more on two
cores. The script is correct, so every scenario must pass every checker with no unexpected
detection; any other outcome is a false alarm, and is printed with its first message.

Usage: python bench/endings.py [--runs 50] [--parallel 2] [--busy 2] [--launcher fork]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "workloads" / "ddp_train.py"


def worker(artifacts: Path, runs: int, launcher: str, tag: str) -> None:
    """Run ``runs`` scenarios in one session; one JSON line per scenario on stdout."""
    from pytest_reshard import Session, chaos, scenario_from

    with Session(artifacts) as session:
        for i in range(runs):
            reshard = chaos.shift_shards(to_world_size=3, at_step=10, notice_s=20)
            sc = scenario_from(str(SCRIPT), world_size=4, steps=30, launcher=launcher,
                               faults=[reshard])
            started = time.monotonic()
            result = session.run(sc, f"{tag}-{i}")
            detections = [f"{d.kind} rank {d.rank} step {d.step} {d.phase}"
                          for d in result.history.detections() if not d.expected]
            bad = {k: f"{v.status}: {v.message}"[:200] for k, v in result.verdicts.items()
                   if v.status != "pass"}
            print(json.dumps({"run": f"{tag}-{i}", "wall_s": round(time.monotonic() - started, 1),
                              "detections": detections, "not_passed": bad}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--busy", type=int, default=2, help="spinning processes adding load")
    p.add_argument("--launcher", default="fork")
    p.add_argument("--worker", nargs=3, metavar=("ARTIFACTS", "RUNS", "TAG"),
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        folder, runs, tag = args.worker
        worker(Path(folder), int(runs), args.launcher, tag)
        return
    shares = [args.runs // args.parallel + (i < args.runs % args.parallel)
              for i in range(args.parallel)]
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(2.0):
            loads.append(os.getloadavg()[0])

    busy: list[subprocess.Popen] = []
    workers: list[subprocess.Popen] = []
    rows: list[dict] = []
    lock = threading.Lock()

    def collect(proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                row = json.loads(line)
                with lock:
                    rows.append(row)
                    why = "; ".join(row["detections"] + list(row["not_passed"].values()))
                    print(f"[{len(rows):3d}/{args.runs}] {row['run']}: {row['wall_s']:5.1f} s "
                          f"{'FALSE ALARM ' + why[:300] if why else 'ok'}", flush=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reshard-endings-") as tmp:
        try:
            for _ in range(args.busy):
                busy.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
            threading.Thread(target=sample, daemon=True).start()
            for i, share in enumerate(shares):
                workers.append(subprocess.Popen(
                    [sys.executable, __file__, "--launcher", args.launcher, "--worker",
                     str(Path(tmp) / f"session-{i}"), str(share), f"w{i}"],
                    stdout=subprocess.PIPE, text=True))
            readers = [threading.Thread(target=collect, args=(w,)) for w in workers]
            for r in readers:
                r.start()
            for r in readers:
                r.join()
            for w in workers:
                w.wait()
        finally:
            done.set()
            for proc in busy + workers:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
    alarms = [r for r in rows if r["detections"] or r["not_passed"]]
    own = [r for r in rows if r["detections"]]
    load = (f"load average mean {sum(loads) / len(loads):.1f}, max {max(loads):.1f}" if loads
            else "load not sampled")
    print(f"{args.launcher}: {len(alarms)} false alarms in {len(rows)} scenarios "
          f"({len(own)} with an unexpected detection in the scenario's own run, the rest through "
          f"a failed clean reference run); {args.parallel} in parallel, {args.busy} spinning "
          f"processes, {load}, {time.monotonic() - started:.0f} s")
    if len(rows) < args.runs:
        print(f"only {len(rows)} of {args.runs} scenarios reported: a worker failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
