"""allocator_fragmentation (CUDA): no rank's caching allocator fragmented past the limit."""
from __future__ import annotations

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History
from pytest_reshard.verdict import Verdict

#: Above this, an allocation bigger than the largest free block fails although the memory is
#: free, often enough to force a rewind on every reshard.
FRAGMENTATION_ALERT = 0.30
#: Less free memory than this in the allocator's pool is not judged: a few MiB split in two reads
#: as 50% fragmented, yet no allocation that matters is refused for it.
FRAGMENTATION_MIN_FREE = 64 * 2 ** 20
#: The note ``telemetry.record_allocator`` writes.
ALLOCATOR = "allocator"


def allocator_fragmentation(history: History, *, threshold: float = FRAGMENTATION_ALERT) -> Verdict:
    """No rank's CUDA caching allocator was more than ``threshold`` fragmented (1 - largest free
    block / total free, from ``telemetry.record_allocator``). On CPU there is no such allocator:
    unknown, saying so, never a pass."""
    check = "allocator_fragmentation"
    samples = [n.fields for n in history.notes(ALLOCATOR)]
    if not samples:
        backend = history.scenario.backend if history.scenario else "?"
        why = ("the workload recorded no allocator statistics: call "
               "telemetry.record_allocator(run) after a step or a save"
               if backend == "nccl" else
               f"not applicable: the run used no CUDA device (backend {backend})"
               ", and only CUDA's caching allocator fragments this way")
        return Verdict.unknown(check, why)
    mib = 2 ** 20
    judged = [e for e in samples if int(e["total_free"]) >= FRAGMENTATION_MIN_FREE]
    if not judged:
        most = max(int(e["total_free"]) for e in samples)
        return Verdict.passed(check, f"{len(samples)} samples; the allocator never held more than "
                              f"{most / mib:.0f} MiB free (under {FRAGMENTATION_MIN_FREE / mib:.0f} "
                              "MiB, too little for fragmentation to refuse an allocation)")
    worst = max(judged, key=lambda e: float(e["fragmentation"]))
    step = worst.get("step")
    where = f"rank {worst['rank']} (generation {worst['gen']}" + \
        (f", step {step})" if step is not None else ")")
    text = (f"{where}: allocator {float(worst['fragmentation']):.0%} fragmented, largest free "
            f"block {worst['largest_free'] / mib:.0f} MiB of {worst['total_free'] / mib:.0f} MiB "
            f"free in {worst.get('free_blocks', '?')} pieces")
    details = {"samples": len(samples), "judged": len(judged), "worst": {k: worst.get(k) for k in (
        "rank", "gen", "step", "fragmentation", "largest_free", "total_free", "reserved")}}
    if float(worst["fragmentation"]) > threshold:
        return Verdict.failed(check, f"{text}: above {threshold:.0%}, so an allocation bigger than "
                              f"{worst['largest_free'] / mib:.0f} MiB fails although the memory is "
                              "free; try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                              rank=worst["rank"], generation=worst["gen"], step=step,
                              details=details)
    return Verdict.passed(check, f"worst of {len(judged)} samples: {text}, within "
                          f"{threshold:.0%}", details=details)


def _applies(ctx: CheckContext) -> bool:
    scenario = ctx.scenario or ctx.history.scenario   # the scenario record, checking a history alone
    return bool(scenario is not None and scenario.backend == "nccl") or \
        bool(ctx.history.notes(ALLOCATOR))


@register("allocator_fragmentation", column="frag", assertion="assert_allocator_unfragmented",
          applies=_applies,
          when="the backend is nccl, or the workload records allocator statistics "
               "(telemetry.record_allocator(run))",
          description="no rank's CUDA caching allocator was more than 30% fragmented")
def _check(ctx: CheckContext) -> Verdict:
    return allocator_fragmentation(ctx.history)
