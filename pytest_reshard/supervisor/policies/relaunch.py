"""The default generation mode: a death or a planned end closes the generation, and the
supervisor launches the next one (fresh processes, restored from a checkpoint)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection

from pytest_reshard.contract import Cause, Detected
from pytest_reshard.schedule import kinds
from pytest_reshard.supervisor.outcome import Outcome

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.supervisor.watch import Watch

__all__ = ["Relaunch"]


class Relaunch:
    """Nothing to add while the generation runs; ``outcome`` judges how it ended."""

    loop: "Watch"

    def start(self, loop: "Watch") -> None:
        self.loop = loop

    def on_fault(self, ev: dict[str, Any], declared: kinds.FaultKind) -> bool:
        return False

    def on_live(self, ev: dict[str, Any]) -> None:
        return None

    def poll(self) -> bool:
        return False

    def on_death(self, rank: int, code: int | None, normal: bool) -> bool:
        return False

    def on_all_exited(self, codes: dict[int, int | None]) -> bool:
        return True

    def handed_over(self, codes: dict[int, int | None]) -> Outcome | None:
        return None

    def outcome(self, codes: dict[int, int | None]) -> Outcome:
        return self.judge(codes)

    def judge(self, codes: dict[int, int | None], excused: Collection[int] = ()) -> Outcome:
        """A hang, the first failure, the planned end, else complete or a silent early exit
        (``excused``: ranks not expected to have run to the end)."""
        loop = self.loop
        if loop.hung is not None:
            return loop.hung
        if loop.failure is not None:
            rank, detail = loop.failure.rank, loop.failure.detail
            fault = loop.fault_for(rank, kinds.Ending.DEATH)
            victim = loop.ranks.faulted(kinds.Ending.DEATH)
            if fault is None and victim is not None:   # a peer died before the fault's victim
                rank, fault = victim, loop.fault_for(victim, kinds.Ending.DEATH)
            if fault is None and loop.guarded():   # it stopped itself: resume from its save
                return Outcome(Cause.FAILURE, detail=f"{detail}, after the workload's own check "
                               "caught corrupted state", next_world_size=loop.world_size)
            if fault is None:
                return Outcome(Cause.FAILURE, detail=detail)
            after = int(fault["params"].get("then_world_size") or loop.world_size)
            return Outcome(Cause.FAILURE, fault_id=fault["id"], detail=detail,
                           next_world_size=after, lost_rank=rank)
        pending = loop.pending
        if pending is not None and loop.finished(codes):
            # a notice at the last step: nothing is left for a next generation
            return Outcome(Cause.COMPLETE, fault_id=pending.fault_id,
                           detail=f"{pending.label} arrived after the last step had run")
        if pending is not None:
            return loop.planned_outcome()
        last = {r: loop.last_end(r) for r in codes if r not in excused}
        short = sorted(r for r, s in last.items() if s is None or s < loop.sc.steps - 1)
        if short:
            return Outcome(Cause.FAILURE, detail=loop.detect(Detected.EXITED_EARLY, short[0],
                                                             expected=False))
        return Outcome(Cause.COMPLETE)
