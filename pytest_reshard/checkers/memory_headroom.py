"""memory_headroom: every rank's peak RSS stayed clear of the scenario's memory budget."""
from __future__ import annotations

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.contract import Detected
from pytest_reshard.history import History
from pytest_reshard.verdict import Verdict

#: The share of the budget a rank's peak must stay below: within 10% of it fails.
MEMORY_MARGIN = 0.10


def memory_headroom(history: History, *, margin: float = MEMORY_MARGIN) -> Verdict:
    """Every rank's peak RSS stayed below ``(1 - margin)`` of the scenario's memory budget.

    The supervisor samples each rank's peak (VmHWM) and ends a rank that passes the budget; a
    rank that merely came close is the warning: a dependency upgrade that adds memory ends the
    ranks with the least headroom first.
    """
    check = "memory_headroom"
    budget = history.scenario.memory_budget_bytes if history.scenario else None
    if not budget:
        return Verdict.unknown(check, "no memory budget set: pass memory_budget_bytes= to "
                               "reshard_run to check headroom")
    mib = 2 ** 20
    for d in history.detections():
        if d.kind == Detected.OOM:
            return Verdict.failed(check, d.detail or f"rank {d.rank} exceeded its memory budget",
                                  step=d.step, rank=d.rank, generation=d.gen)
    peaks = history.rss()
    if not peaks:
        return Verdict.unknown(check, "no rank's memory was sampled")
    top = max(peaks, key=lambda e: e.peak_bytes)
    share = top.peak_bytes / budget
    where = f"rank {top.rank} (generation {top.gen})"
    if share > 1 - margin:
        return Verdict.failed(check, f"{where} peaked at {top.peak_bytes / mib:.0f} MiB, "
                              f"{share:.0%} of its {budget / mib:.0f} MiB budget: less than "
                              f"{margin:.0%} headroom; an upgrade that adds memory would kill it",
                              rank=top.rank, generation=top.gen)
    return Verdict.passed(check, f"highest peak {top.peak_bytes / mib:.0f} MiB on {where}, "
                          f"{share:.0%} of the {budget / mib:.0f} MiB budget")


def _applies(ctx: CheckContext) -> bool:
    scenario = ctx.scenario or ctx.history.scenario   # the scenario record, checking a history alone
    return bool(scenario is not None and scenario.memory_budget_bytes)


@register("memory_headroom", column="mem", assertion="assert_memory_headroom", applies=_applies,
          when="the scenario sets a memory budget (memory_budget_bytes=)",
          description="no rank's peak RSS came within 10% of the scenario's memory budget")
def _check(ctx: CheckContext) -> Verdict:
    return memory_headroom(ctx.history)
