"""ckpt-chaos's verdict on every catalogue entry (``findings/``), measured beside ours.

For each entry of ``findings.catalog()`` this runs ckpt-chaos 0.1.8's ``run`` mode on the entry's
UNMODIFIED buggy ``train.py`` (no ``--fixed``), the way a user of ckpt-chaos would: ``--ranks``
the entry's world size (when > 1), a few crash points (``--max-points``, default 4) in mode
``before`` (the job killed before one of its file events under ``{out}``), a bounded
``--timeout``, the resume being the same command (ckpt-chaos's default). The scripts save to
folders relative to their working directory outside our harness, so the command is
``sh -c 'mkdir -p {out} && cd {out} && exec env RESHARD_STEPS=<entry's steps> python train.py'``.
No ``--result-file``: no entry's script writes a final result file of its own. Without one
ckpt-chaos cannot compare the resumed run's outcome with the fault-free run's, so its verdicts
come down to whether the resume exited 0 (``PASS``) or not (``HARD_FAIL``), and whether the
fault-free control ran (``CONTROL_FAIL``); ``--checkpoint-glob``'s ``LOST_WORK`` needs a
``--step-regex`` over a line that names the resumed step, which these scripts do not print.

The crash is on rank 0 (ckpt-chaos's default). Seen with 0.1.8: ``--crash-rank N`` with N > 0
never crashes (every point "DID NOT CRASH"): ``run`` arms only rank N but does not set
``CKPT_CHAOS_CRASH_RANK``, and its injector crashes only the rank that variable names (0 by
default); ``CKPT_CHAOS_CRASH_RANK=N`` in ckpt-chaos's environment works around it.

An entry whose bug needs a fault ckpt-chaos has no way to inject (a resume at another world
size, a permuted device mesh, a byte flipped in a finished file) is not run; its row says why.

    python bench/findings_vs_ckpt_chaos.py                  # every entry, writes findings/ckpt_chaos.json
    python bench/findings_vs_ckpt_chaos.py --only dcp_drops_initial_lr
    python bench/findings_vs_ckpt_chaos.py --table          # print the table of the stored JSON

Writes ``findings/ckpt_chaos.json``: ``ckpt_chaos_version`` and ``measured`` (the date) beside
one key per entry's slug, ``{"verdicts": {VERDICT: n}, "control": VERDICT, "exit": n,
"seconds": s, "command": "...", "note": "..."}`` (the crash points' verdicts in ckpt-chaos's own
names; the fault-free control's apart); a not-applicable entry has ``"verdicts": {}``,
``"exit": null`` and its reason in ``note``. ``--only`` updates its entries and keeps the rest.
Entries run one at a time (``--jobs 1``); each whole ckpt-chaos run is bounded (its process
group killed past ``--entry-timeout``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # findings/ is a folder of the repository, not an installed package

from findings import Finding, catalog  # noqa: E402

OUT = ROOT / "findings" / "ckpt_chaos.json"
# ckpt-chaos's crash modes: before / torn (a kill at a file event), term (SIGTERM at a file event,
# a kill after --grace), unsynced (writes not fsynced lost); every one of them at one rank's file
# event, the resume always at the same --ranks, with LOCAL_RANK = RANK.
NOT_INJECTABLE = {
    "shift_shards": "the bug needs a resume at another world size ({from_ws} -> {to_ws} ranks); "
                    "ckpt-chaos resumes with the same --ranks",
    "drain": "the bug needs a resume at another world size; ckpt-chaos resumes with the same "
             "--ranks",
    "rebalance": "the bug needs a resume on a permuted device mesh (LOCAL_RANK moved at the same "
                 "world size); ckpt-chaos always sets LOCAL_RANK = RANK",
    "preempt": "the bug needs a preemption at a step; ckpt-chaos signals (term) only at a file "
               "event",
    "hang": "the bug needs a rank hung at a step; ckpt-chaos only kills or signals",
    "slow_rank": "the bug needs a slow rank; ckpt-chaos only kills or signals",
}
FILE_MODES = {"before", "torn"}   # kill_at_file_event modes ckpt-chaos has (as --modes before/torn)


def not_applicable(f: Finding) -> str | None:
    """Why ckpt-chaos cannot inject what this entry's bug needs, or None when it can try."""
    for fault in f.faults():
        if fault.kind in ("shift_shards", "drain"):
            to_ws = fault.params.get("to_world_size", "fewer")
            return NOT_INJECTABLE[fault.kind].format(from_ws=f.world_size, to_ws=to_ws)
        if fault.kind in NOT_INJECTABLE:
            return NOT_INJECTABLE[fault.kind]
        if fault.kind == "kill_at_file_event" and fault.params.get("mode") not in FILE_MODES:
            return (f"the bug needs a byte {fault.params.get('mode')}ped in a checkpoint file after "
                    "its write completed; ckpt-chaos's crash modes (before, torn, term, unsynced) "
                    "never change a finished file's bytes")
    return None


