"""The live reshard: every rank asks to do the generation's planned reshard in place
(``run.live_reshard``); the supervisor answers once, and the generation ends without ending its
processes (survivors go on as the next generation) or with the refusal, which the ranks raise.

It wraps the generation's own policy (relaunch or membership), since the ranks may ask in any
generation; until they do, everything goes to that policy."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from pytest_reshard.contract import Cause, Ev, name_of
from pytest_reshard.schedule import kinds
from pytest_reshard.supervisor.outcome import Outcome

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.supervisor.policies import GenerationPolicy
    from pytest_reshard.supervisor.watch import Watch

__all__ = ["InPlace", "Answer"]

#: The supervisor's answer to the ranks' request (``Supervisor._go_live``): given the planned
#: outcome (None when refused), the step they asked after and the problem with the request, it
#: returns the outcome to end with: ``live`` once they handed over, else the refusal.
Answer = Callable[[Outcome | None, int, str | None], Outcome]


class InPlace:
    def __init__(self, inner: GenerationPolicy, answer: Answer) -> None:
        self.inner, self.answer = inner, answer
        self.asks: dict[int, int] = {}  # rank -> the step it asked to reshard in place after
        self.handover: Outcome | None = None  # how it ends once the ranks asked to go live

    def start(self, loop: Watch) -> None:
        self.loop = loop
        self.inner.start(loop)

    @property
    def refused(self) -> bool:
        return self.handover is not None and not self.handover.live

    def on_fault(self, ev: dict[str, Any], declared: kinds.FaultKind) -> bool:
        return self.inner.on_fault(ev, declared)

    def on_live(self, ev: dict[str, Any]) -> None:
        """A rank asks to reshard in place; once all have, the supervisor answers (once)."""
        loop = self.loop
        self.asks[ev["rank"]] = ev["step"]
        if len(self.asks) < loop.world_size or self.handover is not None:
            return
        steps = sorted(set(self.asks.values()))
        pending, problem = loop.pending, None
        if pending is None:
            problem = "no planned reshard is pending in this generation"
        elif pending.requested:
            problem = "a drain the workload asked for (run.request_reshard): save and exit for it"
        elif pending.cause is not Cause.RESHARD:
            problem = (f"{pending.kind} is not a planned reshard (shift_shards, drain): "
                       "save and exit for it")
        elif len(steps) > 1:
            problem = f"the ranks asked after different steps (rank: step): {self.asks}"
        self.handover = self.answer(None if problem else loop.planned_outcome(), steps[0], problem)
        if self.refused:  # the refusal, not the notice, ends this generation
            loop.cancel_deadline()
            if pending is not None:
                self.handover.fault_id = pending.fault_id

    def poll(self) -> bool:
        return self.inner.poll()

    def on_death(self, rank: int, code: int | None, normal: bool) -> bool:
        if self.refused:
            self.loop.settle([rank])  # refused to reshard in place: the refusal explains it
            return True
        return self.inner.on_death(rank, code, normal)

    def on_all_exited(self, codes: dict[int, int | None]) -> bool:
        return self.inner.on_all_exited(codes)

    def handed_over(self, codes: dict[int, int | None]) -> Outcome | None:
        """Every rank is through with this generation: exited (a leaver) or gone on in the next
        one (its last event here says where it moved)."""
        if self.handover is None or not self.handover.live:
            return self.inner.handed_over(codes)
        for rank, code in codes.items():
            events = self.loop.tail.events(self.loop.gen, rank)
            if code is None and not (events and name_of(events[-1]) == Ev.EXIT
                                     and events[-1].get("moved_to")):
                return None
        return self.handover

    def outcome(self, codes: dict[int, int | None]) -> Outcome:
        if self.loop.hung is None and self.refused:
            assert self.handover is not None
            return self.handover  # the harness refused to reshard in place
        return self.inner.outcome(codes)
