"""Helpers the checkers share to word their messages (and find the generation before another)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from pytest_reshard.contract import ADVICE, Cause, RunDir
from pytest_reshard.history import Generation, History

#: How many further problems a summary lists after the first.
_MAX_LISTED = 3


def _ranges(steps: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0..2, 5, 7..8"``."""
    out: list[str] = []
    items = sorted(set(steps))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}..{items[j]}")
        i = j + 1
    return ", ".join(out)


def _previous(history: History, gen: int) -> Generation | None:
    earlier = [g for g in history.generations if g < gen]
    return history.generations[max(earlier)] if earlier else None


def _fault_before(history: History, gen: int) -> str | None:
    """The scheduled fault that ended the generation before ``gen``, described."""
    prev = _previous(history, gen)
    return history.describe_fault(prev.fault_id) if prev else None


def _cause_phrase(history: History, ended: Generation) -> str:
    """How a generation ended, in words: 'a planned reshard (shift_shards(all) at step 12 ...)'."""
    fault = history.describe_fault(ended.fault_id)
    words = {
        Cause.RESHARD: "a planned reshard" if ended.planned else "an unplanned reshard",
        Cause.PREEMPT: "a preemption (SIGTERM)", Cause.FAILURE: "an unplanned failure",
        Cause.HANG: "a hang", Cause.TIMEOUT: "a timeout", "error": "a harness error",
        Cause.COMPLETE: "a completed generation", Cause.DRAIN: "a drain the workload requested",
        Cause.REBALANCE: "a planned rebalance",
    }
    if ended.cause is None:
        return f"generation {ended.gen} ended with no supervisor record (treated as unplanned)"
    text = words.get(ended.cause, f"{'a planned' if ended.planned else 'an unplanned'} "
                                  f"{ended.cause}")
    return f"{text} ({fault})" if fault else text


def _advice(history: History, check: str) -> str | None:
    """What the workload said to do about ``check`` (``run.advise``), each text once."""
    texts = [str(n.fields.get("text")) for n in history.notes(ADVICE)
             if n.fields.get("check") == check and n.fields.get("text")]
    return "; ".join(dict.fromkeys(texts)) or None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _summarise(messages: list[str]) -> str:
    """The first message, plus a count and the next few."""
    if len(messages) == 1:
        return messages[0]
    more = messages[1:1 + _MAX_LISTED]
    tail = "; ".join(more) + ("; ..." if len(messages) > 1 + _MAX_LISTED else "")
    return f"{messages[0]} (+{len(messages) - 1} more: {tail})"


#: How much of a rank's log's end is read for a message (what a rank printed before that is not).
LOG_TAIL_BYTES = 1 << 20


def _log_hint(run_dir: str | Path | None, gen: int, rank: int) -> str:
    """``; read its log, logs/g0-r1.log in the run folder``; under node agents, whose ranks
    write into their node's log, the node logs instead."""
    rank_log = RunDir(Path()).log(gen, rank)
    if run_dir is not None and not (Path(run_dir) / rank_log).exists():
        nodes = sorted(p.name for p in (Path(run_dir) / rank_log.parent).glob("g*-node*.log"))
        if nodes:
            return (f"; its output is in its node's log ({', '.join(f'{rank_log.parent}/{n}' for n in nodes)}"
                    " in the run folder)")
    return f"; read its log, {rank_log} in the run folder"


def _log_tail(run_dir: str | Path | None, gen: int, rank: int, lines: int = 12) -> str:
    """``; its log, RUN/logs/g0-r1.log, ends: <last lines>`` (the relative path when the run
    folder is not known, nothing more when the log is empty or unreadable)."""
    if run_dir is None:
        return f"; read its log, {RunDir(Path()).log(gen, rank)} in the run folder"
    folder = RunDir(Path(run_dir))
    path = folder.log(gen, rank)
    mine = lambda line: True  # noqa: E731 - every line of the rank's own log is its own
    shared = folder.step_log(gen)
    if not path.exists() and shared.exists():
        # under SLURM the ranks' output is the step's, one file: torch prefixes what a rank
        # raises with [rank<N>]:
        path, mine = shared, lambda line: f"[rank{rank}]:" in line
    try:
        with open(path, "rb") as f:   # a rank flooding its log must not flood the harness
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return f"; its log {path} could not be read"
    lines_read = text.splitlines()[1 if size > LOG_TAIL_BYTES else 0:]   # the first is cut
    own = [ln.rstrip() for ln in lines_read if ln.strip() and mine(ln)]
    if not own:
        return f"; its log {path} is empty"
    tail = own[-lines:]
    raised = _last_traceback(own[:-lines])  # one the tail does not show already
    return (f"; its log {path}" + (f" has a traceback: {raised}; the log" if raised else "")
            + " ends:\n    " + "\n    ".join(tail))


def _stack(run_dir: str | Path | None, gen: int, rank: int, frames: int = 6) -> str:
    """``; its main thread was in: File "train.py", line 80 in main <- ...``: the innermost frames
    of the main thread in the last stack dump of the rank (``STACK_SIGNAL``: in its stacks file,
    else its log), or ""."""
    if run_dir is None:
        return ""
    folder = RunDir(Path(run_dir))
    path = folder.stacks(gen, rank)
    if not path.exists() or not path.stat().st_size:
        path = folder.log(gen, rank)
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    blocks: list[list[str]] = []
    for ln in lines:
        if "thread 0x" in ln.lower() and "(most recent call first)" in ln:
            blocks.append([])
        elif blocks and ln.startswith("  File "):
            blocks[-1].append(ln.strip())
    main = next((b for b in reversed(blocks) if any(f.endswith(" in <module>") for f in b)), None)
    if not main:
        return ""
    script = next(i for i, f in enumerate(main) if f.endswith(" in <module>"))
    stack = main[:script + 1]
    # the innermost frame (where it waits), then the workload's own: a library's many frames
    # (torch's collectives) would hide where in the script it was
    own = [f for f in stack[1:] if "site-packages" not in f and "/lib/python" not in f]
    library = len(stack) - 1 - len(own)
    return ("; its main thread was in: " + " <- ".join([stack[0], *own][:frames])
            + (f" ({library} library frame{'s' if library > 1 else ''} left out)" if library else ""))


def _last_traceback(lines: list[str]) -> str:
    """``File "train.py", line 12, in main: raise RuntimeError("boom") -> RuntimeError: boom``:
    the last frame and the exception of the last traceback in ``lines`` ("" if none). What a
    process prints at exit (a leak report, a warning) often buries the traceback that killed it."""
    starts = [i for i, ln in enumerate(lines) if ln.split("]:", 1)[-1].strip().startswith("Traceback (most")]
    if not starts:
        return ""
    frame, code, error = "", "", ""
    for ln in lines[starts[-1] + 1:]:
        text = ln.split("]:", 1)[-1] if ln.startswith("[rank") else ln
        if text.lstrip().startswith("File "):
            frame, code = text.strip(), ""
        elif text.startswith((" ", "\t")):
            code = code or text.strip()
        else:
            error = text.strip()
            break
    where = f"{frame}: {code}" if code else frame
    return f"{where} -> {error}" if where and error else error or where
