"""``History``: the merged events of one run, and the queries the checkers ask of them.

It is the only reader of raw events: it indexes them once and answers with the records of
``history.records``. The definitions (committed, kept, the resume step) are in the package's
docstring.
"""
from __future__ import annotations

import bisect
from array import array
from collections import Counter
from itertools import compress
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from pytest_reshard.contract import Cause, Damaged, Detected, Ev, MemberAction, RunDir, Torn
from pytest_reshard.history.loading import HistoryError, load_events, validate
from pytest_reshard.history.membership import MembershipQueries
from pytest_reshard.history.streams import (BEGIN, END, OTHER, POINT, RECORD, RankStream, Recorded,
                                            values_of)
from pytest_reshard.history.records import (Abort, Attempt, Checkpoint, Delivery, Detection,
                                            Devices, Event, FaultFired, FileEvent, Generation, Note,
                                            Occurrence, PowerLoss, RankMemory, RankRecord, RssSample,
                                            ScenarioRecord, Signal, StepError, StepSpan, Exit,
                                            Unfired, MemberEvent, _opt_float, _opt_int, _opt_number, _t,
                                            Begun, Saved, as_enum, decode, fault_fired,
                                            file_event, file_trail, LOAD, SAVE,
                                            SAVING, STATE)

__all__ = ["History"]


class _StepRecords:
    """The ``record`` events of one step of one generation, ``(stream, position)`` as iterated:
    two flat columns, not a tuple each (a thousand ranks' run has millions)."""

    __slots__ = ("streams", "positions")

    def __init__(self) -> None:
        self.streams: list[RankStream] = []
        self.positions = array("q")

    def add(self, s: RankStream, pos: int) -> None:
        self.streams.append(s)
        self.positions.append(pos)

    def __iter__(self) -> Iterator[tuple[RankStream, int]]:
        return zip(self.streams, self.positions)


def _draw(drawn: tuple[Any, Any]) -> tuple[int, list[int]]:
    """``(epoch, sample ids)`` of a record's ``RankStream.drawn`` (no epoch: 0)."""
    return int(drawn[1] or 0), list(map(int, drawn[0]))


@dataclass
class _Index:
    """The facts the checkers ask for by generation and step, built once from the streams."""

    end_times: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)
    ended: dict[int, set[int]] = field(default_factory=dict)     # gen -> steps some rank ended
    begun: dict[int, set[int]] = field(default_factory=dict)     # gen -> steps some rank began
    records: dict[tuple[int, int], _StepRecords] = field(default_factory=dict)
    starts: dict[int, dict[int, Event]] = field(default_factory=dict)
    resumed: dict[int, dict[int, Event]] = field(default_factory=dict)
    ranks_seen: dict[int, set[int]] = field(default_factory=dict)
    #: The rank events kept as recorded (every kind but the per-step ones), by kind, in order.
    kept: dict[str, list[tuple[int, Event]]] = field(default_factory=dict)


