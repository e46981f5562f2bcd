"""Every event of a history, kept compact: a run of a thousand ranks records millions of events,
and a dict per event (300 bytes and more) would not fit in memory.

A rank's events of one generation are a ``RankStream``: the per-step kinds (``begin``, ``point``,
``record``, ``end``) as columns (their time and step in arrays, their other fields as recorded),
any other event as recorded. ``RankStream.event`` gives an event back exactly as it was read
(the same fields, in the same order, of the same types). ``Recorded`` holds the streams and the
supervisor's events, each event with its position in history order (by time, stable).
"""
from __future__ import annotations

import operator
import sys
import threading
from array import array
from itertools import compress, repeat
from typing import Any, Callable, Iterable, Iterator, Sequence

from pytest_reshard.contract import SUPERVISOR_EVENTS, Ev
from pytest_reshard.history.records import Event

__all__ = ["RankStream", "Recorded", "shape_table", "values_of", "OTHER", "BEGIN", "END", "POINT",
           "RECORD"]

#: A stream's kind codes: ``OTHER`` is an event kept as recorded.
OTHER, BEGIN, END, POINT, RECORD = range(5)
_CODES = {Ev.BEGIN.value: BEGIN, Ev.END.value: END, Ev.POINT.value: POINT,
          Ev.RECORD.value: RECORD}
_NAMES = {code: name for name, code in _CODES.items()}
_USUAL = frozenset({"t", "ev", "gen", "rank", "step"})   # the fields the columns hold
_INT64 = 1 << 63

#: The field orders seen (shared by every stream), and each one's fields beyond the usual ones.
_SHAPES: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
_SHAPE_IDS: dict[tuple[str, ...], int] = {}
#: Each field order's fields beyond the usual ones -> where in ``extra`` (-1: the one value).
_FIELD_AT: list[dict[str, int]] = []
#: Each field order's ``extra`` of an event: an ``itemgetter`` of its fields beyond the usual ones
#: (one field: its value; several: their tuple), so a whole file's are read in C.
_EXTRA_OF: list[Callable[[Event], Any]] = []
#: Held to add a field order: histories load on several threads at once (the session's
#: reference runs on a background one), and two new orders must not get the same id.
_SHAPES_LOCK = threading.Lock()


def _shape(keys: tuple[str, ...]) -> int:
    sid = _SHAPE_IDS.get(keys)   # the usual case, a known order: no lock
    if sid is None:
        with _SHAPES_LOCK:
            sid = _SHAPE_IDS.get(keys)
            if sid is None:   # the shape is in the table before its id is handed out
                more = tuple(k for k in keys if k not in _USUAL)
                _SHAPES.append((keys, more))
                _FIELD_AT.append({more[0]: -1} if len(more) == 1 else {k: i for i, k in enumerate(more)})
                _EXTRA_OF.append(operator.itemgetter(*more) if more else _no_extra)
                sid = _SHAPE_IDS[keys] = len(_SHAPES) - 1
    return sid


def _no_extra(e: Event) -> None:
    return None


_call = getattr(operator, "call", None) or (lambda f, x: f(x))   # Python 3.10 has no call


def values_of(events: Iterable[tuple["RankStream", int]], name: str) -> Iterator[tuple[int, Any]]:
    """``(rank, value)`` of field ``name`` of each ``(stream, position)`` event that has it:
    ``RankStream.value`` inlined, for a step's records of a thousand ranks."""
    if name in _USUAL:   # a column's, not a field's
        yield from ((s.rank, v) for s, p in events if (v := s.value(p, name)) is not None)
        return
    field_at = _FIELD_AT
    for s, p in events:
        if s.kind[p]:
            at = field_at[s.shape[p]].get(name)
            if at is not None:
                x = s.extra[p]
                yield s.rank, x if at < 0 else x[at]
        elif name in s.other[p]:
            yield s.rank, s.other[p][name]


def shape_table() -> list[tuple[str, ...]]:
    """The field orders seen in this process, by id (``Recorded.adopt`` maps another's)."""
    return [keys for keys, _ in _SHAPES]


