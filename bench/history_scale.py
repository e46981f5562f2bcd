"""How loading and judging a history grows with its ranks: synthetic histories shaped like the
bundled LM's, at several sizes, each loaded and judged in a fresh process (its peak memory is its
own), side by side in one run.

    python bench/history_scale.py [--ranks 16,64,256] [--steps 200] [--restarts 2]
                                  [--from RUN_DIR]

Each history is written as the probe and the supervisor write a training run's, event by event
(``encode_event``): per rank and step a begin, its samples, its loss and an end; a save every 10
steps (rank 0's with a digest), a load at each resume. ``--from RUN_DIR`` takes those from a real
run's folder instead (a small one: ``pytest --reshard-artifacts=DIR`` keeps one per test), its
generation 0 replicated and perturbed: each step is the real step's events (fault points,
records with their fields, e.g. the LM's ``epoch``, ``tokens``, ``lr``), its samples as many as
the real rank drew, unique per step and rank, its loss the real curve's (cycled over the steps)
moved by a noise fixed per step, each save and load the real digest's components and fields,
valued per step. R ranks x S steps, with a restart every
S / (restarts + 1) steps (a kill of rank 1 with its detection, the next generation resumed from
the last save, the steps since run again). It then times ``History.load`` and the checkers
that need no clean run (``no_rewind``, ``liveness``, ``state_equivalence``) and, against a clean
history of the same size, ``exactly_once_samples`` and ``loss_continuity``; and reads the
process's peak RSS. The goal the project set: 1,024 ranks x 2,000 steps with 10 restarts loaded
and judged in under 60 s and 4 GB on 2 cores, growing linearly.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pytest_reshard.contract import Ev, RunDir, encode_event, record_file

SAVE_EVERY, PER_RANK = 10, 2
CHECKS = ("no_rewind", "liveness", "state_equivalence", "exactly_once_samples", "loss_continuity")


_OWN = ("ev", "t", "gen", "rank", "step", "#")   # what each written event sets itself


@dataclass
class Shape:
    """What a real run's generation 0 looks like, per rank (0, and the others as its rank 1)."""

    step: list[list[dict]]       # the events between a step's begin and end, per rank
    save: list[dict]             # a save's fields (its digest, seconds, bytes...), per rank
    losses: list[float]          # the real loss curve (rank 0's records)
    per_rank: set[str] = field(default_factory=set)   # components saved per rank

    @classmethod
    def of(cls, run_dir: Path) -> "Shape":
        from pytest_reshard.contract import read_jsonl

        run = RunDir(run_dir)
        steps: list[list[dict]] = []
        saves: list[dict] = []
        losses: list[float] = []
        per_rank: set[str] = set()
        for rank in (0, 1):
            events = [e for _, e in read_jsonl(run.rank_events(0, rank))[0]]
            if not events:
                raise SystemExit(f"--from {run_dir}: no events of rank {rank} in generation 0")
            by_step: dict[int, list[dict]] = {}
            save: dict = {}
            for e in events:
                if e["ev"] == Ev.CKPT_SAVE and not save:
                    save = {k: v for k, v in e.items() if k not in _OWN}
                    per_rank.update(e.get("per_rank") or ())
                elif "step" in e and e["ev"] not in (Ev.BEGIN, Ev.END, Ev.FAULT, Ev.CKPT_SAVE,
                                                     Ev.CKPT_LOAD, Ev.RESUMED, Ev.CKPT_SAVING):
                    by_step.setdefault(int(e["step"]), []).append(e)
            if not by_step or not save:
                raise SystemExit(f"--from {run_dir}: rank {rank} of generation 0 recorded no "
                                 "step or no save; take a run that trains and saves")
            steps.append([{k: v for k, v in e.items() if k not in _OWN} | {"ev": e["ev"]}
                          for e in by_step[min(by_step)]])
            saves.append(save)
            if rank == 0:
                losses = [e["loss"] for s in sorted(by_step) for e in by_step[s] if "loss" in e]
        return cls(steps, saves, losses or [5.0], per_rank)

    def events(self, gen: int, rank: int, step: int, ranks: int, t: float) -> list[dict]:
        out = []
        for e in self.step[min(rank, 1)]:
            e = {**e, "gen": gen, "rank": rank, "step": step, "t": t}
            if "samples" in e:
                k = len(e["samples"])
                e["samples"] = list(range((step * ranks + rank) * k, (step * ranks + rank + 1) * k))
            if "loss" in e:
                e["loss"] = self.losses[step % len(self.losses)] * (1 + 1e-3 * _noise(step))
            out.append(e)
        return out

    def digest(self, rank: int, step: int) -> dict:
        """The real save's fields, its digest valued for this step (and rank, where per rank)."""
        save = self.save[min(rank, 1)]
        return {**save, "digest": {c: f"{v}@{step}" + (f"r{rank}" if c in self.per_rank else "")
                                   for c, v in save.get("digest", {}).items()}}


