"""ckpt-chaos (our closest peer) and our file-event sweep, side by side, on the same user script.

Both kill ``tests/workloads/ckpt_train.py`` (one process, 6 steps, a checkpoint every 2) at the
file events of its saves and judge the resume. ckpt-chaos runs the script once fault-free and
records every file event under ``{out}`` (CPython audit hooks plus wrappers of ``torch.save`` and
``open()``), kills a fresh copy at each (``before`` the event, or ``torn``: the file cut to half
its size), reruns the same command as the resume, and compares ``{out}/final.pt`` with the
fault-free run's (and, with ``--checkpoint-glob``, the resume step with the newest checkpoint left
complete). It sweeps the whole run's events (every save, the final weights); ours sweeps one
save (the one after step 3, writing ``step_4``) and judges each resume from the recorded history.

    python bench/ckpt_chaos_compare.py                      # latest_first and atomic
    python bench/ckpt_chaos_compare.py --mode inplace
    python bench/ckpt_chaos_compare.py --all --events       # every mode; print ckpt-chaos's event log

Needs ``ckpt-chaos`` (pinned in constraints/cpu.txt). Prints one row per tool and mode: the file
events found, the scenarios (crash points) run, the verdict counts, the wall seconds.

What limits ckpt-chaos on this script (seen with 0.1.8): the training is deterministic, so a
resume that replays steps, even from scratch, ends with the same ``final.pt`` and passes; only
``LOST_WORK`` can show a replay, and it tracks only the checkpoints the fault-free run kept (a
pruned ``step_2``, ``prune_first``'s rotation and a planned exit's off-interval save are not
tracked). ``async_unawaited`` loses work only at a normal exit, which ``--chaos-modes term``
reaches and ``before``/``torn`` (kills) do not.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "workloads" / "ckpt_train.py"
BUGS = ("inplace", "latest_first", "prune_first", "async_unawaited")
TRAIN = ["--steps", "6", "--ckpt-every", "2"]


@dataclass
class Outcome:
    tool: str
    mode: str
    events: int | None = None
    scenarios: int | None = None
    verdicts: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    note: str = ""  # "not available", crash points that did not crash, ...


def chaos_dir(work: Path, mode: str, modes: str) -> Path:
    return work / f"ckpt-chaos-{mode}-{modes.replace(',', '+')}"


def ckpt_chaos(mode: str, work: Path, *, max_points: int, timeout: int,
               modes: str = "before,torn") -> Outcome:
    """ckpt-chaos 0.1.8 ``run`` on the script, single process, its own work dir under ``work``.
    ``modes``: its crash modes (``before``, ``torn``, ``term``: SIGTERM at the event, a kill 5 s
    later; ``unsynced``: unsynced writes lost)."""
    wd = chaos_dir(work, mode, modes)
    cmd = [sys.executable, "-m", "ckpt_chaos", "run", "--work", str(wd),
           "--step-regex", r"resumed from step (\d+)", "--result-file", "{out}/final.pt",
           "--max-points", str(max_points), "--timeout", str(timeout), "--modes", modes,
           "--fail-on", "HARD_FAIL,SILENT_DIVERGENCE,LOST_WORK,CONTROL_FAIL"]
    if mode != "inplace":  # model.pt has no step number in its name: nothing for the glob to track
        # Names only: DCP's .metadata pickles the checkpoint's path, so its size differs with the
        # length of each crash point's {out} and no step_N would ever match the fault-free one.
        # DCP renames .metadata into place last, so the names alone still tell a complete dir.
        cmd += ["--checkpoint-glob", "{out}/step_*", "--ckpt-ignore-size"]
    cmd += ["--", sys.executable, str(SCRIPT), "--out", "{out}", "--save", mode, *TRAIN]
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    got = Outcome(f"ckpt-chaos 0.1.8 [{modes}]", mode, wall_s=time.monotonic() - start)
    if wd.is_dir():
        (wd / "stdout.txt").write_text(p.stdout + p.stderr)
    log = wd / "reference" / "events.log.rank0"
    if not log.exists():
        got.note = f"failed (exit {p.returncode}): {(p.stdout + p.stderr).strip().splitlines()[-1:]}"
        return got
    got.events = len(log.read_text().splitlines())
    from ckpt_chaos.runner import rejudge  # the verdict rules `ckpt-chaos judge` applies

    judged = rejudge(wd)
    rows = [r for r in judged if not r.label.startswith("no crash")]
    got.scenarios = len(rows)
    got.verdicts = Counter(r.verdict for r in rows)
    ctl = [r.verdict for r in judged if r.label.startswith("no crash")]
    notes = [f"control {ctl[0]}"] if ctl else []
    if any(not r.crashed for r in rows):
        notes.append(f"{sum(not r.crashed for r in rows)} did not crash")
    if any(r.drift for r in rows):
        notes.append(f"{sum(r.drift for r in rows)} plan drift")
    got.note = ", ".join(notes + [f"exit {p.returncode}"])
    return got


# ---------------------------------------------------------------------------------------------
# OURS: `pytest-reshard sweep`, the one function to check when its command line changes.
# ---------------------------------------------------------------------------------------------
def ours(mode: str, work: Path, *, timeout: int) -> Outcome:
    """Our sweep: kill the one rank at every file event of one save (before the event, or the
    write torn at half its bytes), resume, judge with every checker. ``--save-step 3``: the save
    that follows step 3 and writes ``step_4`` (the harness names a save by the step it follows;
    the saves here follow steps 1, 3, 5). It writes ``DIR/sweep.json``: a list of ``{"event",
    "op", "path", "mode": "before"|"torn", "verdict": "pass"|"fail"|"unknown", "message", "ok",
    ...}``. "not available" when it wrote no readable sweep.json (a non-zero exit with the file
    written is a sweep that found failures, and counts)."""
    art = work / f"ours-{mode}"
    exe = shutil.which("pytest-reshard", path=str(Path(sys.executable).parent)) or "pytest-reshard"
    cmd = [exe, "sweep", str(SCRIPT), "--world-size", "1", "--steps", "6", "--save-step", "3",
           "--artifacts", str(art), "--args", f"--save {mode}"]
    got = Outcome("pytest-reshard sweep", mode)
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout * 20)
        rows = json.loads((art / "sweep.json").read_text())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        got.note = "not available"
        return got
    got.wall_s = time.monotonic() - start
    got.events = len({r["event"] for r in rows})
    got.scenarios = len(rows)
    got.verdicts = Counter(r["verdict"] for r in rows)
    got.note = f"save step 3 only, exit {p.returncode}"
    return got


def table(results: list[Outcome]) -> str:
    head = ("tool", "script mode", "file events", "scenarios", "verdicts", "wall s", "note")
    lines = [head]
    for r in results:
        counts = ", ".join(f"{v} {n}" for v, n in sorted(r.verdicts.items())) or "-"
        lines.append((r.tool, r.mode, "-" if r.events is None else str(r.events),
                      "-" if r.scenarios is None else str(r.scenarios), counts,
                      f"{r.wall_s:.0f}" if r.wall_s else "-", r.note))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*lines[0]), fmt.format(*("-" * w for w in widths))]
    return "\n".join(out + [fmt.format(*row) for row in lines[1:]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=BUGS, default="latest_first", help="the planted bug to run "
                    "next to atomic (default latest_first)")
    ap.add_argument("--all", action="store_true", help="atomic and every planted bug")
    ap.add_argument("--work", type=Path, help="where both tools write (default: a new temp dir)")
    ap.add_argument("--max-points", type=int, default=100, help="ckpt-chaos's cap on crash points "
                    "(default 100: every event of this script, both modes)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per training command")
    ap.add_argument("--chaos-modes", default="before,torn", help="ckpt-chaos's --modes "
                    "(default before,torn; term sends SIGTERM at the event, as a preemption)")
    ap.add_argument("--events", action="store_true", help="print ckpt-chaos's fault-free event log")
    a = ap.parse_args()
    work = (a.work or Path(tempfile.mkdtemp(prefix="ckpt-compare-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    modes = ("atomic", *BUGS) if a.all else ("atomic", a.mode)
    results = []
    for mode in modes:
        for run in (lambda m: ckpt_chaos(m, work, max_points=a.max_points, timeout=a.timeout,
                                         modes=a.chaos_modes),
                    lambda m: ours(m, work, timeout=a.timeout)):
            results.append(run(mode))
            r = results[-1]
            print(f"{r.tool} {mode}: {r.scenarios or 0} scenarios, {dict(r.verdicts)} {r.note}",
                  file=sys.stderr, flush=True)
        if a.events:
            log = chaos_dir(work, mode, a.chaos_modes) / "reference" / "events.log.rank0"
            print(f"\nckpt-chaos events, {mode} (n, kind, file, tornable):\n"
                  + (log.read_text() if log.exists() else "(none)\n"))
    print(table(results))
    print(f"\nwork: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