class RankStream:
    """One rank's events in one generation, in history order (``index``: each one's position
    in the history). ``extra`` holds a compact event's fields beyond the usual ones: the one
    value (a loss, a phase, a list of samples), or a tuple of them."""

    __slots__ = ("gen", "rank", "index", "kind", "shape", "step", "t", "extra", "other")

    def __init__(self, gen: int, rank: int) -> None:
        self.gen, self.rank = gen, rank
        self.index = array("q")
        self.kind = bytearray()
        self.shape = array("I")   # a field order's id: more than 65,535 of them may be seen
        self.step = array("q")
        self.t = array("d")
        self.extra: list[Any] = []
        self.other: dict[int, Event] = {}

    def __len__(self) -> int:
        return len(self.kind)

    def add(self, e: Event) -> None:
        """Append a validated event of this rank and generation."""
        code = _CODES.get(e["ev"], OTHER) if type(e["ev"]) is str else OTHER
        t, step = e.get("t", 0.0), e["step"] if code else 0
        if code and type(t) is float and type(step) is int and -_INT64 <= step < _INT64 \
                and type(e["gen"]) is int and type(e["rank"]) is int:
            sid = _shape(tuple(e))
            if len(_SHAPES[sid][1]) <= 1:
                extra = e[_SHAPES[sid][1][0]] if _SHAPES[sid][1] else None
            else:
                extra = tuple(e[k] for k in _SHAPES[sid][1])
        else:
            code, sid, step, t, extra = OTHER, 0, 0, 0.0, None
            self.other[len(self.kind)] = e
        self.kind.append(code)
        self.shape.append(sid)
        self.step.append(step)
        self.t.append(t)
        self.extra.append(extra)

    def take(self, lines: Sequence[tuple[int, Event]],
             check: Callable[[Event], None]) -> list[tuple[int, str]]:
        """Append the events of this rank's file: ``(line number, event)`` pairs in file order.
        A well-formed per-step event of this rank goes straight into the columns; any other is
        appended only if ``check`` (which raises ``ValueError`` saying why) accepts it. Returns
        the ``(line number, why)`` of those it refused."""
        events = list(map(operator.itemgetter(1), lines))
        try:
            columns = self._columns(events)
        except (TypeError, KeyError):   # a kind or a field that is no JSON value of the contract
            columns = None
        if columns is None:   # a per-step event the columns cannot hold: one by one
            return self._take_each(lines, check)
        codes, sids, steps, times, extra = columns
        refused: list[tuple[int, str]] = []
        dropped: set[int] = set()
        others = list(compress(range(len(codes)), map(operator.not_, codes)))
        for i in others:
            try:
                check(events[i])
            except ValueError as err:
                refused.append((lines[i][0], str(err)))
                dropped.add(i)
        if dropped:
            keep = [i for i in range(len(events)) if i not in dropped]
            events, steps, times, extra = ([c[i] for i in keep] for c in (events, steps, times, extra))
            codes, sids = bytearray(codes[i] for i in keep), [sids[i] for i in keep]
            others = list(compress(range(len(codes)), map(operator.not_, codes)))
        base = len(self.kind)
        self.kind += codes
        self.shape.extend(array("I", sids))
        self.step.extend(array("q", steps))
        self.t.extend(array("d", times))
        self.extra += extra
        self.other.update((base + i, events[i]) for i in others)
        return refused

    def _columns(self, events: list[Event]) -> tuple[bytearray, list[Any], list[Any],
                                                       list[Any], list[Any]] | None:
        """The columns of a file's events (kind, shape id, step, time, extra; an event kept as
        recorded has ``OTHER``, 0, 0, 0.0, None), each built by one loop in C over the whole
        file (a rank of a long run records hundreds of thousands); None when a per-step event
        is not well formed or not of this rank and generation."""
        get: Callable[..., Any] = dict.get
        n = len(events)
        codes = bytearray(map(_CODES.get, map(get, events, repeat("ev")), repeat(OTHER)))
        steps: list[Any] = list(map(get, events, repeat("step"), repeat(0)))
        times: list[Any] = list(map(get, events, repeat("t"), repeat(0.0)))
        step_of = list(compress(steps, codes))
        for column, want in ((times, {float}), (step_of, {int})):
            if {*map(type, compress(column, codes))} - want:
                return None
        if step_of and (min(step_of) < -_INT64 or max(step_of) >= _INT64):
            return None
        for key, value in (("gen", self.gen), ("rank", self.rank)):
            mine = list(compress(map(get, events, repeat(key)), codes))
            if {*map(type, mine)} - {int} or {*mine} - {value}:
                return None
        sids: list[Any] = list(map(_SHAPE_IDS.get, map(tuple, events)))
        others = list(compress(range(n), map(operator.not_, codes)))
        for i in others:
            sids[i] = steps[i] = 0
            times[i] = 0.0
        for i in compress(range(n), map(operator.is_, sids, repeat(None))):
            sids[i] = _shape(tuple(events[i]))   # a field order not seen before
        extract = list(map(_EXTRA_OF.__getitem__, sids))
        for i in others:
            extract[i] = _no_extra
        # One object per distinct string (a phase, a role): millions of equal ones otherwise.
        intern = sys.intern
        extra = [intern(x) if type(x) is str else x for x in map(_call, extract, events)]
        return codes, sids, steps, times, extra

    def _take_each(self, lines: Sequence[tuple[int, Event]],
                   check: Callable[[Event], None]) -> list[tuple[int, str]]:
        """``take`` an event at a time: a file with a per-step event the columns cannot hold."""
        refused: list[tuple[int, str]] = []
        gen, rank, codes, shapes, ids = self.gen, self.rank, _CODES, _SHAPES, _SHAPE_IDS
        kind, shape, steps, times, extra = self.kind, self.shape, self.step, self.t, self.extra
        for lineno, e in lines:   # add()'s checks, inlined
            ev, t, step = e.get("ev"), e.get("t", 0.0), e.get("step")
            code = codes.get(ev, OTHER) if type(ev) is str else OTHER
            g, r = e.get("gen"), e.get("rank")
            if code and type(t) is float and type(step) is int and -_INT64 <= step < _INT64 \
                    and type(g) is int and type(r) is int and g == gen and r == rank:
                keys = tuple(e)
                sid = ids.get(keys)
                if sid is None:
                    sid = _shape(keys)
                more = shapes[sid][1]
                kind.append(code)
                shape.append(sid)
                steps.append(step)
                times.append(t)
                extra.append((e[more[0]] if more else None) if len(more) <= 1
                             else tuple(e[k] for k in more))
                continue
            try:
                check(e)
            except ValueError as err:
                refused.append((lineno, str(err)))
                continue
            self.add(e)
        return refused

    def steps_of(self, code: int) -> list[int]:
        """The steps of its events of one per-step kind (``BEGIN``, ``END``, ...), the columns'
        then those kept as recorded."""
        name = _NAMES[code]
        return [*compress(self.step, map(code.__eq__, self.kind)),
                *(int(e["step"]) for e in self.other.values() if e["ev"] == name)]

    def record_fields(self) -> set[str]:
        """The names its ``record`` events carry (``s.record(tokens=...)``): a name none of a
        history's streams carries needs no look at each of its millions of records."""
        names = {k for sid in set(compress(self.shape, map(RECORD.__eq__, self.kind)))
                 for k in _SHAPES[sid][1]}
        names.update(k for e in self.other.values() if e.get("ev") == Ev.RECORD for k in e)
        return names

    def fields(self, pos: int) -> dict[str, Any]:
        """A compact event's fields beyond the usual ones, by name."""
        names = _SHAPES[self.shape[pos]][1]
        x = self.extra[pos]
        return dict(zip(names, x)) if len(names) > 1 else {names[0]: x} if names else {}

    def value(self, pos: int, name: str, default: Any = None) -> Any:
        """One field of the event at ``pos`` (``default`` where it has none)."""
        if self.kind[pos] and name not in _USUAL:   # called millions of times: one lookup
            at = _FIELD_AT[self.shape[pos]].get(name)
            if at is None:
                return default
            return self.extra[pos] if at < 0 else self.extra[pos][at]
        return self.event(pos).get(name, default)

    def drawn(self, pos: int) -> tuple[Any, Any] | None:
        """``(samples, epoch)`` of the event at ``pos`` (epoch None where it has none), None
        where it has no samples: ``value`` of both in one lookup of the event's field order
        (``History.drawn`` asks it of every record of a run: millions at a thousand ranks)."""
        if not self.kind[pos]:
            e = self.event(pos)
            samples = e.get("samples")
            return None if samples is None else (samples, e.get("epoch"))
        at = _FIELD_AT[self.shape[pos]]
        i = at.get("samples")
        if i is None:
            return None
        x = self.extra[pos]
        if i < 0:   # its one field beyond the usual ones: no epoch
            return None if x is None else (x, None)
        j = at.get("epoch")
        return None if x[i] is None else (x[i], None if j is None else x[j])

    def event(self, pos: int) -> Event:
        """The event at ``pos`` as recorded."""
        code = self.kind[pos]
        if code == OTHER:
            return self.other[pos]
        usual = {"t": self.t[pos], "ev": _NAMES[code], "gen": self.gen, "rank": self.rank,
                 "step": self.step[pos]}
        more = self.fields(pos)
        return {k: usual[k] if k in usual else more[k] for k in _SHAPES[self.shape[pos]][0]}

    def events(self) -> Iterator[tuple[int, Event]]:
        """(position in the history, event) of each of its events, in order."""
        return ((self.index[p], self.event(p)) for p in range(len(self.kind)))

    def put_in_order(self) -> None:
        """Reorder it by ``index`` (its lines were not in time order)."""
        import numpy as np

        at = np.frombuffer(self.index, dtype=np.int64) if self.index else None
        if at is None or bool((at[1:] > at[:-1]).all()):   # the usual case: a file in time order
            return
        order = sorted(range(len(self.kind)), key=self.index.__getitem__)
        for name in ("index", "shape", "step", "t"):
            column = getattr(self, name)
            setattr(self, name, array(column.typecode, (column[p] for p in order)))
        self.kind = bytearray(self.kind[p] for p in order)
        self.extra = [self.extra[p] for p in order]
        where = {old: new for new, old in enumerate(order)}
        self.other = {where[p]: e for p, e in self.other.items()}