def _noise(step: int) -> float:
    """A fixed value in [-1, 1) per step: the clean run and the run agree on it."""
    return ((step * 2654435761) % 2**32) / 2**31 - 1


def write(folder: Path, ranks: int, steps: int, restarts: int, record: bool = False,
          shape: Shape | None = None) -> int:
    """A run folder with ``restarts`` unplanned restarts; returns the number of events.
    ``record``: as a production job's record mode writes it (``pytest-reshard judge``): a file
    per process, each launch's restart count in its start event, no supervisor. ``shape``: each
    step, save and load as a real run's (``Shape.of``)."""
    run = RunDir(folder)
    run.events.mkdir(parents=True, exist_ok=True)
    t = 1.0e9
    sup = [{"ev": Ev.SCENARIO, "workload": "lm", "steps": steps, "world_size": ranks, "seed": 0,
            "schedule": {"seed": 0, "faults": []}, "schedule_hash": "synthetic", "t": t}]
    kills = [steps * (k + 1) // (restarts + 1) for k in range(restarts)]
    starts = [0] + [(k // SAVE_EVERY) * SAVE_EVERY for k in kills]
    ends = [k + 1 for k in kills] + [steps]
    count = 0
    for gen, (first, last) in enumerate(zip(starts, ends)):
        sup.append({"ev": Ev.GEN_START, "gen": gen, "world_size": ranks, "roles": ["trainer"] * ranks,
                    "launcher": "fork", "port": 1, "t": t})
        for rank in range(ranks):
            lines = [{"ev": Ev.START, "gen": gen, "rank": rank, "world_size": ranks,
                      "role": "trainer", "pid": 100 + rank, "max_rewind_steps": SAVE_EVERY}]
            if record:   # as the probe records: its generation is its launcher's restart count
                lines[0].update(launcher="torchrun", restart=gen, job="synthetic")
            if first and shape is not None:
                lines.append({**shape.digest(rank, first - 1), "ev": Ev.CKPT_LOAD, "gen": gen,
                              "rank": rank, "step": first - 1})
            elif first:
                lines.append({"ev": Ev.CKPT_LOAD, "gen": gen, "rank": rank, "step": first - 1,
                              "digest": {"model": f"m{first - 1}"} if rank == 0 else {}})
            lines.append({"ev": Ev.RESUMED, "gen": gen, "rank": rank, "step": first,
                          "source": "checkpoint" if first else "fresh"})
            for step in range(first, last):
                tt = t + step
                ids = list(range((step * ranks + rank) * PER_RANK, (step * ranks + rank + 1) * PER_RANK))
                lines.append({"ev": Ev.BEGIN, "gen": gen, "rank": rank, "step": step, "t": tt})
                if shape is not None:
                    lines += shape.events(gen, rank, step, ranks, tt)
                else:
                    lines += [{"ev": Ev.RECORD, "gen": gen, "rank": rank, "step": step,
                               "samples": ids, "t": tt},
                              {"ev": Ev.RECORD, "gen": gen, "rank": rank, "step": step,
                               "loss": 5.0 - step * 1e-3, "t": tt}]
                if gen < len(kills) and step == last - 1 and rank == 1:
                    lines.append({"ev": Ev.FAULT, "gen": gen, "rank": rank, "step": step,
                                  "phase": "backward", "kind": "kill", "id": gen, "params": {},
                                  "t": tt})
                    break
                lines.append({"ev": Ev.END, "gen": gen, "rank": rank, "step": step, "t": tt})
                if (step + 1) % SAVE_EVERY == 0:
                    save = shape.digest(rank, step) if shape is not None else \
                        {"digest": {"model": f"m{step}"} if rank == 0 else {}}
                    lines.append({**save, "ev": Ev.CKPT_SAVE, "gen": gen, "rank": rank,
                                  "step": step, "t": tt})
            else:
                lines.append({"ev": Ev.EXIT, "gen": gen, "rank": rank, "code": 0, "t": t + last})
            name = record_file(rank, "node", 1000 * gen + rank, t) if record else None
            with open(folder / name if name else run.rank_events(gen, rank), "wb") as f:
                f.writelines(encode_event({"t": t, **e}) for e in lines)
            count += len(lines)
        t += steps
        if gen < len(kills):
            sup.append({"ev": Ev.DETECT, "gen": gen, "kind": "died", "rank": 1, "step": last - 1,
                        "phase": "backward", "exit_code": -9, "latency_s": 0.01, "expected": True,
                        "t": t})
        sup.append({"ev": Ev.GEN_END, "gen": gen, "cause": "failure" if gen < len(kills) else
                    "complete", "planned": False, "fault_id": gen if gen < len(kills) else None,
                    "detail": "", "t": t})
    if record:
        return count
    with open(run.supervisor_events, "wb") as f:
        f.writelines(encode_event(e) for e in sup)
    return count + len(sup)


def judge(folder: str, clean: str, record: bool = False) -> None:
    """In this process: load and judge, print one JSON line of seconds and peak RSS."""
    from pytest_reshard.checkers import (exactly_once_samples, liveness, loss_continuity,
                                         no_rewind, state_equivalence)
    from pytest_reshard.history import History
    try:
        from pytest_reshard.history.loading import without_gc
    except ImportError:   # a commit from before it (bench/before_after.py)
        from contextlib import nullcontext as without_gc

    out: dict[str, float | str] = {}
    load = History.load
    if record:
        from pytest_reshard.history.recorded import load_recorded as load
    t0 = time.perf_counter()
    h = load(folder)
    out["load_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = load(clean)
    out["load_reference_s"] = time.perf_counter() - t0
    with without_gc():   # as checkers.run_all judges
        for name, fn in (("no_rewind", no_rewind), ("liveness", liveness),
                         ("state_equivalence", state_equivalence),
                         ("exactly_once_samples", lambda x: exactly_once_samples(x, reference=ref)),
                         ("loss_continuity", lambda x: loss_continuity(x, reference=ref))):
            t1 = time.perf_counter()
            v = fn(h)
            out[f"{name}_s"] = time.perf_counter() - t1
            out[name] = v.status
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="16,64,256")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--restarts", type=int, default=2)
    p.add_argument("--json", action="store_true",
                   help="print the largest size's figures as one JSON line (bench/before_after.py)")
    p.add_argument("--record", action="store_true",
                   help="write and judge record-mode folders, as pytest-reshard judge reads them")
    p.add_argument("--from", dest="source", type=Path,
                   help="a real run's folder whose steps, saves and loss curve the histories copy")
    p.add_argument("--judge", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.judge:
        judge(*args.judge, record=args.record)
        return
    shape = Shape.of(args.source) if args.source else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (int(r) for r in args.ranks.split(",")):
            run, clean = Path(tmp) / f"run-{ranks}", Path(tmp) / f"clean-{ranks}"
            events = write(run, ranks, args.steps, args.restarts, args.record, shape)
            write(clean, ranks, args.steps, 0, args.record, shape)
            done = subprocess.run([sys.executable, __file__, "--judge", str(run), str(clean),
                                   *(["--record"] if args.record else [])],
                                  capture_output=True, text=True, timeout=3600)
            if done.returncode:
                raise SystemExit(done.stderr[-2000:])
            m = json.loads(done.stdout.strip().splitlines()[-1])
            judged = sum(m[f"{k}_s"] for k in CHECKS)
            rows.append((ranks, events, m, judged))
            print(f"{ranks:5d} ranks, {events:9d} events: load {m['load_s']:.2f} s (the clean "
                  f"run's {m['load_reference_s']:.2f} s), judge {judged:.2f} s, peak "
                  f"{m['peak_mb']:.0f} MB; " + ", ".join(f"{k} {m[k]} {m[k + '_s']:.2f} s"
                                                      for k in CHECKS), flush=True)
    base = rows[0]
    print(f"\n{'ranks':>6s} {'events':>10s} {'load s':>7s} {'judge s':>8s} {'total s':>8s} "
          f"{'+ref load s':>12s} {'peak MB':>8s} {'x events':>9s} {'x time':>7s}")
    for ranks, events, m, judged in rows:
        total = m["load_s"] + judged
        print(f"{ranks:6d} {events:10d} {m['load_s']:7.2f} {judged:8.2f} {total:8.2f} "
              f"{m['load_reference_s']:12.2f} {m['peak_mb']:8.0f} {events / base[1]:9.1f} "
              f"{total / (base[2]['load_s'] + base[3]):7.1f}")
    if args.json:
        _, _, m, judged = rows[-1]
        print("JSON " + json.dumps({"load_s": m["load_s"], "judge_s": judged,
                                    "reference_load_s": m["load_reference_s"],
                                    "peak_mb": m["peak_mb"]}))
    print("\ntotal: the run loaded and judged (the judging includes the checks against the "
          "clean run); +ref load: reading the clean run, a second history of the same size")


if __name__ == "__main__":
    main()