def command(f: Finding, work: Path, *, max_points: int, timeout: int) -> list[str]:
    inner = (f"mkdir -p {{out}} && cd {{out}} && exec env RESHARD_STEPS={f.steps} "
             f"{shlex.quote(sys.executable)} {shlex.quote(str(f.folder / 'train.py'))}")
    if f.args:
        inner += " " + " ".join(shlex.quote(a) for a in f.args)
    cmd = [sys.executable, "-m", "ckpt_chaos", "run", "--work", str(work),
           "--max-points", str(max_points), "--modes", "before", "--timeout", str(timeout),
           "--jobs", "1"]
    if f.world_size > 1:
        cmd += ["--ranks", str(f.world_size)]
    return cmd + ["--", "sh", "-c", inner]


def run_one(f: Finding, base: Path, *, max_points: int, timeout: int, entry_timeout: int) -> dict:
    reason = not_applicable(f)
    if reason:
        return {"verdicts": {}, "control": None, "exit": None, "seconds": None, "command": "",
                "note": f"not applicable: {reason}"}
    work = base / f.slug
    cmd = command(f, work, max_points=max_points, timeout=timeout)
    start = time.monotonic()
    # its own process group: a run past entry_timeout is killed with every rank it started
    p = subprocess.Popen(cmd, cwd=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        text, _ = p.communicate(timeout=entry_timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, _ = p.communicate(timeout=30)
        rc = None
    seconds = round(time.monotonic() - start, 1)
    if work.is_dir():
        (work / "stdout.txt").write_text(text)
    got = {"verdicts": {}, "control": None, "exit": rc, "seconds": seconds,
           "command": shlex.join(cmd), "note": ""}
    if rc is None:
        got["note"] = f"killed after {entry_timeout} s (the whole ckpt-chaos run)"
    return {**got, **judge(work, got["note"])}


def resume_error(tail: str) -> str:
    """The last line of a failed resume's output that says what went wrong (its error)."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", ln).strip() for ln in tail.splitlines()]
    said = [ln for ln in lines if re.match(r"[\w.]*(Error|Exception)\b|terminate called", ln)]
    line = (said or [ln for ln in lines if ln] or ["(no output)"])[-1]
    return line if len(line) <= 110 else line[:107] + "..."


def judge(work: Path, note: str = "") -> dict:
    """Verdicts, control and note from a finished ckpt-chaos work folder (its own judging rules,
    as ``ckpt-chaos judge``); each failed resume's error is read from its ``result.json``."""
    from ckpt_chaos.runner import rejudge   # the rules `ckpt-chaos judge` applies

    rows = rejudge(work) if work.is_dir() else []
    if not rows:   # it stopped before any crash point: say why, in its own words
        out = work / "stdout.txt"
        last = [ln for ln in (out.read_text() if out.exists() else "").splitlines() if ln.strip()]
        return {"verdicts": {}, "control": None,
                "note": (note or "no crash point judged") + (f": {last[-1].strip()[:300]}" if last else "")}
    points = [r for r in rows if not r.label.startswith("no crash")]
    control = [r.verdict for r in rows if r.label.startswith("no crash")]
    notes = [note] if note else []
    events = work / "reference" / "events.log.rank0"
    if events.exists():
        notes.append(f"{len(events.read_text().splitlines())} file events on rank 0")
    if any(not r.crashed for r in points):
        notes.append(f"{sum(not r.crashed for r in points)} of {len(points)} did not crash")
    if any(r.drift for r in points):
        notes.append(f"{sum(r.drift for r in points)} plan drift")
    errors: Counter = Counter()
    for rec in (json.loads(p.read_text()) for p in sorted(work.glob("pt_[0-9]*/result.json"))):
        raised = rec["outcome"]["raised"]
        if raised:
            errors[f"{raised}: {resume_error(rec.get('resume_tail', ''))}"] += 1
    if errors:
        notes.append("resume failed: " + "; ".join(f"{n}x {e}" for e, n in errors.most_common()))
    return {"verdicts": dict(sorted(Counter(r.verdict for r in points).items())),
            "control": control[0] if control else None, "note": "; ".join(notes)}


def summary(entry: dict) -> str:
    """A short verdict summary: "PASS x4", "HARD_FAIL x2, PASS x2", "not applicable: ..."."""
    if entry.get("exit") is None and entry["note"].startswith("not applicable"):
        return entry["note"]
    counts = ", ".join(f"{v} x{n}" for v, n in sorted(entry["verdicts"].items(),
                                                      key=lambda kv: (-kv[1], kv[0])))
    if entry.get("control") not in (None, "PASS"):
        counts = f"{counts}; control {entry['control']}" if counts else f"control {entry['control']}"
    return counts or f"no verdict ({entry['note']})"


def table(results: dict) -> str:
    head = ("entry", "ckpt-chaos verdicts", "exit", "seconds")
    lines = [head]
    for slug, e in results.items():
        if slug in ("ckpt_chaos_version", "measured"):
            continue
        s = summary(e)
        lines.append((slug, s if len(s) <= 60 else s[:57] + "...",
                      "-" if e["exit"] is None else str(e["exit"]),
                      "-" if e["seconds"] is None else f"{e['seconds']:.0f}"))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*lines[0]), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*row) for row in lines[1:]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", metavar="SLUG", action="append", help="run this entry (repeatable)")
    ap.add_argument("--max-points", type=int, default=4, help="ckpt-chaos's crash points (default 4)")
    ap.add_argument("--timeout", type=int, default=180, help="ckpt-chaos's --timeout: seconds per "
                    "training command (default 180)")
    ap.add_argument("--entry-timeout", type=int, default=900, help="seconds for one entry's whole "
                    "ckpt-chaos run before its process group is killed (default 900)")
    ap.add_argument("--work", type=Path, help="where ckpt-chaos writes (default: a new temp dir)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"the JSON (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--table", action="store_true", help="print the stored JSON's table, run nothing")
    ap.add_argument("--rejudge", type=Path, metavar="WORK", help="run nothing: judge the entries "
                    "finished under WORK (an earlier run's --work) again, keeping their exit, "
                    "seconds and command from the stored JSON")
    a = ap.parse_args()
    stored = json.loads(a.out.read_text()) if a.out.exists() else {}
    if a.table:
        print(table(stored))
        return 0
    entries = catalog()
    if a.rejudge:
        for slug, e in stored.items():
            if slug in entries and (a.rejudge / slug).is_dir():
                killed = [n for n in e["note"].split("; ") if n.startswith("killed after")]
                e.update(judge(a.rejudge.resolve() / slug, killed[0] if killed else ""))
        a.out.write_text(json.dumps(stored, indent=1) + "\n")
        print(table(stored))
        return 0
    unknown = sorted(set(a.only or ()) - set(entries))
    if unknown:
        ap.error(f"no such entry: {', '.join(unknown)}")
    base = (a.work or Path(tempfile.mkdtemp(prefix="findings-ckpt-chaos-"))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    results = {k: v for k, v in stored.items() if k in entries} if a.only else {}
    for slug, f in entries.items():
        if a.only and slug not in a.only:
            continue
        results[slug] = run_one(f, base, max_points=a.max_points, timeout=a.timeout,
                                entry_timeout=a.entry_timeout)
        e = results[slug]
        print(f"{slug}: {summary(e)} (exit {e['exit']}, {e['seconds']} s)", file=sys.stderr,
              flush=True)
    ordered = {"ckpt_chaos_version": metadata.version("ckpt-chaos"),
               "measured": datetime.date.today().isoformat(),
               **{s: results[s] for s in entries if s in results}}
    a.out.write_text(json.dumps(ordered, indent=1) + "\n")
    print(table(ordered))
    print(f"\nwork: {base}\nwrote: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
