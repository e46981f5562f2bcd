"""Helpers the checkers share to word their messages (and find the generation before another)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from pytest_reshard.history import Generation, History

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_reshard.checkers.context import CheckContext

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
        "reshard": "a planned reshard" if ended.planned else "an unplanned reshard",
        "preempt": "a preemption (SIGTERM)", "failure": "an unplanned failure",
        "hang": "a hang", "timeout": "a timeout", "error": "a harness error",
        "complete": "a completed generation", "drain": "a drain the workload requested",
        "rebalance": "a planned rebalance",
    }
    if ended.cause is None:
        return f"generation {ended.gen} ended with no supervisor record (treated as unplanned)"
    text = words.get(ended.cause, f"{'a planned' if ended.planned else 'an unplanned'} "
                                  f"{ended.cause}")
    return f"{text} ({fault})" if fault else text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _summarise(messages: list[str]) -> str:
    """The first message, plus a count and the next few."""
    if len(messages) == 1:
        return messages[0]
    more = messages[1:1 + _MAX_LISTED]
    tail = "; ".join(more) + ("; ..." if len(messages) > 1 + _MAX_LISTED else "")
    return f"{messages[0]} (+{len(messages) - 1} more: {tail})"


def _never_started(history: History) -> str | None:
    """Why no rank of any generation began a step, in words; None when some rank began one.

    A run that never began a step has nothing for the other checkers to judge: they say
    ``unknown`` with this reason, and liveness says what went wrong (once)."""
    if any(history.begun(g) for g in history.generations):
        return None
    if not history.generations:
        return "the run never started: no rank recorded anything"
    attached = any(history.starts(g) for g in history.generations)
    how = ("ranks attached (probe.attach()) but none began a step" if attached else
           "no rank called probe.attach()")
    return f"the run never started: {how}, so there is nothing to compare (see liveness)"


def _log_tail(run_dir: "str | Path | None", gen: int, rank: int, lines: int = 12) -> str:
    """``; its log, RUN/logs/g0-r1.log, ends: <last lines>`` (the relative path when the run
    folder is not known, nothing more when the log is empty or unreadable)."""
    from pathlib import Path

    from pytest_reshard.contract import RunDir

    rel = f"logs/g{gen}-r{rank}.log"
    if run_dir is None:
        return f"; read its log, {rel} in the run folder"
    path = RunDir(Path(run_dir)).log(gen, rank)
    mine = lambda line: True  # noqa: E731 - every line of the rank's own log is its own
    shared = path.with_name(f"g{gen}-slurm.log")
    if not path.exists() and shared.exists():
        # under SLURM the ranks' output is the step's, one file: torch prefixes what a rank
        # raises with [rank<N>]:
        path, mine = shared, lambda line: f"[rank{rank}]:" in line
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"; its log {path} could not be read"
    tail = [ln.rstrip() for ln in text.splitlines() if ln.strip() and mine(ln)][-lines:]
    if not tail:
        return f"; its log {path} is empty"
    return f"; its log {path} ends:\n    " + "\n    ".join(tail)


def _clean_first(ctx: "CheckContext") -> "tuple[History | None, str | None]":
    """The clean run at the run's first topology, and why it cannot be compared with (None: it
    can). Starts no clean run for a run that never began a step, and no other topology: the
    sample and liveness checks need this one only (what ``ctx.clean_runs()`` found already is
    reused)."""
    never = _never_started(ctx.history)
    if never is not None:
        return None, f"{never}; no clean reference run was started"
    done = ctx._cache.get("clean")
    if isinstance(done, Exception):   # a clean run that cannot start is not started twice
        raise done
    if done is not None:
        return done.reference, done.broken
    if "clean_first" not in ctx._cache:
        try:
            ctx._cache["clean_first"] = _first_clean_run(ctx)
        except Exception as e:  # noqa: BLE001 - raised again to every checker that asks
            ctx._cache["clean_first"] = e
    got = ctx._cache["clean_first"]
    if isinstance(got, Exception):
        raise got
    return got


def _first_clean_run(ctx: "CheckContext") -> "tuple[History | None, str | None]":
    if not ctx.has_references:
        return None, None
    from pytest_reshard.checkers.liveness import liveness

    h = ctx.reference(ctx.first_roles)
    v = liveness(h)
    if v.status == "pass":
        return h, None
    # A clean run that did not finish leaves nothing to compare against.
    size = h.scenario.world_size if h.scenario else len(ctx.first_roles)
    problem = (v.details.get("problems") or [v.message])[0]
    return h, (f"the clean reference run (world size {size}) did not finish: {problem} (see "
               "liveness)")
