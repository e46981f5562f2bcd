"""The watch loop of one generation: exits, heartbeats, progress, deadlines; it returns an Outcome."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from pytest_reshard.contract import Cause, Detected, Ev
from pytest_reshard.schedule import kinds
from pytest_reshard.supervisor.launch import LiveGeneration

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.contract import RunDir
    from pytest_reshard.supervisor.membership import Membership
    from pytest_reshard.supervisor.scenario import Scenario
    from pytest_reshard.supervisor.tail import EventTail

#: How often the watch loop looks at the ranks: a death is seen within one poll.
POLL_S = 0.02
#: How long the kernel must hold a rank stopped (SIGSTOP) before it is named: one heartbeat
#: period, so a rank continued at once (SIGCONT) is never called stopped.
STOP_CONFIRM_S = 0.1


@dataclass
class Outcome:
    """How a generation ended and what comes next."""

    cause: Cause
    planned: bool = False
    fault_id: int | None = None
    detail: str = ""
    next_world_size: int | None = None  # None: the run is over
    lost_rank: int | None = None    # the rank whose unplanned loss ended the generation
    next_roles: Any = None          # roles a planned change asks for (counts or a list)
    device_map: list[int] | None = None  # the next generation's rank -> device map (rebalance)
    live: bool = False              # the next generation is these processes, re-formed in place
    at: float | None = None         # when it ended (time.time()), if not when the watch returned


@dataclass(frozen=True)
class Status:
    """Where a scenario is, for the live progress line (``Supervisor.on_status``)."""

    gen: int
    world_size: int
    step: int | None     # the highest step any rank of the generation began
    steps: int
    faults_fired: int
    faults_total: int
    name: str = ""       # the scenario, set by the runner

    def line(self) -> str:
        step = "starting" if self.step is None else f"step {self.step + 1}/{self.steps}"
        return (f"{self.name}: generation {self.gen} (world size {self.world_size}), {step}, "
                f"faults {self.faults_fired}/{self.faults_total}")


@dataclass(frozen=True)
class Failure:
    """The first unplanned loss of a generation: who, how, when (monotonic), in words."""

    rank: int
    code: int | None
    at: float
    detail: str


def _is(ev: dict, ending: kinds.Ending) -> bool:
    """A fault event whose kind ends its victim this way (with these params)."""
    return ev["ev"] == Ev.FAULT and kinds.ending_of(ev["kind"], ev["params"]) is ending


class Watch:
    """The poll loop of one generation; returns its Outcome."""

    def __init__(self, scenario: Scenario, gen: int, live: LiveGeneration, *, world_size: int,
                 tail: EventTail, run_dir: RunDir, record: Callable[..., None],
                 fired: dict[int, dict], launched: float, deadline: float,
                 on_status: Callable[[Status], None] | None = None,
                 on_live: Callable[[Outcome | None, int, str | None], Outcome] | None = None,
                 members: Membership | None = None) -> None:
        """``fired`` (fault id -> its event) is shared with the supervisor across generations;
        ``record`` writes a supervisor event; ``on_status`` gets the live progress; ``on_live``
        answers the ranks' request to reshard in place (the planned outcome, the step, or the
        problem with the request) and returns the outcome to end with: ``live`` once they
        handed over, else the refusal (they then raise its reason and exit); ``members``
        (membership mode) restarts a dead rank's replica group instead of ending the generation."""
        self.sc, self.gen, self.live, self.world_size = scenario, gen, live, world_size
        self.tail, self.dir, self.record, self.fired = tail, run_dir, record, fired
        self.on_status = on_status
        self.deadline = deadline
        self.last_progress = launched
        self.started_training = False
        self.planned: dict | None = None       # the planned-event fault that fired here
        self.plan_deadline: float | None = None
        self.failure: Failure | None = None
        self.sigtermed: set[int] = set()
        self.stopped_since: dict[int, float] = {}  # rank -> when /proc first said T  # ranks the preemption's SIGTERM ended (no handler)
        self.reported: set[int] = set()
        self.peaks: dict[int, int] = {}  # rank -> peak RSS bytes seen
        self.hung: Outcome | None = None  # how the generation ends, once a hung rank is killed
        self.step: int | None = None     # the highest step begun in this generation
        self.on_live = on_live
        self.live_asks: dict[int, int] = {}  # rank -> the step it asked to reshard in place after
        self.handover: Outcome | None = None  # how it ends once the ranks asked to go live
        self.members = members
        self.down_at_end: list[int] = []  # membership: ranks whose group was down at the end

    def _detect(self, kind: Detected, rank: int, *, expected: bool, code: int | None = None,
                since: float | None = None) -> str:
        step, phase = self.tail.last_position(self.gen, rank)
        latency = None if since is None else round(time.time() - since, 4)
        self.record(Ev.DETECT, gen=self.gen, kind=kind.value, rank=rank, step=step,
                        phase=phase, exit_code=code, latency_s=latency, expected=expected)
        where = f"at step {step}, phase {phase}" if step is not None else "before its first step"
        return {Detected.DIED: f"rank {rank} died (exit code {code}) {where}",
                Detected.STOPPED: f"rank {rank} stopped responding {where}",
                Detected.STALLED: f"no rank made progress for {self.sc.stall_s:.0f} s; rank "
                                  f"{rank} was last seen {where}",
                Detected.EXITED_EARLY: f"rank {rank} exited with code 0 {where} without a "
                                       "planned event",
                }[kind] + f" (generation {self.gen})"

    def _on_events(self, events: list[dict]) -> None:
        now = time.monotonic()
        for ev in events:
            if ev["gen"] != self.gen:
                continue  # read late, after its generation ended
            self.last_progress = now
            kind = ev["ev"]
            if kind == Ev.BEGIN:
                self.started_training = True
            elif kind == Ev.FAULT and ev["id"] not in self.fired:
                self.fired[ev["id"]] = ev
                declared = kinds.get(ev["kind"])
                if self._member_preempt(ev, declared):
                    continue
                if declared.ending_of(ev["params"]) is kinds.Ending.PLANNED:
                    granted = self.live.deliver(ev)  # a scheduler's part, and its own grace
                    if granted is not None:
                        self.record(Ev.DELIVER, gen=self.gen, fault_id=ev["id"], kind=ev["kind"],
                                    grace_s=granted)
                    if self.planned is None:  # the grace runs from the delivery
                        self.planned = ev
                        self.plan_deadline = time.monotonic() + (
                            float(ev["params"][declared.deadline_param]) if granted is None
                            else granted)
            elif kind == Ev.LIVE:
                self._on_live(ev)
            elif kind == Ev.REQUEST and self.planned is None:
                # The workload drains itself (e.g. its health monitor saw an ECC error): planned,
                # attributed to the last fault that fired in this generation, if any.
                fired = [f for f in self.fired.values() if f["gen"] == self.gen]
                self.planned = {"kind": Cause.DRAIN.value, "id": fired[-1]["id"] if fired else None,
                                "step": ev["step"] if "step" in ev else None, "phase": "request",
                                "params": {"to_world_size": ev["to_world_size"]},
                                "reason": ev.get("reason", "")}
                self.plan_deadline = now + float(ev.get("grace_s", 30.0))
        if events and self.on_status is not None:
            self._status(events)

    def take_events(self) -> None:
        """Act on the events the tail read since the last call."""
        self._on_events(self.tail.take())

    def _on_live(self, ev: dict) -> None:
        """A rank asks to do the planned reshard in place; once all have, the supervisor answers."""
        self.live_asks[ev["rank"]] = ev["step"]
        if len(self.live_asks) < self.world_size or self.on_live is None:
            return
        steps = sorted(set(self.live_asks.values()))
        problem = None
        if self.planned is None:
            problem = "no planned reshard is pending in this generation"
        elif self.planned["kind"] == Cause.DRAIN.value:
            problem = "a drain the workload asked for (run.request_reshard): save and exit for it"
        elif kinds.get(self.planned["kind"]).cause is not Cause.RESHARD:
            problem = (f"{self.planned['kind']} is not a planned reshard (shift_shards, drain): "
                       "save and exit for it")
        elif len(steps) > 1:
            problem = f"the ranks asked after different steps (rank: step): {self.live_asks}"
        self.handover = self.on_live(None if problem else self._planned_outcome(), steps[0],
                                     problem)
        self.on_live = None  # answered once
        if not self.handover.live:  # the refusal, not the notice, ends this generation
            self.plan_deadline = None
            if self.planned is not None:
                self.handover.fault_id = self.planned.get("id")

    def _status(self, events: list[dict]) -> None:
        begun = [ev["step"] for ev in events if ev["gen"] == self.gen and ev["ev"] == Ev.BEGIN]
        if begun:
            self.step = max([*begun, *([] if self.step is None else [self.step])])
        self.on_status(Status(self.gen, self.world_size, self.step, self.sc.steps,
                                  len(self.fired), len(self.sc.schedule.faults)))

    def _on_exit(self, rank: int, code: int, codes: dict[int, int | None], now: float) -> None:
        """Judge one rank's exit: normal, or the generation's first failure."""
        if self.handover is not None and not self.handover.live:
            self.reported.add(rank)  # refused to reshard in place: the refusal explains it
            return
        normal = code == 0 or self.tail.clean_exit(self.gen, rank)  # SIGABRT after close
        if normal and (self.planned is not None or (self._last_end(rank) or -1) >= self.sc.steps - 1):
            self.reported.add(rank)
            return
        if self.members is not None and self._member_died(rank, code, normal):
            return
        if self._preempting() and (code == -signal.SIGTERM or self.sigtermed):
            # A rank without SIGTERM handling dies of the preemption's SIGTERM, as on a spot
            # node, and its peers then fail their next collective: the preemption ends the
            # generation (planned), and what it cost is no_rewind's to judge.
            self.reported.add(rank)
            if code == -signal.SIGTERM:
                self.sigtermed.add(rank)
                self._detect(Detected.DIED, rank, expected=True, code=code)
            return
        # Peers of a killed rank die too ("Connection closed by peer"), sometimes before its
        # own exit is reaped: blame the rank an unplanned-death fault fired on.
        culprit = self._faulted_rank(kinds.Ending.DEATH)
        if culprit is not None:
            if codes.get(culprit) is None:
                return  # judge again once the culprit's exit is reported
            rank, code = culprit, codes[culprit]
            normal = code == 0 or self.tail.clean_exit(self.gen, rank)
        self.reported.add(rank)
        fault = self._fault_for(rank, kinds.Ending.DEATH)
        # exit 0 mid-run without a planned event: a silent death (a process that vanished
        # without a traceback, as GPU drafters do when the driver takes them)
        kind = Detected.EXITED_EARLY if normal else Detected.DIED
        detail = self._detect(kind, rank, expected=fault is not None, code=code,
                              since=fault["t"] if fault else None)
        self.failure = Failure(rank, code, now, detail)

    def _member_preempt(self, ev: dict, declared: kinds.FaultKind) -> bool:
        """Membership mode: a preemption of some groups is theirs, not the generation's."""
        if self.members is None or declared.cause is not Cause.PREEMPT:
            return False
        return self.members.preempt(ev, float(ev["params"][declared.deadline_param]))

    def _member_died(self, rank: int, code: int, normal: bool) -> bool:
        """Membership mode: restart the rank's replica group alone (the others train on); False
        when its restart budget is spent, and the death then ends the generation."""
        if self.members.down(rank) or self.live.exit_codes().get(rank) is None:
            self.reported.add(rank)  # down already, or restarted in this poll (a stale code)
            return True
        group = self.members.group_of(rank)
        if rank // self.members.per in self.members.preempted:  # planned: no detection
            codes = self.live.exit_codes()
            if any(codes.get(r) is None for r in group):
                self.reported.add(rank)  # its peers still use their grace: restart them together
                return True
            if not self.members.may_restart(rank):
                return False
            detail = f"rank {rank} ended by its group's preemption (exit code {code})"
        else:
            if not self.members.may_restart(rank):
                return False
            kind = Detected.EXITED_EARLY if normal else Detected.DIED
            fault = self._fault_for(rank, kinds.Ending.DEATH)
            detail = self._detect(kind, rank, expected=fault is not None, code=code,
                                  since=fault["t"] if fault else None)
        self.members.restart(self, rank, detail)
        return True

    def _watch_memory(self, live: LiveGeneration, codes: dict[int, int | None]) -> None:
        """Track each rank's peak RSS; past the budget, end the rank as the OOM killer would."""
        budget = self.sc.memory_budget_bytes
        for rank, pid in live.pids().items():
            if codes.get(rank) is not None:
                continue
            peak = live.peak_rss(rank, pid)
            if peak is None:
                continue
            self.peaks[rank] = max(peak, self.peaks.get(rank, 0))
            if budget and peak > budget and self.failure is None:
                live.signal(rank, signal.SIGKILL)
                step, phase = self.tail.last_position(self.gen, rank)
                where = f"at step {step}, phase {phase}" if step is not None else "before its first step"
                detail = (f"rank {rank} exceeded its memory budget {where}: peak RSS "
                          f"{peak / 2**20:.0f} MiB > budget {budget / 2**20:.0f} MiB; "
                          f"killed it as the OOM killer would")
                self.record(Ev.DETECT, gen=self.gen, kind=Detected.OOM.value, rank=rank, step=step,
                                phase=phase, exit_code=-signal.SIGKILL, latency_s=None,
                                expected=False, detail=detail)
                self.reported.add(rank)
                self.failure = Failure(rank, -signal.SIGKILL, time.monotonic(), detail)

    def _faulted_rank(self, ending: kinds.Ending) -> int | None:
        """The rank a fault that ends its victim this way fired on, in this generation."""
        for (gen, rank), evs in self.tail.by_rank.items():
            if gen == self.gen and any(_is(e, ending) for e in evs):
                return rank
        return None

    def _fault_for(self, rank: int, ending: kinds.Ending) -> dict | None:
        return next((e for e in self.tail.events(self.gen, rank) if _is(e, ending)), None)

    def run(self) -> Outcome:
        sc, gen, live = self.sc, self.gen, self.live
        while True:
            codes = live.exit_codes()  # first: a rank writes all its events before it exits
            self.tail.poll(gen)
            self.take_events()
            if self.members is not None and self.members.poll(self):
                codes = live.exit_codes()  # a group started again runs now
            now = time.monotonic()
            # Judge exits in the order the ranks went quiet: in a cascade the root cause (a
            # silent exit, an exception of its own) stops writing events before its peers fail.
            exited = [r for r, c in codes.items() if c is not None and r not in self.reported]
            for rank in sorted(exited, key=self._last_event_t):
                if self.failure is None:
                    self._on_exit(rank, codes[rank], codes, now)
            self._watch_memory(live, codes)
            if all(c is not None for c in codes.values()):
                if self.members is None or not self.members.pending:
                    return self._classify(codes)
                if self._finished({r: c for r, c in codes.items() if not self.members.down(r)}):
                    self.down_at_end = self.members.drop_pending(
                        "the other groups finished the run while this one was down")
                    return self._classify(codes)
                # every group is down: the restart delay runs, then poll starts them
            if self.failure and now - self.failure.at > sc.failure_grace_s:
                return self._classify(codes)
            if self.handover is not None and self.handover.live and self.failure is None and \
                    self._handed_over(codes):
                return self.handover
            if self.plan_deadline is not None and now > self.plan_deadline:
                return self._missed_deadline(codes)
            hung = self._stopped_rank(codes) if self.failure is None else None
            if hung is not None:
                self._end_hung(live, hung, self._hang(Detected.STOPPED, hung,
                                                      since=self._last_beat(hung)))
                continue
            quiet = now - self.last_progress
            limit = sc.stall_s if self.started_training else sc.startup_s
            if quiet > limit and self.failure is None and self.plan_deadline is None:
                # Everyone is alive and silent: blame the rank a hang fault fired on, if any.
                culprit = self._faulted_rank(kinds.Ending.HANG)
                rank = culprit if culprit is not None else \
                    min((r for r, c in codes.items() if c is None), default=0)
                self._end_hung(live, rank, self._hang(Detected.STALLED, rank, since=None))
                continue
            if now > self.deadline:
                return Outcome(Cause.TIMEOUT, detail=f"scenario timeout of {sc.timeout_s:.0f} s "
                               f"reached in generation {gen}")
            time.sleep(POLL_S)

    def _preempting(self) -> bool:
        """A planned fault whose cause is a preemption fired in this generation."""
        kind = (self.planned or {}).get("kind")
        return kind in kinds.registered() and kinds.get(kind).cause is Cause.PREEMPT

    def _hang(self, kind: Detected, rank: int, since: float | None) -> Outcome:
        fault = self._fault_for(rank, kinds.Ending.HANG)
        detail = self._detect(kind, rank, expected=fault is not None,
                              since=fault["t"] if fault and since is None else since)
        if fault is None:
            return Outcome(Cause.HANG, detail=detail)
        after = int(fault["params"].get("then_world_size") or self.world_size)
        return Outcome(Cause.HANG, fault_id=fault["id"], detail=detail, next_world_size=after,
                       lost_rank=rank)

    def _end_hung(self, live: LiveGeneration, rank: int, outcome: Outcome) -> None:
        """Kill only the hung rank and treat it as a death: its peers then fail their next
        collective and get the failure grace to save what they hold (an emergency snapshot),
        exactly as after a kill; killing them all at once would throw that state away."""
        live.signal(rank, signal.SIGKILL)
        self.hung = outcome
        self.reported.add(rank)
        self.failure = Failure(rank, -signal.SIGKILL, time.monotonic(), outcome.detail)

    def _last_beat(self, rank: int) -> float | None:
        """When the rank last showed life: its launcher knows (a remote rank's last line), else
        its heartbeat file's mtime; None before it attached."""
        beat = self.live.last_beat(rank)
        if beat is not None:
            return beat
        try:
            return os.path.getmtime(self.dir.heartbeat(self.gen, rank))
        except FileNotFoundError:
            return None

    def _stopped_rank(self, codes: dict[int, int | None]) -> int | None:
        """A live rank that does not run: the kernel has held it stopped by a signal (state T,
        SIGSTOP) for ``STOP_CONFIRM_S``, or its heartbeat is silent for ``hang_s`` while the
        kernel says it is stopped or traced, or silent for ``10 * hang_s`` (at least 10 s)
        whatever /proc says: a busy machine or a long import holding the GIL can delay a
        heartbeat, and a false "stopped" is a false verdict. State T comes only from a signal,
        never from load, so it needs no heartbeat to be believed."""
        now, mono = time.time(), time.monotonic()
        pids = self.live.pids()
        for rank, code in codes.items():
            if code is not None:
                continue
            events = self.tail.events(self.gen, rank)
            if events and events[-1]["ev"] == Ev.EXIT:
                continue  # closed: its interpreter is exiting, and the heartbeat with it
            state = self.live.state(rank, pids.get(rank))
            if state == "T":
                since = self.stopped_since.setdefault(rank, mono)
                if mono - since >= STOP_CONFIRM_S:
                    return rank
            else:
                self.stopped_since.pop(rank, None)
            beat = self._last_beat(rank)
            if beat is None:
                continue  # not attached yet: covered by the startup limit
            age = now - beat
            if age > self.sc.hang_s and (state in ("T", "t") or age > max(10 * self.sc.hang_s, 10.0)):
                return rank
        return None

    def _missed_deadline(self, codes: dict[int, int | None]) -> Outcome:
        ev = self.planned or {}
        alive = sorted(r for r, c in codes.items() if c is None)
        declared = kinds.get(ev["kind"]) if ev.get("kind") in kinds.registered() else None
        period = "notice" if declared and declared.deadline_param == "notice_s" else "grace period"
        return Outcome(Cause.FAILURE, fault_id=ev.get("id"),
                       detail=f"{ev.get('kind')} at step {ev.get('step')} {ev.get('phase')}: "
                              f"ranks {alive} were still running when the {period} ran out "
                              f"(generation {self.gen}); killed them")

    def _classify(self, codes: dict[int, int | None]) -> Outcome:
        sc = self.sc
        if self.hung is not None:
            return self.hung
        if self.handover is not None and not self.handover.live:
            return self.handover  # the harness refused to reshard in place
        if self.failure is not None:
            rank, detail = self.failure.rank, self.failure.detail
            fault = self._fault_for(rank, kinds.Ending.DEATH)
            if fault is None:
                return Outcome(Cause.FAILURE, detail=detail)
            after = int(fault["params"].get("then_world_size") or self.world_size)
            return Outcome(Cause.FAILURE, fault_id=fault["id"], detail=detail,
                           next_world_size=after, lost_rank=rank)
        if self.planned is not None and self._finished(codes):
            ev = self.planned  # a notice at the last step: nothing is left for a next generation
            return Outcome(Cause.COMPLETE, fault_id=ev["id"],
                           detail=f"{ev['kind']} arrived after the last step had run")
        if self.planned is not None:
            return self._planned_outcome()
        # Everybody exited 0 with nothing planned: finished, or a silent early exit.
        last = {r: self._last_end(r) for r in codes if r not in self.down_at_end}
        short = sorted(r for r, s in last.items() if s is None or s < sc.steps - 1)
        if short:
            rank = short[0]
            return Outcome(Cause.FAILURE, detail=self._detect(Detected.EXITED_EARLY, rank,
                                                              expected=False))
        return Outcome(Cause.COMPLETE)

    def _planned_outcome(self) -> Outcome:
        """How the planned event of this generation ends it, and what comes next."""
        sc = self.sc
        ev = self.planned
        assert ev is not None
        drained = ev["kind"] == Cause.DRAIN.value  # the workload asked (run.request_reshard)
        declared = None if drained else kinds.get(ev["kind"])
        cause = Cause.DRAIN if declared is None else declared.cause
        assert cause is not None
        params = ev["params"]
        after = params.get("to_world_size") or params.get("then_world_size") or self.world_size
        detail = (f"the workload asked to drain to {after} ranks: {ev['reason']}"
                  if drained else f"{ev['kind']} at step {ev['step']} {ev['phase']}")
        device_map = None
        if declared is not None and declared.relocates:
            device_map = rebalanced(self.world_size, params["fraction"],
                                   f"{sc.schedule.seed}:{ev['id']}")
            detail += f": rank r now on device {device_map}[r]"
        if params.get("roles"):
            detail += f"; roles now {dict(params['roles'])}"
        if self.sigtermed:
            detail += (f"; rank{'s' if len(self.sigtermed) > 1 else ''} "
                       f"{', '.join(map(str, sorted(self.sigtermed)))} died of its SIGTERM: "
                       "the workload does not handle SIGTERM (ask run.stop_requested() and "
                       "save when it is true), so a preemption costs all since its last "
                       "checkpoint")
        return Outcome(cause, planned=True, fault_id=ev["id"], detail=detail,
                       next_world_size=int(after), device_map=device_map,
                       next_roles=params.get("roles"))

    def _handed_over(self, codes: dict[int, int | None]) -> bool:
        """Every rank of a live reshard is through with this generation: exited (a leaver) or
        gone on in the next one (its last event here says where it moved)."""
        for rank, code in codes.items():
            events = self.tail.events(self.gen, rank)
            if code is None and not (events and events[-1]["ev"] == Ev.EXIT
                                     and events[-1].get("moved_to")):
                return False
        return True

    def _last_event_t(self, rank: int) -> float:
        events = self.tail.events(self.gen, rank)
        return events[-1]["t"] if events else float("inf")

    def _finished(self, codes: dict[int, int | None]) -> bool:
        """Every rank ended the run's last step (so there is nothing left to resume)."""
        return all((self._last_end(r) or -1) >= self.sc.steps - 1 for r in codes)

    def _last_end(self, rank: int) -> int | None:
        """The last step whose effect the rank holds: the last it ended, or the one before where
        it resumed (a generation that resumes past the last step has nothing left to run)."""
        done = [ev["step"] if ev["ev"] == Ev.END else ev["step"] - 1
                for ev in self.tail.events(self.gen, rank) if ev["ev"] in (Ev.END, Ev.RESUMED)]
        return max(done) if done else None


def rebalanced(world_size: int, fraction: float, seed: str) -> list[int]:
    """A rank -> device map that moves ``fraction`` of the ranks (at least two) to other devices:
    the chosen ones rotate one place among themselves, drawn from ``seed`` for replays."""
    import random

    moved = sorted(random.Random(seed).sample(range(world_size),
                                               min(world_size, max(2, round(fraction * world_size)))))
    device_map = list(range(world_size))
    for i, shard in enumerate(moved):
        device_map[shard] = moved[(i + 1) % len(moved)]
    return device_map
