"""The watch loop of one generation: it polls the ranks, detects exits, hangs, stalls and missed
deadlines, and dispatches what it saw to the generation's policy (``supervisor/policies``)."""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from pytest_reshard.contract import (GUARD, LINK_CHANGED, NOT_INJECTED, STACK_SIGNAL, Cause,
                                     Detected, Ev, name_of)
from pytest_reshard.schedule import kinds
from pytest_reshard.supervisor.detect import RankWatch, ends, record_detection
from pytest_reshard.supervisor.launch import LiveGeneration
from pytest_reshard.supervisor.outcome import (Failure, HarnessError, Outcome, PendingEnd, Status,
                                              rebalanced)

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.contract import RunDir
    from pytest_reshard.supervisor.policies import GenerationPolicy
    from pytest_reshard.supervisor.scenario import Scenario
    from pytest_reshard.supervisor.tail import EventTail

__all__ = ["Watch", "WatchContext", "Outcome", "Status", "Failure", "PendingEnd", "rebalanced",
           "POLL_S"]

#: How often the watch loop looks at the ranks: a death is seen within one poll.
POLL_S = 0.02
#: How long a stalled rank gets to write its stacks: faulthandler writes them from its C signal
#: handler whatever the Python threads are doing, the first bytes within 3.1 ms of the signal
#: (20 trials, load 4-7 on 2 cores): far above that, for a machine that is busier still.
STACK_WAIT_S = 2.0


@dataclass(frozen=True)
class WatchContext:
    """What every generation's loop of one run shares: ``fired`` (fault id -> its event) spans
    generations; ``record`` writes a supervisor event; ``on_status`` gets the live progress;
    ``deadline`` is the scenario's (monotonic)."""

    scenario: Scenario
    tail: EventTail
    run_dir: RunDir
    record: Callable[..., None]
    fired: dict[int, dict]
    deadline: float
    on_status: Callable[[Status], None] | None = None