class Recorded:
    """A history's events: the supervisor's (as recorded) and each rank's stream, every event
    with its position in history order. Add them in any order with the time they are ordered
    by, then ``order``."""

    def __init__(self) -> None:
        self.supervisor: list[tuple[int, Event]] = []
        self.streams: dict[tuple[int, int], RankStream] = {}
        self._keys = array("d")     # each event's key, in the order added
        self.count = 0              # events in all, once ordered
        self._runs: list[list[Any]] = []   # [stream (None: the supervisor's), events] in that order

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, e: Event, key: float) -> None:
        """Append a validated event; ``key``: what history order sorts it by."""
        if e["ev"] in SUPERVISOR_EVENTS:
            s = None
            self.supervisor.append((0, e))
        else:
            s = self.stream(int(e["gen"]), int(e["rank"]))
            s.add(e)
        if self._runs and self._runs[-1][0] is s:
            self._runs[-1][1] += 1
        else:
            self._runs.append([s, 1])
        self._keys.append(key)

    def adopt(self, s: RankStream, shapes: Sequence[tuple[str, ...]] | None = None, *,
              shift: float = 0.0) -> None:
        """Append a stream built apart (``RankStream.take``), by this process or, with
        ``shapes`` (its ``shape_table()``, which its shape ids index), by another; ``shift``
        is added to its events' times to order them (their key)."""
        s.shape = self.own_shapes(s.shape, shapes)
        mine = self.streams.get((s.gen, s.rank))
        if mine is not None:   # a second file of one rank and generation (g01-r1, g1-r1)
            first = len(mine)
            for p in range(len(s)):
                mine.add(s.event(p))
            s = mine
        else:
            first = 0
            self.streams[(s.gen, s.rank)] = s
        if len(s) > first:
            keys = s.t[first:]   # each event's time: the column's, or an event kept whole's own
            for pos, e in s.other.items():
                if pos >= first:
                    keys[pos - first] = float(e.get("t", 0.0))
            self._runs.append([s, len(s) - first])
            if shift:
                import numpy as np

                keys = array("d", (np.frombuffer(keys, dtype=np.float64) + shift).tobytes())
            self._keys.extend(keys)

    @staticmethod
    def own_shapes(ids: array, shapes: Sequence[tuple[str, ...]] | None) -> array:
        """Shape ids of another process (``shapes``: its ``shape_table()``) as this one's."""
        if shapes is None:
            return ids
        mine = [_shape(keys) for keys in shapes]
        return ids if mine == list(range(len(mine))) else array("I", map(mine.__getitem__, ids))

    def stream(self, gen: int, rank: int) -> RankStream:
        s = self.streams.get((gen, rank))
        if s is None:
            s = self.streams[(gen, rank)] = RankStream(gen, rank)
        return s

    def order(self, *, by_key: bool) -> None:
        """Give every event its position in history order: sorted by key (stable), or
        ``by_key=False`` as added."""
        import numpy as np   # 17 M keys: 7 s sorted in Python, 1 s here

        n = self.count = len(self._keys)
        if by_key:
            order = np.argsort(np.frombuffer(self._keys, dtype=np.float64), kind="stable")
            self._keys = array("d")
            position = np.empty(n, dtype=np.int64)
            position[order] = np.arange(n, dtype=np.int64)
            del order
        else:
            position = np.arange(n, dtype=np.int64)
        sup = (e for _, e in self.supervisor)
        self.supervisor = []
        j = 0
        for s, count in self._runs:
            if s is None:
                self.supervisor += [(i, next(sup)) for i in position[j:j + count].tolist()]
            else:
                s.index.frombytes(position[j:j + count].tobytes())
            j += count
        self.supervisor.sort(key=lambda ie: ie[0])
        for s in self.streams.values():
            s.put_in_order()
        self._keys = array("d")
        self._runs = []
