"""poisoned_commit: no step commits after a fatal device error hit it before its update."""
from __future__ import annotations

from typing import Any, Mapping

from pytest_reshard.checkers._text import _count
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History
from pytest_reshard.verdict import Verdict

#: Phases at which a step's update has not been applied yet (``s.point("optimizer"); opt.step()``).
PRE_UPDATE = ("begin", "data", "forward", "backward", "optimizer")
#: The fault kind that injects a device error (``chaos.ecc_error``).
ECC_ERROR = "ecc_error"


def poisoned_commit(history: History) -> Verdict:
    """No step commits in a generation where a fatal ECC error hit one of its ranks during that
    step, before its update: an uncorrectable error makes that step's gradients untrustworthy,
    and nothing in the loss, samples or state shows it afterwards."""
    from pytest_reshard.rank.telemetry import FATAL_XIDS

    check = "poisoned_commit"
    never = history.never_started()
    if never is not None:
        return Verdict.unknown(check, never)

    def fatal(p: Mapping[str, Any]) -> bool:
        return p.get("layer") == "compute" or p.get("kind", "dbe") == "dbe" or p.get("xid") in FATAL_XIDS

    hits = [f for f in history.faults_fired()
            if f.kind == ECC_ERROR and f.phase in PRE_UPDATE and fatal(f.params)]
    if not hits:
        return Verdict.passed(check, "no fatal device error hit a step before its update")
    bad = [f for f in hits if f.step in history.committed(f.gen)]
    details = {"hits": [[f.gen, f.rank, f.step, f.phase] for f in hits],
               "committed": [[f.gen, f.rank, f.step, f.phase] for f in bad]}
    if not bad:
        return Verdict.passed(check, f"{_count(len(hits), 'fatal device error')} hit a step before "
                              "its update; none of those steps was committed", details=details)
    f = bad[0]
    how = ("the health monitor must poll the device before the update, agree across ranks and "
           "abandon the step" if f.params.get("layer") != "compute" else
           "the workload swallowed the CUDA error and went on with the step")
    text = (f"step {f.step} was committed in generation {f.gen} although rank {f.rank}'s device "
            f"reported a fatal ECC error at its {f.phase} point, before the update "
            f"({history.describe_fault(f.id)}); {how}")
    if len(bad) > 1:
        text += f" ({len(bad)} poisoned steps committed in all)"
    return Verdict.failed(check, text, step=f.step, rank=f.rank, generation=f.gen,
                          fault=history.describe_fault(f.id), details=details)


@register("poisoned_commit", column="ecc", assertion="assert_no_poisoned_commit",
          description="no step committed although a fatal ECC error hit one of its ranks before "
                      "the update")
def _check(ctx: CheckContext) -> Verdict:
    return poisoned_commit(ctx.history)