class Watch:
    """The poll loop of one generation; ``run`` returns its Outcome."""

    def __init__(self, ctx: WatchContext, gen: int, live: LiveGeneration, *, world_size: int,
                 launched: float, policy: GenerationPolicy) -> None:
        self.ctx, self.sc, self.gen, self.live = ctx, ctx.scenario, gen, live
        self.world_size, self.tail, self.record, self.fired = world_size, ctx.tail, ctx.record, ctx.fired
        self.last_progress = launched
        self.started_training = False
        self.pending: PendingEnd | None = None  # the planned end under way in this generation
        self.failure: Failure | None = None
        self.hung: Outcome | None = None  # how the generation ends, once a hung rank is killed
        self.sigtermed: set[int] = set()  # ranks the preemption's SIGTERM ended (no handler)
        self.reported: set[int] = set()   # ranks whose exit is judged
        self.step: int | None = None      # the highest step begun in this generation
        self.ranks = RankWatch(self)
        self.policy = policy
        policy.start(self)

    # -- what a policy may use -----------------------------------------------------------------
    def detect(self, kind: Detected, rank: int, *, expected: bool, code: int | None = None,
               since: float | None = None) -> str:
        """Record a detection; returns it in words."""
        return record_detection(self, kind, rank, expected=expected, code=code, since=since)

    def fault_for(self, rank: int, ending: kinds.Ending) -> dict | None:
        """The fault event that ends ``rank`` this way in this generation, if one fired and its
        injector made it (one that could not explains nothing)."""
        events = self.tail.events(self.gen, rank)
        refused = {e["fault_id"] for e in events if self._note(e, NOT_INJECTED)}
        return next((e for e in events if ends(e, ending) and e["id"] not in refused), None)

    @staticmethod
    def _note(ev: dict, what: str) -> bool:
        return name_of(ev) == Ev.NOTE and ev.get("what") == what

    def guarded(self) -> bool:
        """A rank of this generation recorded that its own check caught corrupted state
        (``run.detected``): a death that follows is the workload stopping itself."""
        return any(self._note(e, GUARD) for r in range(self.world_size)
                   for e in self.tail.events(self.gen, r))

    def settle(self, ranks: list[int] | set[int]) -> None:
        """These ranks' exits need no judging (gone by plan, or down for a restart)."""
        self.reported.update(ranks)

    def revive(self, ranks: list[int]) -> None:
        """These ranks run again (a restarted group): watch them afresh."""
        for r in ranks:
            self.reported.discard(r)
            self.ranks.stopped_since.pop(r, None)

    def cancel_deadline(self) -> None:
        if self.pending is not None:
            self.pending.deadline = None

    def planned_outcome(self) -> Outcome:
        assert self.pending is not None
        return self.pending.outcome(self.world_size, self.sc.schedule.seed, self.sigtermed)

    def finished(self, codes: dict[int, int | None]) -> bool:
        """Every rank ended the run's last step (so there is nothing left to resume)."""
        return all((self.last_end(r) or -1) >= self.sc.steps - 1 for r in codes)

    def last_end(self, rank: int) -> int | None:
        """The last step whose effect the rank holds: the last it ended, or the one before where
        it resumed (a generation that resumes past the last step has nothing left to run)."""
        done = [ev["step"] if name_of(ev) == Ev.END else ev["step"] - 1
                for ev in self.tail.events(self.gen, rank) if name_of(ev) in (Ev.END, Ev.RESUMED)]
        return max(done) if done else None

    def take_events(self) -> None:
        """Act on the events the tail read since the last call."""
        now = time.monotonic()
        events = self.tail.take()
        for ev in events:
            if ev["gen"] != self.gen:
                continue  # read late, after its generation ended
            self.last_progress = now
            kind = name_of(ev)
            if kind == Ev.BEGIN:
                self.started_training = True
            elif kind == Ev.FAULT and ev["id"] not in self.fired:
                self._on_fault(ev)
            elif kind == Ev.LIVE:
                self.policy.on_live(ev)
            elif kind == Ev.REQUEST and self.pending is None:
                fired = [f for f in self.fired.values() if f["gen"] == self.gen]
                self.pending = PendingEnd.of_request(ev, fired[-1]["id"] if fired else None, now)
        if events and self.ctx.on_status is not None:
            begun = [ev["step"] for ev in events if ev["gen"] == self.gen and name_of(ev) == Ev.BEGIN]
            if begun:
                self.step = max([*begun, *([] if self.step is None else [self.step])])
            self.ctx.on_status(Status(self.gen, self.world_size, self.step, self.sc.steps,
                                      len(self.fired), len(self.sc.schedule.faults)))

    # -- the loop ------------------------------------------------------------------------------
    def _on_fault(self, ev: dict) -> None:
        self.fired[ev["id"]] = ev
        declared = kinds.get(ev["kind"])
        if self.policy.on_fault(ev, declared) or \
                declared.ending_of(ev["params"]) is not kinds.Ending.PLANNED:
            return
        granted = self.live.deliver(ev)  # a scheduler's part, and its own grace
        if granted is not None:
            self.record(Ev.DELIVER, gen=self.gen, fault_id=ev["id"], kind=ev["kind"],
                        grace_s=granted)
        if self.pending is None:  # the grace runs from the delivery
            grace = float(ev["params"][declared.deadline_param]) if granted is None else granted
            self.pending = PendingEnd.of_fault(ev, declared, time.monotonic() + grace)

    def _on_exit(self, rank: int, code: int, codes: dict[int, int | None], now: float) -> None:
        """Judge one rank's exit: normal, the policy's, or the generation's first failure."""
        normal = code == 0 or self.tail.clean_exit(self.gen, rank)  # SIGABRT after close
        if normal and (self.pending is not None or (self.last_end(rank) or -1) >= self.sc.steps - 1):
            self.reported.add(rank)
            return
        if self.policy.on_death(rank, code, normal):
            return
        if self._fence_cut_off(now):
            return
        if self._preempting() and (code == -signal.SIGTERM or self.sigtermed):
            # A rank without SIGTERM handling dies of the preemption's SIGTERM, as on a spot
            # node, and its peers then fail their next collective: the preemption ends the
            # generation (planned), and what it cost is no_rewind's to judge.
            self.reported.add(rank)
            if code == -signal.SIGTERM:
                self.sigtermed.add(rank)
                self.detect(Detected.DIED, rank, expected=True, code=code)
            return
        # Peers of a killed rank die too ("Connection closed by peer"), sometimes before its
        # own exit is reaped: blame the rank an unplanned-death fault fired on.
        culprit = self.ranks.faulted(kinds.Ending.DEATH)
        if culprit is not None:
            culprit_code = codes.get(culprit)
            if culprit_code is None:
                return  # judge again once the culprit's exit is reported
            rank, code = culprit, culprit_code
            normal = code == 0 or self.tail.clean_exit(self.gen, rank)
        self.reported.add(rank)
        fault = self.fault_for(rank, kinds.Ending.DEATH)
        # exit 0 mid-run without a planned event: a silent death (a process that vanished
        # without a traceback, as GPU drafters do when the driver takes them)
        kind = Detected.EXITED_EARLY if normal else Detected.DIED
        detail = self.detect(kind, rank, expected=fault is not None, code=code,
                             since=fault["t"] if fault else None)
        self.failure = Failure(rank, code, now, detail)

    def _fence_cut_off(self, now: float) -> bool:
        """A rank failed while a node is cut off: that node is fenced, its victim named
        partitioned (the failure), whatever its own ranks are doing (waiting on a peer, or
        exited and left unreaped by an agent that cannot reach the rendezvous)."""
        cut = self._cut_off()
        if cut is None:
            return False
        rank = cut["rank"]
        self.live.fence(int(cut["node"]))
        self.reported.add(rank)
        detail = self.detect(Detected.PARTITIONED, rank, expected=True, code=None,
                             since=cut["t"])
        self.failure = Failure(rank, -signal.SIGKILL, now, detail)
        return True

    def _cut_off(self) -> dict | None:
        """The note of a partition of this generation that explains a failure now: its rules
        went in (``LINK_CHANGED``; a fault that fired but was not made explains nothing), and
        the link is still cut, or it healed but no step has ended since (a timeout that fired
        late). Once the job trains on after the heal, a death is its own again."""
        for fault in self.fired.values():
            if fault["gen"] != self.gen or not kinds.get(fault["kind"]).isolates:
                continue
            cut = next((e for e in self.tail.events(self.gen, fault["rank"])
                        if self._note(e, LINK_CHANGED) and e["fault_id"] == fault["id"]), None)
            if cut is None:
                continue
            if cut.get("duration_s") is None:
                return cut
            healed = cut["t"] + float(cut["duration_s"])
            if time.time() < healed or not any(
                    name_of(e) == Ev.END and e["t"] > healed
                    for r in range(self.world_size) for e in self.tail.events(self.gen, r)):
                return cut
        return None

    def _preempting(self) -> bool:
        """A planned fault whose cause is a preemption fired in this generation."""
        return self.pending is not None and not self.pending.requested and \
            self.pending.cause is Cause.PREEMPT

    def run(self) -> Outcome:
        sc, live, policy = self.sc, self.live, self.policy
        while True:
            codes = live.exit_codes()  # first: a rank writes all its events before it exits
            self.tail.poll(self.gen)
            self.take_events()
            if policy.poll():
                codes = live.exit_codes()  # a group started again runs now
            now = time.monotonic()
            # Judge exits in the order the ranks went quiet: in a cascade the root cause (a
            # silent exit, an exception of its own) stops writing events before its peers fail.
            exited = {r: c for r, c in codes.items() if c is not None and r not in self.reported}
            for rank in sorted(exited, key=self.ranks.last_event_t):
                if self.failure is None:
                    self._on_exit(rank, exited[rank], codes, now)
            self.ranks.watch_memory(codes)
            refused = self.ranks.refused_write(codes)
            if refused is not None:
                raise HarnessError.refused(self.ctx.run_dir.root, refused[1],
                                           f"rank {refused[0]} of generation {self.gen}")
            if all(c is not None for c in codes.values()) and policy.on_all_exited(codes):
                return policy.outcome(codes)
            if self.failure and now - self.failure.at > sc.failure_grace_s:
                return policy.outcome(codes)
            handed = policy.handed_over(codes) if self.failure is None else None
            if handed is not None:
                return handed
            pending = self.pending
            if pending is not None and pending.deadline is not None and now > pending.deadline:
                # a rank that recorded its exit is only tearing down (an interpreter's exit
                # under load takes seconds): the scheduler's SIGKILL ends that, not the run
                running = [r for r, c in sorted(codes.items())
                           if c is None and not self.tail.closed(self.gen, r)]
                return pending.missed(running, self.gen) if running else policy.outcome(codes)
            hung = self.ranks.stopped(codes) if self.failure is None else None
            if hung is not None:
                self._end_hung(hung, self._hang(Detected.STOPPED, hung,
                                                since=self.ranks.last_beat(hung)))
                continue
            limit = sc.stall_s if self.started_training else sc.startup_s
            alive = [r for r, c in codes.items() if c is None]
            closing = bool(alive) and all(self.tail.closed(self.gen, r) for r in alive)
            if closing and now - self.last_progress > limit:
                return policy.outcome(codes)   # done, but slow to end: ended as a scheduler would
            if now - self.last_progress > limit and self.failure is None and not closing and \
                    (pending is None or pending.deadline is None):
                # Everyone is alive and silent: blame the rank a hang fault fired on, if any,
                # else one a fault meant to kill that lives on (it swallowed a comms abort).
                culprit = self.ranks.faulted(kinds.Ending.HANG)
                if culprit is None:
                    culprit = self.ranks.faulted(kinds.Ending.DEATH)
                    culprit = culprit if culprit is not None and codes.get(culprit, 0) is None \
                        else None
                rank = culprit if culprit is not None else \
                    min((r for r, c in codes.items() if c is None), default=0)
                self._dump_stack(rank)
                self._end_hung(rank, self._hang(Detected.STALLED, rank, since=None))
                continue
            if now > self.ctx.deadline:
                return Outcome(Cause.TIMEOUT, detail=f"scenario timeout of {sc.timeout_s:.0f} s "
                               f"reached in generation {self.gen}")
            time.sleep(POLL_S)

    def _hang(self, kind: Detected, rank: int, since: float | None) -> Outcome:
        fault = self.fault_for(rank, kinds.Ending.HANG)
        detail = self.detect(kind, rank, expected=fault is not None,
                             since=fault["t"] if fault and since is None else since)
        if fault is None:
            return Outcome(Cause.HANG, detail=detail)
        after = int(fault["params"].get("then_world_size") or self.world_size)
        return Outcome(Cause.HANG, fault_id=fault["id"], detail=detail, next_world_size=after,
                       lost_rank=rank)

    def _dump_stack(self, rank: int) -> None:
        """Ask a stalled rank for every thread's stack (``STACK_SIGNAL``: the probe's
        faulthandler writes them into its stacks file, else its log) and wait, bounded, until
        they are there."""
        log = self.ctx.run_dir.stacks(self.gen, rank)
        if not log.exists():
            log = self.ctx.run_dir.log(self.gen, rank)
        try:
            before = log.stat().st_size
        except OSError:
            return
        self.live.signal(rank, STACK_SIGNAL)
        until, last = time.monotonic() + STACK_WAIT_S, before
        while time.monotonic() < until:
            time.sleep(POLL_S)
            try:
                size = log.stat().st_size
            except OSError:
                return
            if before < size == last:   # it grew, and has stopped growing
                return
            last = size

    def _end_hung(self, rank: int, outcome: Outcome) -> None:
        """Kill only the hung rank and treat it as a death: its peers then fail their next
        collective and get the failure grace to save what they hold (an emergency snapshot),
        exactly as after a kill; killing them all at once would throw that state away."""
        self.live.signal(rank, signal.SIGKILL)
        self.hung = outcome
        self.reported.add(rank)
        self.failure = Failure(rank, -signal.SIGKILL, time.monotonic(), outcome.detail)