class History(MembershipQueries):
    """The merged, typed events of one run. Build with ``load`` or ``from_events``."""

    def __init__(self, events: Sequence[Event] | Recorded, *, torn: Sequence[Torn] = (),
                 damaged: Sequence[Damaged] = (), run_dir: Path | None = None) -> None:
        self._events: tuple[Event, ...] | None = None
        if isinstance(events, Recorded):   # loaded: validated, in history order
            recorded = events
        else:
            recorded = Recorded()
            self._events = tuple(events)
            for i, e in enumerate(self._events):
                try:
                    validate(e)
                except HistoryError as err:
                    raise HistoryError(f"event #{i}: {err}") from None
                recorded.add(e, 0.0)
            recorded.order(by_key=False)
        self.torn: tuple[Torn, ...] = tuple(torn)
        #: Lines of the run folder's event files that are not what was written (left out): a
        #: history with any is not judged (every checker says unknown, naming the first).
        self.damaged: tuple[Damaged, ...] = tuple(damaged)
        #: The run folder it was loaded from (its logs, for messages), None when built in memory.
        self.run_dir = run_dir
        self._count = recorded.count
        self._supervisor_at = recorded.supervisor
        self._supervisor: list[Event] = [e for _, e in recorded.supervisor]
        self._streams = recorded.streams
        self._ranked_cache: list[tuple[int, Event]] | None = None
        self._ix = _Index()
        for key in sorted(self._streams):   # each step's records by rank (``drawn_in``)
            self._index_stream(self._streams[key])
        for kind in self._ix.kept.values():
            kind.sort(key=lambda ie: ie[0])
        self.scenario = self._scenario()
        self.generations: dict[int, Generation] = self._generations()
        groups = [e for e in self._supervisor
                  if e["ev"] == Ev.MEMBER and e.get("action") == MemberAction.GROUPS]
        #: Membership mode: (replica groups, ranks per group); None outside it.
        self.replica_groups: tuple[int, int] | None = \
            (int(groups[0]["groups"]), int(groups[0]["per"])) if groups else None
        self._attempts: list[Attempt] | None = None
        self._by_step: dict[tuple[int, int], list[Attempt]] | None = None
        self._kept: list[Occurrence] | None = None
        self._record_fields: frozenset[str] | None = None

    @property
    def events(self) -> tuple[Event, ...]:
        """Every event, in history order (built on first use: a large history keeps its rank
        events compact)."""
        if self._events is None:
            out: list[Any] = [None] * self._count
            for i, e in [*self._supervisor_at, *self._ranked]:
                out[i] = e
            self._events = tuple(out)
        return self._events

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_events(cls, events: Iterable[Event]) -> "History":
        """A history from event dicts, in order (supervisor events are told apart by ``ev``)."""
        return cls([dict(e) for e in events])

    @classmethod
    def load(cls, run_dir: "str | Path | RunDir") -> "History":
        """Read ``run_dir/events/*.jsonl`` (or ``run_dir/*.jsonl``), tolerating torn last lines
        and keeping damaged ones out (``damaged``)."""
        events, torn, damaged, root = load_events(run_dir)
        return cls(events, torn=torn, damaged=damaged, run_dir=root)

    def _index_stream(self, s: RankStream) -> None:
        """One pass over a rank's stream, in its order (the history's)."""
        ix = self._ix
        gen, rank = s.gen, s.rank
        ix.ranks_seen.setdefault(gen, set()).add(rank)
        if any(e["ev"] in _STEP_KINDS for e in s.other.values()):
            self._index_in_order(s)   # a per-step event kept as recorded: one loop keeps the order
            return
        for pos in sorted(s.other):
            self._index_other(s, s.other[pos], pos)
        # the per-step events, a column at a time (the loops over every event run in C)
        steps, kinds = s.step, s.kind
        ix.begun.setdefault(gen, set()).update(compress(steps, map(BEGIN.__eq__, kinds)))
        ended = list(compress(range(len(kinds)), map(END.__eq__, kinds)))
        ix.ended.setdefault(gen, set()).update(steps[pos] for pos in ended)
        end_times, records, times = ix.end_times, ix.records, s.t
        for pos in ended:
            end_times.setdefault((gen, steps[pos]), {})[rank] = times[pos]
        for pos in compress(range(len(kinds)), map(RECORD.__eq__, kinds)):
            at = records.get((gen, steps[pos]))
            if at is None:
                at = records[(gen, steps[pos])] = _StepRecords()
            at.streams.append(s)   # add(), inlined: millions of records
            at.positions.append(pos)

    def _index_other(self, s: RankStream, e: Event, pos: int) -> None:
        """An event kept as recorded (not a per-step one)."""
        ix, ev = self._ix, e["ev"]
        if ev not in _STEP_KINDS:
            ix.kept.setdefault(ev, []).append((s.index[pos], e))
        if ev == Ev.START:
            ix.starts.setdefault(s.gen, {})[s.rank] = e
        elif ev == Ev.RESUMED:
            ix.resumed.setdefault(s.gen, {}).setdefault(s.rank, e)

    def _index_in_order(self, s: RankStream) -> None:
        ix = self._ix
        gen, rank = s.gen, s.rank
        begun, ended = ix.begun.setdefault(gen, set()), ix.ended.setdefault(gen, set())
        end_times, records = ix.end_times, ix.records
        for pos, (code, step) in enumerate(zip(s.kind, s.step)):
            if code == OTHER:
                e = s.other[pos]
                self._index_other(s, e, pos)
                if e["ev"] in _STEP_KINDS:
                    code, step = _STEP_KINDS[e["ev"]], int(e["step"])
            if code == BEGIN:
                begun.add(step)
            elif code == END:
                ended.add(step)
                end_times.setdefault((gen, step), {})[rank] = _t(s.event(pos)) \
                    if pos in s.other else s.t[pos]
            elif code == RECORD:
                records.setdefault((gen, step), _StepRecords()).add(s, pos)

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
                begun = ix.begun.get(gen)
                resume, declared, source = (min(begun) if begun else None), False, None
            fault_id = end.get("fault_id")
            gens[gen] = Generation(
                gen=gen, world_size=int(world), roles=roles, launcher=start.get("launcher"),
                resume_step=resume, resume_declared=declared, resume_source=source,
                cause=as_enum(Cause, end.get("cause")) if end.get("cause") is not None else None,
                planned=bool(end.get("planned", False)),
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

    def replaced(self, gen: int) -> int | None:
        """The rank of generation ``gen`` whose process a migration replaced in the next one
        (the empty slot of its survivors), or None."""
        for e in self.supervisor_events(Ev.GEN_START, gen=gen + 1):
            survivors = e.get("survivors") or []
            if e.get("by") == "migration" and None in survivors:
                return survivors.index(None)
        return None

    def detections(self) -> list[Detection]:
        return [Detection(gen=int(e["gen"]), kind=as_enum(Detected, str(e.get("kind", ""))),
                          rank=_opt_int(e.get("rank")),
                          step=_opt_int(e.get("step")), phase=e.get("phase"),
                          exit_code=_opt_int(e.get("exit_code")),
                          latency_s=e.get("latency_s"), expected=bool(e.get("expected", False)),
                          detail=str(e.get("detail", "")), t=_opt_float(e.get("t")))
                for e in self._supervisor if e["ev"] == Ev.DETECT]

    def unfired(self) -> list[Unfired]:
        """The scheduled faults that never fired."""
        return [Unfired(e.get("fault_id"), e.get("detail"), _opt_float(e.get("t")))
                for e in self._supervisor if e["ev"] == Ev.UNFIRED]

    def aborts(self) -> list[Abort]:
        """The supervisor's reasons for giving up on the run."""
        return [Abort(e.get("detail"), _opt_float(e.get("t")))
                for e in self._supervisor if e["ev"] == Ev.ABORT]

    def hub_kept_out(self) -> tuple[list[str], list[str]]:
        """What the harness's hub kept out of this history (``Ev.HUB``), in words: the
        connections it refused ("3 connections refused: bad credentials, from 10.77.3.2"), and
        the lines of peers that had passed its challenge that it dropped (the history lacks
        those)."""
        refused: list[str] = []
        dropped: list[str] = []
        for e in self.supervisor_events(Ev.HUB):
            for g in e.get("refused") or []:
                n = int(g["count"])
                refused.append(f"{n} connection{'s' if n != 1 else ''} refused: {g['reason']}, "
                               f"from {', '.join(map(str, g['hosts']))}")
            for g in e.get("dropped") or []:
                n = int(g["count"])
                dropped.append(f"{n} line{'s' if n != 1 else ''} of {g.get('peer', 'a peer')} "
                               f"(from {', '.join(map(str, g['hosts']))}) dropped: {g['reason']}")
        return refused, dropped

    def deliveries(self) -> list[Delivery]:
        """The planned faults a scheduler delivered (SLURM's scancel)."""
        return [Delivery(int(e["gen"]), e.get("fault_id"), e.get("kind"), e.get("grace_s"),
                         _opt_float(e.get("t")))
                for e in self._supervisor if e["ev"] == Ev.DELIVER]

    def devices(self) -> dict[int, Devices]:
        """Each generation's device classes, in a heterogeneous world (else empty)."""
        return {int(e["gen"]): Devices(int(e["gen"]), tuple(e["classes"]),
                                       tuple(float(s) for s in e["speeds"]), str(e["mode"]),
                                       str(e.get("why") or ""), _opt_float(e.get("period_s")))
                for e in self._supervisor if e["ev"] == Ev.DEVICES}

    def power_losses(self) -> list[PowerLoss]:
        """What each power loss took, in history order."""
        return [PowerLoss(int(e["gen"]), tuple(tuple(r) for r in e.get("renames_undone") or ()),
                          tuple(e.get("removed") or ()), dict(e.get("cut") or {}),
                          dict(e.get("reasons") or {}), tuple(e.get("not_judged") or ()),
                          tuple(e.get("problems") or ()), _opt_float(e.get("t")))
                for e in self._supervisor if e["ev"] == Ev.POWER_LOSS]

    def rss(self) -> list[RssSample]:
        """The supervisor's peak-RSS samples, in history order."""
        return [RssSample(e.get("gen"), int(e["rank"]), e["peak_bytes"], e.get("budget_bytes"),
                          _opt_float(e.get("t")))
                for e in self._supervisor if e["ev"] == Ev.RSS]

    def member_events(self, action: MemberAction | str | None = None, *,
                      gen: int | None = None) -> list[MemberEvent]:
        """The supervisor's membership records (of ``action``, of ``gen``), in history order."""
        return [MemberEvent(as_enum(MemberAction, e.get("action")), e.get("gen"), dict(e),
                            _opt_float(e.get("t")))
                for e in self.supervisor_events(Ev.MEMBER, gen=gen)
                if action is None or e.get("action") == action]

    # -- the run as a whole ---------------------------------------------------------------
    def never_started(self) -> str | None:
        """Why no rank of any generation began a step, in words; None when some rank began one.

        A run that never began a step has nothing for the checkers to judge: they say
        ``unknown`` with this reason, and liveness says what went wrong (once)."""
        if any(self.begun(g) for g in self.generations):
            return None
        if not self.generations:
            return "the run never started: no rank recorded anything"
        attached = any(self.starts(g) for g in self.generations)
        how = ("ranks attached (probe.attach()) but none began a step" if attached else
               "no rank called probe.attach()")
        return f"the run never started: {how}, so there is nothing to compare (see liveness)"

    def finished(self) -> bool:
        """The run's final generation ended complete (its last step ran): the test a clean run
        must pass to be kept or recorded from."""
        final = self.final_generation
        return final is not None and final.cause == Cause.COMPLETE

    def target_step(self) -> int | None:
        """The last step the scenario asked for (None: no scenario record)."""
        return self.scenario.steps - 1 if self.scenario else None

    def reached_target(self) -> bool:
        """The final generation committed the target step, or resumed past it with that step
        kept from before. False without a scenario record or a generation."""
        final, target = self.final_generation, self.target_step()
        if final is None or target is None:
            return False
        carried = (final.resume_step is not None and final.resume_step > target
                   and any(o.step == target for o in self.kept()))
        return target < 0 or target in self.committed(final.gen) or carried

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
    @property
    def _ranked(self) -> list[tuple[int, Event]]:
        """(position, event) of every rank event, in history order (built on first use)."""
        if self._ranked_cache is None:
            self._ranked_cache = self._from_streams(self._streams.values())
        return self._ranked_cache

    def _from_streams(self, streams: Iterable[RankStream], ev: str | None = None
                      ) -> list[tuple[int, Event]]:
        """(position, event) of the events of ``streams`` (of kind ``ev``), in history order."""
        code = _STEP_KINDS.get(ev) if ev is not None else None
        out = [(s.index[p], s.event(p)) for s in streams for p in range(len(s))
               if ev is None or s.kind[p] == code or (s.kind[p] == OTHER and s.other[p]["ev"] == ev)]
        out.sort(key=lambda ie: ie[0])
        return out

    def _kept_kind(self, *kinds: str) -> list[tuple[int, Event]]:
        """(position, event) of the rank events of ``kinds`` (none of the per-step kinds), in
        history order."""
        if len(kinds) == 1:
            return self._ix.kept.get(kinds[0], [])
        out = [ie for k in kinds for ie in self._ix.kept.get(k, ())]
        out.sort(key=lambda ie: ie[0])
        return out

    def rank_events(self, ev: str | None = None, *, gen: int | None = None,
                    rank: int | None = None) -> list[Event]:
        if ev is not None and ev not in _STEP_KINDS:
            return [e for _, e in self._kept_kind(ev) if (gen is None or e["gen"] == gen)
                    and (rank is None or e["rank"] == rank)]
        if gen is None and rank is None and ev is None:
            return [e for _, e in self._ranked]
        streams = [s for (g, r), s in self._streams.items()
                   if (gen is None or g == gen) and (rank is None or r == rank)]
        return [e for _, e in self._from_streams(streams, ev)]

    def file_events(self, *, gen: int | None = None) -> list[FileEvent]:
        """The ranks' file events (``filewatch``), every rank's in the order they happened."""
        return [file_event(e) for e in self.rank_events(Ev.FILE, gen=gen)]

    def file_trail(self, *, gen: int | None = None) -> list[FileEvent | Saved]:
        """The file events and the completed-save records (of ``gen``), in history order: what
        the file checks read."""
        return [r for r in file_trail(e for _, e in self._kept_kind(Ev.FILE, Ev.CKPT_SAVE)
                                      if gen is None or e["gen"] == gen)
                if not isinstance(r, Begun)]

    def timeline(self, *, gen: int | None = None, rank: int | None = None) -> list[RankRecord]:
        """The ranks' events (of ``gen``, of ``rank``) as records, in history order; the kinds
        without a record of their own (``record``, ``notice``, ...) are left out."""
        out = []
        for e in self.rank_events(gen=gen, rank=rank):
            r = decode(e)
            if r is not None:
                out.append(r)
        return out

    def _decoded(self, ev: Ev, gen: int | None, rank: int | None) -> list[Any]:
        return [decode(e) for e in self.rank_events(ev, gen=gen, rank=rank)]

    def signals(self, *, gen: int | None = None, rank: int | None = None) -> list[Signal]:
        return self._decoded(Ev.SIGNAL, gen, rank)

    def exits(self, *, gen: int | None = None, rank: int | None = None) -> list[Exit]:
        return self._decoded(Ev.EXIT, gen, rank)

    def errors(self, *, gen: int | None = None, rank: int | None = None) -> list[StepError]:
        return self._decoded(Ev.ERROR, gen, rank)

    def notes(self, what: str | None = None, *, gen: int | None = None) -> list[Note]:
        """The ranks' notes (named ``what``), in history order."""
        return [r for r in self._decoded(Ev.NOTE, gen, None) if what is None or r.what == what]

    def marked_phases(self) -> set[Any]:
        """Every fault point a rank marked (``s.point(phase)``)."""
        return {e.get("phase") for e in self.rank_events(Ev.POINT)}

    def records(self) -> list[tuple[Occurrence, Mapping[str, Any]]]:
        """Each ``record`` event with its occurrence, in history order (the workload's own
        fields: loss, samples, epoch, tokens, ...)."""
        return [(Occurrence(int(e["step"]), int(e["gen"])), e) for e in self.rank_events(Ev.RECORD)]

    def began_since_start(self, gen: int, rank: int, index: int) -> bool:
        """``rank`` began a step in ``gen`` after its latest ``start`` before event ``index``
        (a rank's file may hold several incarnations, in membership mode) and before it."""
        s = self._streams.get((gen, rank))
        if s is None:
            return False
        for p in range(bisect.bisect_left(s.index, index) - 1, -1, -1):  # back from index
            code = s.kind[p]
            ev = s.other[p]["ev"] if code == OTHER else None
            if code == BEGIN or ev == Ev.BEGIN:
                return True
            if ev == Ev.START:
                return False
        return False

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

    def event_times(self) -> list[float]:
        """When every event that carries a time happened, in history order."""
        return [float(e["t"]) for e in self.events if "t" in e]

    def times(self, ev: str | None, *, gen: int | None = None, rank: int | None = None) -> list[float]:
        """When the rank events of kind ``ev`` (of ``gen``, of ``rank``) happened, in history
        order (an event without a time counts as 0)."""
        if ev is None and gen is not None and rank is not None:   # one stream, from its columns
            s = self._streams.get((gen, rank))
            if s is None:
                return []
            out = s.t.tolist()
            for p, e in s.other.items():
                out[p] = _t(e)
            return out
        return [_t(e) for e in self.rank_events(ev, gen=gen, rank=rank)]

    def step_spans(self, *, gen: int | None = None, rank: int | None = None) -> list[StepSpan]:
        """Each rank's steps from ``begin`` to ``end`` (of ``gen``, of ``rank``), ordered by
        generation, rank and begin time. A step begun and never ended has ``end_t`` None; a step
        begun twice on a rank spans from its last ``begin``; an ``end`` with no open ``begin``
        makes no span."""
        done: list[StepSpan] = []
        open_: dict[tuple[int, int], dict[int, float]] = {}
        if gen is not None and rank is not None:   # one stream: looked up, not searched for
            streams = [((gen, rank), self._streams[(gen, rank)])] if (gen, rank) in self._streams else []
        else:
            streams = [(key, s) for key, s in self._streams.items()
                       if (gen is None or key[0] == gen) and (rank is None or key[1] == rank)]
        for key, s in streams:    # a rank's spans depend on its events alone
            for p, (code, step, t) in enumerate(zip(s.kind, s.step, s.t)):
                if code == OTHER:
                    e = s.other[p]
                    code, t = _STEP_KINDS.get(e["ev"], OTHER), _t(e)
                    step = int(e["step"]) if code != OTHER else 0
                if code == BEGIN:
                    open_.setdefault(key, {})[int(step)] = t  # validated: an int
                elif code == END and step in open_.get(key, {}):
                    done.append(StepSpan(key[0], key[1], int(step), open_[key].pop(step), t))
        unfinished = [StepSpan(g, r, s, t0, None) for (g, r), steps in open_.items()
                      for s, t0 in steps.items()]
        return sorted(done + unfinished, key=lambda x: (x.gen, x.rank, x.begin_t))

    def begun_again(self, gen: int) -> list[tuple[int, int]]:
        """(rank, step) of each step a rank of ``gen`` began more than once, in order."""
        out: list[tuple[int, int]] = []
        for (g, rank), s in self._streams.items():
            if g != gen:
                continue
            steps = s.steps_of(BEGIN)
            if len(steps) != len(set(steps)):
                out += [(rank, x) for x, n in Counter(steps).items() if n > 1]
        return sorted(out)

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
        return frozenset(self._ix.end_times.get((gen, step), ()))

    def begun(self, gen: int) -> frozenset[int]:
        return frozenset(self._ix.begun.get(gen, ()))

    def ended(self, gen: int | None = None) -> frozenset[int]:
        """Steps at least one rank ended (in ``gen``, or in any generation)."""
        if gen is None:
            return frozenset().union(*self._ix.ended.values())
        return frozenset(self._ix.ended.get(gen, ()))

    def committed(self, gen: int) -> frozenset[int]:
        """Steps every rank of ``gen``'s world size ended (membership mode: every rank of at
        least one replica group)."""
        if self.replica_groups is not None:
            return frozenset(self._first_commits(gen))
        world = set(range(self.generations[gen].world_size)) if gen in self.generations else set()
        return frozenset(s for s in self._ix.ended.get(gen, ())
                         if world and world <= self._ix.end_times[(gen, s)].keys())

    def kept(self) -> list[Occurrence]:
        """Occurrences whose effect persisted into the final state (see the module docstring)."""
        if self._kept is None:
            self._kept = self._find_kept()
        return list(self._kept)

    def _find_kept(self) -> list[Occurrence]:
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
        lowest, out = None, None
        for s, p in self._ix.records.get((gen, step), ()):
            if lowest is not None and s.rank > lowest:
                continue   # a thousand ranks record; rank 0's loss is read, not the others'
            loss = s.value(p, "loss")
            if loss is not None:
                lowest, out = s.rank, float(loss)
        return out

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
        return {rank: [(epoch, x) for epoch, ids in drawn for x in ids]
                for rank, drawn in self.drawn(gen, step).items()}

    def drawn(self, gen: int, step: int) -> dict[int, list[tuple[int, list[int]]]]:
        """``samples`` grouped: rank -> (epoch, sample ids) of each record, in order; no pair
        is built per sample (a thousand ranks' run holds millions)."""
        out: dict[int, list[tuple[int, list[int]]]] = {}
        if self.replica_groups is not None:
            for a in self._attempts_of(gen, step):  # a zeroed gradient trained nothing
                if a.ended and a.samples and a.participating is not False:
                    groups = out.setdefault(a.rank, [])
                    for epoch, x in a.samples:
                        if groups and groups[-1][0] == epoch:
                            groups[-1][1].append(x)
                        else:
                            groups.append((epoch, [x]))
            return out
        first: dict[int, int] = {}   # rank -> its first record's position: ranks in history order
        for s, p in self._ix.records.get((gen, step), ()):
            drawn = s.drawn(p)
            if drawn is not None:
                out.setdefault(s.rank, []).append(_draw(drawn))
                first.setdefault(s.rank, s.index[p])
        if len(out) > 1 and list(first.values()) != sorted(first.values()):
            out = {r: out[r] for r in sorted(out, key=first.__getitem__)}
        return out

    def drawn_in(self, occurrences: Sequence[Occurrence]) -> Iterator[
            tuple[int, int, list[tuple[int, list[int]]]]]:
        """``(i, rank, drawn)`` of each rank that drew samples in ``occurrences[i]``, ``drawn``
        as ``drawn`` gives it, occurrences in the order given, ranks in order: many
        occurrences' at once, without a dictionary each (a thousand ranks' run has millions
        of rank-steps)."""
        if self.replica_groups is not None:
            for i, occ in enumerate(occurrences):
                for rank, drawn in sorted(self.drawn(occ.gen, occ.step).items()):
                    yield i, rank, drawn
            return
        records = self._ix.records
        for i, occ in enumerate(occurrences):
            groups: list[tuple[int, list[int]]] = []
            rank = -1
            for s, p in records.get((occ.gen, occ.step), ()):   # by rank (the index's order)
                got = s.drawn(p)
                if got is None:
                    continue
                if s.rank != rank:
                    if groups:
                        yield i, rank, groups
                    groups, rank = [], s.rank
                groups.append(_draw(got))
            if groups:
                yield i, rank, groups

    def kept_samples(self) -> dict[Occurrence, frozenset[tuple[int, int]]]:
        """occurrence -> the union over ranks of its (epoch, sample id) pairs."""
        return {occ: frozenset(p for pairs in self.samples(occ.gen, occ.step).values()
                               for p in pairs) for occ in self.kept()}

    def end_times(self, gen: int, step: int) -> dict[int, float]:
        """rank -> when it ended the step in ``gen``, by rank."""
        return dict(sorted(self._ix.end_times.get((gen, step), {}).items()))

    def metric(self, gen: int, step: int, name: str) -> dict[int, float]:
        """rank -> the sum of a number it recorded in the step (``s.record(tokens=...)``), by
        rank."""
        out: dict[int, float] = {}
        if not self.recorded(name):
            return out
        for rank, value in values_of(self._ix.records.get((gen, step), ()), name):
            if isinstance(value, (int, float)):
                out[rank] = out.get(rank, 0.0) + float(value)
        return dict(sorted(out.items()))

    def recorded(self, name: str) -> bool:
        """Whether any rank's ``record`` events carry ``name`` (a value, or None)."""
        if self._record_fields is None:
            self._record_fields = frozenset().union(
                *(s.record_fields() for s in self._streams.values()))
        return name in self._record_fields

    def has_tokens(self) -> bool:
        return self.recorded("tokens") and any(
            s.value(p, "tokens") is not None for recs in self._ix.records.values() for s, p in recs)

    def has_samples(self) -> bool:
        return self.recorded("samples") and any(
            s.value(p, "samples") is not None for recs in self._ix.records.values() for s, p in recs)

    def checkpoints(self, kind: str | None = None, *, gen: int | None = None,
                    rank: int | None = None) -> list[Checkpoint]:
        """The ``"save"`` or ``"load"`` events (both when ``kind`` is None; of ``gen``, of
        ``rank``), in history order, with the ``seconds`` and ``bytes`` the workload recorded;
        ``"saving"``: a rank's record that it began writing its part of a save; ``"state"``: the
        live state after a step."""
        kinds = {Ev.CKPT_SAVING: SAVING, Ev.CKPT_SAVE: SAVE, Ev.CKPT_LOAD: LOAD, Ev.STATE: STATE}
        if kind is not None and kind not in kinds.values():
            raise KeyError(kind)
        if kind is None:
            kinds.pop(Ev.CKPT_SAVING)
            kinds.pop(Ev.STATE)
        return [Checkpoint(kind=kinds[e["ev"]], gen=int(e["gen"]), rank=int(e["rank"]),
                           step=int(e["step"]), digest=dict(e.get("digest") or {}),
                           expected=dict(e["expected"]) if e.get("expected") else None,
                           t=float(e.get("t", 0.0)), index=i, seconds=_opt_number(e.get("seconds")),
                           bytes=_opt_number(e.get("bytes")),
                           info={k: v for k, v in e.items() if k not in _CHECKPOINT_FIELDS})
                for i, e in self._kept_kind(*kinds) if kind in (None, kinds[e["ev"]])
                and (gen is None or e["gen"] == gen) and (rank is None or e["rank"] == rank)]

    def memory(self) -> dict[int, RankMemory]:
        """Per rank: peak memory and headroom to the budget, over every generation."""
        peaks: dict[int, dict[str, Any]] = {}
        budget = self.scenario.memory_budget_bytes if self.scenario else None
        for e in self._supervisor:
            if e["ev"] == Ev.RSS:
                m = peaks.setdefault(int(e["rank"]), {})
                m["peak"] = max(m.get("peak", 0), int(e["peak_bytes"]))
        for e in self.rank_events(Ev.MEMORY):
            m = peaks.setdefault(int(e["rank"]), {})
            m["device"] = max(m.get("device", 0), int(e["peak"]))
            if isinstance(e.get("reserved"), int):
                m["reserved"] = max(m.get("reserved", 0), e["reserved"])
            if e.get("budget"):
                m["total"] = int(e["budget"])
        for e in self.rank_events(Ev.EXIT):
            sets = e.get("memory")
            if not isinstance(sets, dict):
                continue
            m = peaks.setdefault(int(e["rank"]), {})
            for key in ("uss", "pss"):
                if isinstance(sets.get(key), int):
                    m[key] = max(m.get(key, 0), sets[key])
        return {r: RankMemory(r, m.get("peak"), budget, m.get("device"), m.get("total"),
                              m.get("uss"), m.get("pss"), m.get("reserved"))
                for r, m in sorted(peaks.items())}

    def faults_fired(self) -> list[FaultFired]:
        return [fault_fired(e) for e in self.rank_events(Ev.FAULT)]



#: The per-step kinds, which a stream keeps as columns where it can, and their codes.
_STEP_KINDS = {Ev.BEGIN.value: BEGIN, Ev.END.value: END, Ev.POINT.value: POINT,
               Ev.RECORD.value: RECORD}


#: The fields of a checkpoint event that ``Checkpoint`` has its own attribute for.
_CHECKPOINT_FIELDS = frozenset({"ev", "t", "gen", "rank", "step", "digest", "expected", "seconds",
                                "bytes"})
