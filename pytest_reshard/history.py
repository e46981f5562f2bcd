"""The history: every event of every rank and generation, merged and queryable.

The probe writes one JSONL file per rank per generation (``events/g{gen}-r{rank}.jsonl``) and the
supervisor writes ``events/supervisor.jsonl``. ``History`` reads them once and answers the
questions the checkers ask ("which steps committed?", "whose effect persisted?", "which samples
did the kept steps consume?"). It is pure data: no processes, no torch, no pytest.

Why the definitions are what they are:

- A step is *committed* in a generation when every rank of that generation's world size recorded
  its ``end``: a step some rank never finished may not have reached the state any rank saved.
- A generation's *resume step* is the step its ranks declared with ``run.resumed``; ranks should
  agree, and when they do not the lowest wins (the most state any of them threw away). A generation
  that never declared one but ran steps resumes, in effect, at the first step it began.
- In **membership mode** (``Scenario.replica_groups``; the supervisor's ``member`` events) a
  rank's file holds one *incarnation* per ``start`` event: a replica group restarted alone
  appends to it. Each ``begin`` is an *attempt* (a fault-tolerant trainer retries a step the
  quorum did not commit), and an attempt counts only if it ended. A step is committed when every
  rank of at least one replica group ended an attempt of it (torchft's commit is a vote inside a
  group: a group that ended the step holds its effect, and donates it to the groups that heal),
  and an occurrence's samples are those of its ended attempts.
- An occurrence ``(gen, step)`` is *kept* (its effect persisted into the final state) when the step
  ended on at least one rank in ``gen`` and every later generation that resumed did so after it
  (``step < resume step`` of all of them). When no later generation resumed, the run ended with
  ``gen``'s state, and only its committed steps count: an uncommitted step's effect is unknown.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pytest_reshard.contract import (RANK_FILE, STEP_EVENTS, SUPERVISOR_EVENTS, Ev, RunDir, Torn,
                                     read_jsonl)

__all__ = [
    "History", "HistoryError", "ScenarioRecord", "Generation", "Occurrence", "Checkpoint",
    "FaultFired", "Detection", "Torn", "RankMemory", "StepSpan", "Attempt", "Replay",
]

Event = Mapping[str, Any]


class HistoryError(ValueError):
    """The recorded events cannot be read; the message names the file, line and what to do."""


@dataclass(frozen=True)
class ScenarioRecord:
    """What the run was asked to do (the supervisor's ``scenario`` event)."""

    workload: str
    steps: int
    world_size: int
    seed: int
    schedule: Mapping[str, Any]
    schedule_hash: str | None
    replay: str | None
    backend: str = "gloo"
    launcher: str = "fork"
    memory_budget_bytes: int | None = None

    def fault(self, fault_id: int | None) -> Mapping[str, Any] | None:
        faults = self.schedule.get("faults", [])
        if fault_id is None or not 0 <= fault_id < len(faults):
            return None
        fault: Mapping[str, Any] = faults[fault_id]
        return fault


@dataclass(frozen=True)
class Generation:
    """One launch of the ranks, from the supervisor's view and the ranks' own events."""

    gen: int
    world_size: int
    roles: tuple[str, ...]
    launcher: str | None
    resume_step: int | None      # declared by ``resumed`` (lowest rank value), else first begun step
    resume_declared: bool
    resume_source: str | None
    cause: str | None            # gen_end cause; None when the supervisor recorded no end
    planned: bool                # gen_end planned; False when unknown
    fault_id: int | None
    detail: str
    started_at: float | None = None  # the supervisor's gen_start time; None when it recorded none
    ended_at: float | None = None    # the supervisor's gen_end time; None when it recorded none

    @property
    def ended(self) -> bool:
        return self.cause is not None


@dataclass(frozen=True, order=True)
class Occurrence:
    """One execution of ``step`` in generation ``gen``."""

    step: int
    gen: int


@dataclass(frozen=True)
class Checkpoint:
    """A ``ckpt_save`` or ``ckpt_load`` event of one rank."""

    kind: str                    # "save" | "load"
    gen: int
    rank: int
    step: int
    digest: Mapping[str, str]
    expected: Mapping[str, str] | None
    t: float
    index: int                   # position in the history, to order events without clocks
    seconds: float | None = None  # how long the save or load took, when the workload said
    bytes: int | None = None     # how much it wrote or read, when the workload said
    info: Mapping[str, Any] = field(default_factory=dict)  # the workload's other fields
    # (world_size, source, saved_world_size, kind="emergency", ...)


@dataclass(frozen=True)
class FaultFired:
    gen: int
    rank: int
    step: int
    phase: str
    kind: str
    id: int | None
    params: Mapping[str, Any]
    t: float | None = None       # when it fired on this rank


@dataclass(frozen=True)
class Detection:
    """The supervisor noticed a rank die, stop, stall or exit early."""

    gen: int
    kind: str                    # "died" | "stopped" | "stalled" | "exited_early"
    rank: int | None
    step: int | None
    phase: str | None
    exit_code: int | None
    latency_s: float | None
    expected: bool
    detail: str = ""
    t: float | None = None       # when the supervisor recorded it


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory over the whole run: its highest peak RSS (the supervisor samples VmHWM
    of every generation's process), the per-rank budget, and the device peak and size the
    workload reported (``run.memory(peak, budget_bytes=device total)``; CUDA on GPU)."""

    rank: int
    peak_bytes: int | None
    budget_bytes: int | None
    device_peak_bytes: int | None = None
    device_total_bytes: int | None = None

    @property
    def headroom_bytes(self) -> int | None:
        return None if self.peak_bytes is None or not self.budget_bytes \
            else self.budget_bytes - self.peak_bytes

    @property
    def device_headroom_bytes(self) -> int | None:
        return None if self.device_peak_bytes is None or not self.device_total_bytes \
            else self.device_total_bytes - self.device_peak_bytes


@dataclass(frozen=True)
class StepSpan:
    """One rank's run of one step in one generation, from its ``begin`` to its ``end``."""

    gen: int
    rank: int
    step: int
    begin_t: float
    end_t: float | None          # None: begun, never ended (in flight when the rank stopped)

    @property
    def done(self) -> bool:
        return self.end_t is not None

    @property
    def seconds(self) -> float | None:
        return None if self.end_t is None else self.end_t - self.begin_t


@dataclass(frozen=True)
class Attempt:
    """One ``begin`` of a step on one rank, in membership mode: which incarnation of the rank
    (0 for the first ``start``), whether it ended, and what it recorded."""

    gen: int
    rank: int
    incarnation: int
    step: int
    begin_index: int             # positions in ``History.events`` (ordered by time)
    end_index: int | None        # None: it raised, or the rank died in it
    start_index: int = -1        # where its incarnation's ``start`` is
    samples: tuple[tuple[int, int], ...] = ()
    quorum: Any = None           # the membership epoch the workload recorded (``quorum=``)
    participants: int | None = None  # replica groups in that quorum (``participants=``)
    participating: bool | None = None  # False: its gradient was zeroed (a group still healing)
    phase: str = "begin"         # the last fault point it reached

    @property
    def ended(self) -> bool:
        return self.end_index is not None


@dataclass(frozen=True)
class Replay:
    """A committed step executed and ended again later, in a membership generation."""

    gen: int
    rank: int
    incarnation: int
    step: int
    committed_index: int         # when the step was first committed (every rank of a group ended it)


@dataclass
class _Index:
    """Per-(gen, step) facts, built once."""

    ends: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    end_times: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)
    begins: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    records: dict[tuple[int, int], list[Event]] = field(default_factory=dict)
    starts: dict[int, dict[int, Event]] = field(default_factory=dict)
    resumed: dict[int, dict[int, Event]] = field(default_factory=dict)
    ranks_seen: dict[int, set[int]] = field(default_factory=dict)


class History:
    """The merged, typed events of one run. Build with ``load`` or ``from_events``."""

    def __init__(self, events: Sequence[Event], *, torn: Sequence[Torn] = (),
                 run_dir: Path | None = None) -> None:
        self.events: tuple[Event, ...] = tuple(events)
        self.torn: tuple[Torn, ...] = tuple(torn)
        #: The run folder it was loaded from (its logs, for messages), None when built in memory.
        self.run_dir = run_dir
        self._ix = _Index()
        self._supervisor: list[Event] = []
        self._ranked: list[tuple[int, Event]] = []
        for i, e in enumerate(self.events):
            _validate(e, f"event #{i}")
            if _is_supervisor(e):
                self._supervisor.append(e)
            else:
                self._ranked.append((i, e))
                self._index_rank_event(e)
        self.scenario = self._scenario()
        self.generations: dict[int, Generation] = self._generations()
        groups = [e for e in self._supervisor if e["ev"] == Ev.MEMBER and e.get("action") == "groups"]
        #: Membership mode: (replica groups, ranks per group); None outside it.
        self.replica_groups: tuple[int, int] | None = \
            (int(groups[0]["groups"]), int(groups[0]["per"])) if groups else None
        self._attempts: list[Attempt] | None = None
        self._by_step: dict[tuple[int, int], list[Attempt]] | None = None

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_events(cls, events: Iterable[Event]) -> "History":
        """A history from event dicts, in order (supervisor events are told apart by ``ev``)."""
        return cls([dict(e) for e in events])

    @classmethod
    def load(cls, run_dir: str | Path) -> "History":
        """Read ``run_dir/events/*.jsonl`` (or ``run_dir/*.jsonl``), tolerating torn last lines."""
        root = RunDir(Path(run_dir))
        events_dir = root.events if root.events.is_dir() else root.root
        supervisor_file = root.supervisor_events.name
        if not events_dir.is_dir():
            raise HistoryError(f"{root.root}: no such run directory; pass the folder the run wrote")
        files = sorted(p for p in events_dir.glob("*.jsonl")
                       if p.name == supervisor_file or RANK_FILE.fullmatch(p.name))
        if not files:
            raise HistoryError(f"{events_dir}: no event files (g*-r*.jsonl, {supervisor_file}); "
                               "did the run start any rank?")
        events: list[Event] = []
        torn: list[Torn] = []
        for path in files:
            try:
                file_events, file_torn = read_jsonl(path)
            except ValueError as e:
                raise HistoryError(str(e)) from None
            m = RANK_FILE.fullmatch(path.name)
            for lineno, e in file_events:
                _validate(e, f"{path}:{lineno}")
                if m:   # a rank file: its name says which generation and rank wrote it
                    gen, rank = int(m.group(1)), int(m.group(2))
                    if _is_supervisor(e):
                        raise HistoryError(f"{path}:{lineno}: supervisor event {e['ev']!r} in a "
                                           "rank's file")
                    if (e["gen"], e["rank"]) != (gen, rank):
                        raise HistoryError(f"{path}:{lineno}: event of generation {e['gen']} rank "
                                           f"{e['rank']} in the file of generation {gen} rank {rank}")
                elif not _is_supervisor(e):
                    raise HistoryError(f"{path}:{lineno}: rank event {e['ev']!r} in the "
                                       "supervisor's file")
                events.append(e)
            torn.extend(file_torn)
        events.sort(key=lambda e: float(e.get("t", 0.0)))  # stable: file order within equal times
        return cls(events, torn=torn, run_dir=root.root)

    def _index_rank_event(self, e: Event) -> None:
        ix = self._ix
        gen, rank, ev = int(e["gen"]), int(e["rank"]), e["ev"]
        ix.ranks_seen.setdefault(gen, set()).add(rank)
        if ev == "start":
            ix.starts.setdefault(gen, {})[rank] = e
        elif ev == "resumed":
            ix.resumed.setdefault(gen, {}).setdefault(rank, e)
        elif ev == "begin":
            ix.begins.setdefault((gen, int(e["step"])), set()).add(rank)
        elif ev == "end":
            ix.ends.setdefault((gen, int(e["step"])), set()).add(rank)
            ix.end_times.setdefault((gen, int(e["step"])), {})[rank] = float(e.get("t", 0.0))
        elif ev == "record":
            ix.records.setdefault((gen, int(e["step"])), []).append(e)

    # -- supervisor view --------------------------------------------------------------------
    def _scenario(self) -> ScenarioRecord | None:
        for e in self._supervisor:
            if e["ev"] == Ev.SCENARIO:
                budget = e.get("memory_budget_bytes")
                return ScenarioRecord(
                    workload=str(e.get("workload", "")), steps=int(e.get("steps", 0)),
                    world_size=int(e.get("world_size", 0)), seed=int(e.get("seed", 0)),
                    schedule=dict(e.get("schedule") or {}), schedule_hash=e.get("schedule_hash"),
                    replay=e.get("replay"), backend=str(e.get("backend") or "gloo"),
                    launcher=str(e.get("launcher") or "fork"),
                    memory_budget_bytes=None if budget is None else int(budget))
        return None

    def _generations(self) -> dict[int, Generation]:
        starts = {int(e["gen"]): e for e in self._supervisor if e["ev"] == Ev.GEN_START}
        ends = {int(e["gen"]): e for e in self._supervisor if e["ev"] == Ev.GEN_END}
        ix = self._ix
        gens: dict[int, Generation] = {}
        for gen in sorted(set(starts) | set(ends) | set(ix.ranks_seen)):
            start, end = starts.get(gen, {}), ends.get(gen, {})
            rank_starts = ix.starts.get(gen, {})
            world = start.get("world_size") or max(
                [int(s.get("world_size", 0)) for s in rank_starts.values()]
                + [max(ix.ranks_seen.get(gen, {-1})) + 1])
            roles = tuple(start.get("roles") or (
                str(rank_starts[r].get("role", "")) if r in rank_starts else ""
                for r in range(int(world))))
            resumed = ix.resumed.get(gen, {})
            resume: int | None
            if resumed:
                first = min(resumed.values(), key=lambda e: int(e["step"]))
                resume, declared, source = int(first["step"]), True, first.get("source")
            else:
                begun = [s for (g, s) in ix.begins if g == gen]
                resume, declared, source = (min(begun) if begun else None), False, None
            fault_id = end.get("fault_id")
            gens[gen] = Generation(
                gen=gen, world_size=int(world), roles=roles, launcher=start.get("launcher"),
                resume_step=resume, resume_declared=declared, resume_source=source,
                cause=end.get("cause"), planned=bool(end.get("planned", False)),
                fault_id=None if fault_id is None else int(fault_id),
                detail=str(end.get("detail") or ""),
                started_at=_opt_float(start.get("t")), ended_at=_opt_float(end.get("t")))
        return gens

    @property
    def replay(self) -> str | None:
        return self.scenario.replay if self.scenario else None

    @property
    def final_generation(self) -> Generation | None:
        return self.generations[max(self.generations)] if self.generations else None

    def supervisor_events(self, ev: str | None = None, *, gen: int | None = None) -> list[Event]:
        """The supervisor's events (of kind ``ev``, of generation ``gen``), in history order."""
        return [e for e in self._supervisor if (ev is None or e["ev"] == ev)
                and (gen is None or e.get("gen") == gen)]

    def detections(self) -> list[Detection]:
        return [Detection(gen=int(e["gen"]), kind=str(e.get("kind", "")),
                          rank=_opt_int(e.get("rank")),
                          step=_opt_int(e.get("step")), phase=e.get("phase"),
                          exit_code=_opt_int(e.get("exit_code")),
                          latency_s=e.get("latency_s"), expected=bool(e.get("expected", False)),
                          detail=str(e.get("detail", "")), t=_opt_float(e.get("t")))
                for e in self._supervisor if e["ev"] == Ev.DETECT]

    def unfired(self) -> list[Event]:
        return [e for e in self._supervisor if e["ev"] == Ev.UNFIRED]

    def describe_fault(self, fault_id: int | None) -> str | None:
        """``kill(rank:1) at step 25 backward`` for a schedule index, or None."""
        if fault_id is None:
            return None
        fault = self.scenario.fault(fault_id) if self.scenario else None
        if fault is None:
            fired = [f for f in self.faults_fired() if f.id == fault_id]
            if not fired:
                return f"fault #{fault_id}"
            f0 = fired[0]
            fault = {"kind": f0.kind, "target": f"rank:{f0.rank}", "step": f0.step,
                     "phase": f0.phase, "params": f0.params}
        extra = "".join(f" {k}={v}" for k, v in sorted(dict(fault.get("params") or {}).items()))
        return f"{fault.get('kind')}({fault.get('target')}) at step {fault.get('step')} " \
               f"{fault.get('phase')}{extra}"

    # -- rank view --------------------------------------------------------------------------
    def rank_events(self, ev: str | None = None, *, gen: int | None = None,
                    rank: int | None = None) -> list[Event]:
        return [e for _, e in self._ranked if (ev is None or e["ev"] == ev)
                and (gen is None or e["gen"] == gen) and (rank is None or e["rank"] == rank)]

    def file_events(self, *, gen: int | None = None) -> list[Event]:
        """The ranks' file events (``filewatch``), every rank's in the order they happened."""
        return self.rank_events(Ev.FILE, gen=gen)

    def disk(self, gen: int) -> dict[str, list[Any]] | None:
        """The work folder as generation ``gen`` left it (``{path: [size, crc]}``), when the
        scenario recorded file events; None otherwise or for a history built in memory."""
        if self.run_dir is None:
            return None
        path = RunDir(self.run_dir).disk(gen)
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def times(self, ev: str, *, gen: int | None = None, rank: int | None = None) -> list[float]:
        """When the rank events of kind ``ev`` (of ``gen``, of ``rank``) happened, in history
        order (an event without a time counts as 0)."""
        return [_t(e) for e in self.rank_events(ev, gen=gen, rank=rank)]

    def step_spans(self, *, gen: int | None = None, rank: int | None = None) -> list[StepSpan]:
        """Each rank's steps from ``begin`` to ``end`` (of ``gen``, of ``rank``), ordered by
        generation, rank and begin time. A step begun and never ended has ``end_t`` None; a step
        begun twice on a rank spans from its last ``begin``; an ``end`` with no open ``begin``
        makes no span."""
        done: list[StepSpan] = []
        open_: dict[tuple[int, int], dict[int, float]] = {}
        for _, e in self._ranked:
            if (gen is not None and e["gen"] != gen) or (rank is not None and e["rank"] != rank):
                continue
            key, step = (int(e["gen"]), int(e["rank"])), e.get("step")
            if e["ev"] == Ev.BEGIN:
                open_.setdefault(key, {})[int(step)] = _t(e)
            elif e["ev"] == Ev.END and step in open_.get(key, {}):
                done.append(StepSpan(key[0], key[1], int(step), open_[key].pop(step), _t(e)))
        unfinished = [StepSpan(g, r, s, t0, None) for (g, r), steps in open_.items()
                      for s, t0 in steps.items()]
        return sorted(done + unfinished, key=lambda x: (x.gen, x.rank, x.begin_t))

    def starts(self, gen: int) -> dict[int, Event]:
        """rank -> its ``start`` event in ``gen``."""
        return dict(self._ix.starts.get(gen, {}))

    def ranks_seen(self, gen: int) -> frozenset[int]:
        return frozenset(self._ix.ranks_seen.get(gen, ()))

    def role(self, gen: int, rank: int) -> str:
        start = self._ix.starts.get(gen, {}).get(rank)
        if start is not None and start.get("role"):
            return str(start["role"])
        roles = self.generations[gen].roles if gen in self.generations else ()
        return roles[rank] if rank < len(roles) else ""

    def max_rewind_steps(self, gen: int) -> int:
        """What an unplanned failure may cost, as declared in ``gen`` at ``attach`` or ``resumed``
        (the lowest declaration wins; undeclared -> 0)."""
        values = [e.get("max_rewind_steps") for by_rank in (self._ix.starts, self._ix.resumed)
                  for e in by_rank.get(gen, {}).values()]
        declared = [int(v) for v in values if v is not None]
        return min(declared) if declared else 0

    def ended_by(self, gen: int, step: int) -> frozenset[int]:
        return frozenset(self._ix.ends.get((gen, step), ()))

    def begun(self, gen: int) -> frozenset[int]:
        return frozenset(s for (g, s) in self._ix.begins if g == gen)

    def ended(self, gen: int | None = None) -> frozenset[int]:
        """Steps at least one rank ended (in ``gen``, or in any generation)."""
        return frozenset(s for (g, s) in self._ix.ends if gen is None or g == gen)

    def committed(self, gen: int) -> frozenset[int]:
        """Steps every rank of ``gen``'s world size ended (membership mode: every rank of at
        least one replica group)."""
        if self.replica_groups is not None:
            return frozenset(self._first_commits(gen))
        world = set(range(self.generations[gen].world_size)) if gen in self.generations else set()
        return frozenset(s for (g, s), ranks in self._ix.ends.items()
                         if g == gen and world and world <= ranks)

    def kept(self) -> list[Occurrence]:
        """Occurrences whose effect persisted into the final state (see the module docstring)."""
        gens = sorted(self.generations)
        out: list[Occurrence] = []
        for i, gen in enumerate(gens):
            later = [r for g in gens[i + 1:] if (r := self.generations[g].resume_step) is not None]
            if later:
                bound = min(later)
                steps = {s for s in self.ended(gen) if s < bound}
            else:
                steps = set(self.committed(gen))
            out.extend(Occurrence(s, gen) for s in steps)
        return sorted(out)

    def loss(self, gen: int, step: int) -> float | None:
        """The step's loss: rank 0's, else the lowest rank's that recorded one (last record wins)."""
        by_rank: dict[int, float] = {}
        for e in self._ix.records.get((gen, step), ()):
            if e.get("loss") is not None:
                by_rank[int(e["rank"])] = float(e["loss"])
        return by_rank[min(by_rank)] if by_rank else None

    def kept_losses(self) -> dict[int, tuple[Occurrence, float]]:
        """step -> (occurrence, loss) over kept occurrences; a later generation wins a tie."""
        out: dict[int, tuple[Occurrence, float]] = {}
        for occ in sorted(self.kept(), key=lambda o: (o.gen, o.step)):
            loss = self.loss(occ.gen, occ.step)
            if loss is not None:
                out[occ.step] = (occ, loss)
        return out

    def samples(self, gen: int, step: int) -> dict[int, list[tuple[int, int]]]:
        """rank -> the (epoch, sample id) pairs it recorded in this occurrence, in order
        (membership mode: in its attempts that ended and whose gradient counted)."""
        out: dict[int, list[tuple[int, int]]] = {}
        if self.replica_groups is not None:
            for a in self._attempts_of(gen, step):  # a zeroed gradient trained nothing
                if a.ended and a.samples and a.participating is not False:
                    out.setdefault(a.rank, []).extend(a.samples)
            return out
        for e in self._ix.records.get((gen, step), ()):
            if e.get("samples") is not None:
                epoch = int(e.get("epoch", 0) or 0)
                out.setdefault(int(e["rank"]), []).extend((epoch, int(s)) for s in e["samples"])
        return out

    def kept_samples(self) -> dict[Occurrence, frozenset[tuple[int, int]]]:
        """occurrence -> the union over ranks of its (epoch, sample id) pairs."""
        return {occ: frozenset(p for pairs in self.samples(occ.gen, occ.step).values()
                               for p in pairs) for occ in self.kept()}

    # -- membership mode ------------------------------------------------------------------
    def group_of(self, rank: int) -> int:
        """The replica group of ``rank`` (membership mode)."""
        assert self.replica_groups is not None, "not a membership run"
        return rank // self.replica_groups[1]

    def member_restarts(self, gen: int | None = None) -> list[Event]:
        """The supervisor's restarts of one replica group (``member`` events, action restart)."""
        return [e for e in self.supervisor_events(Ev.MEMBER, gen=gen) if e.get("action") == "restart"]

    def attempts(self, gen: int | None = None, *, rank: int | None = None) -> list[Attempt]:
        """Every ``begin`` of every rank (of ``gen``, of ``rank``), in history order."""
        if self._attempts is None:
            self._attempts = self._build_attempts()
        return [a for a in self._attempts if (gen is None or a.gen == gen)
                and (rank is None or a.rank == rank)]

    def _attempts_of(self, gen: int, step: int) -> list[Attempt]:
        if self._by_step is None:
            self._by_step = {}
            for a in self.attempts():
                self._by_step.setdefault((a.gen, a.step), []).append(a)
        return self._by_step.get((gen, step), [])

    def _build_attempts(self) -> list[Attempt]:
        incarnation: dict[tuple[int, int], int] = {}
        started: dict[tuple[int, int], int] = {}
        open_: dict[tuple[int, int], dict[str, Any]] = {}
        done: list[dict[str, Any]] = []
        for i, e in self._ranked:
            key, ev = (int(e["gen"]), int(e["rank"])), e["ev"]
            if ev == Ev.START:
                incarnation[key] = incarnation.get(key, -1) + 1
                started[key] = i
                if key in open_:
                    done.append(open_.pop(key))   # the last incarnation died in it
            elif ev == Ev.BEGIN:
                if key in open_:
                    done.append(open_.pop(key))
                open_[key] = {"gen": key[0], "rank": key[1], "incarnation": incarnation.get(key, 0),
                              "step": int(e["step"]), "begin_index": i, "end_index": None,
                              "start_index": started.get(key, -1),
                              "samples": [], "quorum": None, "participants": None,
                              "participating": None, "phase": "begin"}
            elif key in open_ and e.get("step") == open_[key]["step"]:
                a = open_[key]
                if ev == Ev.RECORD:
                    epoch = int(e.get("epoch", 0) or 0)
                    a["samples"].extend((epoch, int(x)) for x in e.get("samples") or ())
                    if "quorum" in e:
                        a["quorum"] = e["quorum"]
                    if e.get("participants") is not None:
                        a["participants"] = int(e["participants"])
                    if e.get("participating") is not None:
                        a["participating"] = bool(e["participating"])
                elif ev == Ev.POINT:
                    a["phase"] = str(e.get("phase"))
                elif ev == Ev.END:
                    a["end_index"] = i
                    done.append(open_.pop(key))
                elif ev == Ev.ERROR:
                    done.append(open_.pop(key))
        done.extend(open_.values())
        return sorted((Attempt(**{**a, "samples": tuple(a["samples"])}) for a in done),
                      key=lambda a: a.begin_index)

    def _first_commits(self, gen: int) -> dict[int, int]:
        """step -> when (event index) it was first committed in membership generation ``gen``:
        the earliest moment every rank of one incarnation of some replica group (its ranks are
        restarted together) had ended an attempt of it."""
        assert self.replica_groups is not None
        groups, per = self.replica_groups
        # (step, group, incarnation) -> rank -> its first end
        ends: dict[tuple[int, int, int], dict[int, int]] = {}
        for a in self.attempts(gen):
            if a.end_index is not None:
                ends.setdefault((a.step, a.rank // per, a.incarnation), {}).setdefault(
                    a.rank, a.end_index)
        out: dict[int, int] = {}
        for (step, _, _), by_rank in ends.items():
            if len(by_rank) == per:
                at = max(by_rank.values())
                out[step] = min(out.get(step, at), at)
        return out

    def replays(self, gen: int) -> list[Replay]:
        """A committed step the quorum executed again (membership mode; empty outside it): an
        attempt that ended a step committed before its incarnation started (a restarted group
        that trained from older state than the quorum's), or a second end of a step by the same
        incarnation."""
        if self.replica_groups is None:
            return []
        first = self._first_commits(gen)
        out, ended = [], set()
        for a in self.attempts(gen):
            if not a.ended:
                continue
            key = (a.rank, a.incarnation, a.step)
            if key in ended or (a.step in first and first[a.step] < a.start_index):
                out.append(Replay(a.gen, a.rank, a.incarnation, a.step, first.get(a.step, -1)))
            ended.add(key)
        return out

    def split_commits(self, gen: int) -> dict[int, dict[str, set[int]]]:
        """Steps that replica groups committed in different quorums (a split brain: each side
        went on with its own state): step -> quorum (as recorded) -> the groups; membership
        mode only, and only where the workload recorded its quorum (``quorum=``)."""
        if self.replica_groups is None:
            return {}
        per = self.replica_groups[1]
        by: dict[int, dict[str, set[int]]] = {}
        for a in self.attempts(gen):
            if a.ended and a.quorum is not None:
                by.setdefault(a.step, {}).setdefault(str(a.quorum), set()).add(a.rank // per)
        return {step: quorums for step, quorums in sorted(by.items()) if len(quorums) > 1}

    def reduced_steps(self, gen: int | None = None) -> frozenset[int]:
        """Committed steps (of ``gen``, else of any generation) some group ended in a quorum of
        fewer than all replica groups (``participants=`` recorded below the group count): a
        clean run never trains those."""
        if self.replica_groups is None:
            return frozenset()
        if gen is None:
            return frozenset().union(*(self.reduced_steps(g) for g in self.generations))
        groups = self.replica_groups[0]
        committed = self.committed(gen)
        return frozenset(a.step for a in self.attempts(gen) if a.ended and a.step in committed
                         and a.participants is not None and a.participants < groups)

    def end_times(self, gen: int, step: int) -> dict[int, float]:
        """rank -> when it ended the step in ``gen``."""
        return dict(self._ix.end_times.get((gen, step), {}))

    def metric(self, gen: int, step: int, name: str) -> dict[int, float]:
        """rank -> the sum of a number it recorded in the step (``s.record(tokens=...)``)."""
        out: dict[int, float] = {}
        for e in self._ix.records.get((gen, step), ()):
            if isinstance(e.get(name), (int, float)):
                out[int(e["rank"])] = out.get(int(e["rank"]), 0.0) + float(e[name])
        return out

    def has_tokens(self) -> bool:
        return any(e.get("tokens") is not None for recs in self._ix.records.values() for e in recs)

    def has_samples(self) -> bool:
        return any(e.get("samples") is not None for recs in self._ix.records.values() for e in recs)

    def checkpoints(self, kind: str | None = None, *, gen: int | None = None,
                    rank: int | None = None) -> list[Checkpoint]:
        """The ``"save"`` or ``"load"`` events (both when ``kind`` is None; of ``gen``, of
        ``rank``), in history order, with the ``seconds`` and ``bytes`` the workload recorded."""
        kinds = {Ev.CKPT_SAVE: "save", Ev.CKPT_LOAD: "load"}
        if kind is not None and kind not in kinds.values():
            raise KeyError(kind)
        return [Checkpoint(kind=kinds[e["ev"]], gen=int(e["gen"]), rank=int(e["rank"]),
                           step=int(e["step"]), digest=dict(e.get("digest") or {}),
                           expected=dict(e["expected"]) if e.get("expected") else None,
                           t=float(e.get("t", 0.0)), index=i, seconds=_opt_number(e.get("seconds")),
                           bytes=_opt_number(e.get("bytes")),
                           info={k: v for k, v in e.items() if k not in _CHECKPOINT_FIELDS})
                for i, e in self._ranked if e["ev"] in kinds and kind in (None, kinds[e["ev"]])
                and (gen is None or e["gen"] == gen) and (rank is None or e["rank"] == rank)]

    def memory(self) -> dict[int, RankMemory]:
        """Per rank: peak memory and headroom to the budget, over every generation."""
        peaks: dict[int, dict[str, Any]] = {}
        budget = self.scenario.memory_budget_bytes if self.scenario else None
        for e in self.events:
            if e["ev"] == "rss":
                m = peaks.setdefault(int(e["rank"]), {})
                m["peak"] = max(m.get("peak", 0), int(e["peak_bytes"]))
        for e in self.rank_events("memory"):
            m = peaks.setdefault(int(e["rank"]), {})
            m["device"] = max(m.get("device", 0), int(e["peak"]))
            if e.get("budget"):
                m["total"] = int(e["budget"])
        return {r: RankMemory(r, m.get("peak"), budget, m.get("device"), m.get("total"))
                for r, m in sorted(peaks.items())}

    def faults_fired(self) -> list[FaultFired]:
        return [FaultFired(gen=int(e["gen"]), rank=int(e["rank"]), step=int(e["step"]),
                           phase=str(e.get("phase", "")), kind=str(e.get("kind", "")),
                           id=_opt_int(e.get("id")), params=dict(e.get("params") or {}),
                           t=_opt_float(e.get("t")))
                for e in self.rank_events(Ev.FAULT)]


def _validate(e: Event, where: str) -> None:
    ev = e.get("ev")
    if not isinstance(ev, str):
        raise HistoryError(f"{where}: event has no 'ev' kind: {dict(e)!r}")
    if ev not in SUPERVISOR_EVENTS:
        for key in ("gen", "rank"):
            if not isinstance(e.get(key), int):
                raise HistoryError(f"{where}: {ev} event needs an integer {key!r}: {dict(e)!r}")
        if ev in STEP_EVENTS and not isinstance(e.get("step"), int):
            raise HistoryError(f"{where}: {ev} event needs an integer 'step': {dict(e)!r}")
    elif ev in ("gen_start", "gen_end", "detect", "deliver") and not isinstance(e.get("gen"), int):
        raise HistoryError(f"{where}: supervisor {ev} event needs an integer 'gen': {dict(e)!r}")


def _is_supervisor(e: Event) -> bool:
    return e["ev"] in SUPERVISOR_EVENTS


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _opt_number(v: Any) -> Any:
    """A number as recorded (an int stays an int, so what is computed from it does not change),
    else None."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _t(e: Event) -> float:
    return float(e.get("t", 0.0))


#: The fields of a checkpoint event that ``Checkpoint`` has its own attribute for.
_CHECKPOINT_FIELDS = frozenset({"ev", "t", "gen", "rank", "step", "digest", "expected", "seconds",
                                "bytes"})
