"""``history.streams``: the compact event table shared by every history, including those loaded
at once on the session's background threads."""
from __future__ import annotations

import sys
import threading
from typing import Any

from hypothesis import given, settings, strategies as st

from pytest_reshard.contract import Ev
from pytest_reshard.history.streams import Recorded, RankStream


def _events(tag: str, n: int) -> list[dict[str, Any]]:
    """``n`` step records of one rank, each with a field order no other event has."""
    return [{"ev": Ev.RECORD.value, "step": i, f"{tag}_{i}": i, "t": float(i), "gen": 0,
             "rank": 0} for i in range(n)]


def test_two_threads_adding_new_field_orders_each_read_back_their_own_events() -> None:
    # Each new field order gets an id in a table every stream shares: two loads (the session's
    # reference runs load on a background thread) must never be handed each other's id.
    streams = {tag: RankStream(0, 0) for tag in ("a", "b")}
    wanted = {tag: _events(tag, 4000) for tag in streams}
    go = threading.Barrier(2)
    errors: list[BaseException] = []

    def load(tag: str) -> None:
        go.wait()
        try:
            for e in wanted[tag]:
                streams[tag].add(e)
        except BaseException as e:  # noqa: BLE001 - asserted below, in the test's thread
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # switch threads as often as CPython can
    try:
        threads = [threading.Thread(target=load, args=(tag,)) for tag in streams]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, f"adding events raised {errors[0]!r}"
    for tag, s in streams.items():
        assert len(s) == len(wanted[tag])
        got = [s.event(p) for p in range(len(s))]
        wrong = [(w, g) for w, g in zip(wanted[tag], got) if w != g]
        assert not wrong, f"{len(wrong)} events of {tag} read back wrong, first: {wrong[0]}"


def test_more_field_orders_than_a_uint16_counts() -> None:
    n = 70_000   # past 65,535: the shape ids must not overflow
    recorded = Recorded()
    events = _events("wide", n)
    stream = RankStream(0, 0)
    assert stream.take(list(enumerate(events, 1)), lambda e: None) == []
    recorded.adopt(stream)
    recorded.order(by_key=False)
    s = recorded.streams[(0, 0)]
    assert s.event(n - 1) == events[-1] and s.event(0) == events[0]


_KINDS = [   # what a rank's file may hold: per-step events the columns take, and others
    {"ev": "begin", "step": 3, "t": 1.5, "gen": 0, "rank": 0},
    {"ev": "point", "step": 3, "phase": "forward", "t": 1.6, "gen": 0, "rank": 0},
    {"ev": "record", "step": 3, "samples": [7, 8], "epoch": 0, "tokens": 96, "t": 1.7, "gen": 0,
     "rank": 0},
    {"ev": "record", "step": 3, "loss": 2.5, "lr": 1e-3, "t": 1.8, "gen": 0, "rank": 0},
    {"ev": "end", "step": 3, "t": 1.9, "gen": 0, "rank": 0},
    {"ev": "start", "world_size": 2, "t": 1.0, "gen": 0, "rank": 0},
    {"ev": "note", "what": "ready", "t": 1.1, "gen": 0, "rank": 0},
    {"ev": "gen_start", "gen": 0, "t": 1.2},                         # refused: not a rank's
]
_ODD = [   # per-step events the columns cannot hold: the file is taken one event at a time
    {"ev": "end", "step": 3, "t": 2, "gen": 0, "rank": 0},           # an integer time
    {"ev": "end", "step": 3, "t": 1.9, "gen": 0, "rank": 1},         # another rank's
    {"ev": "end", "step": 3, "t": 1.9, "gen": True, "rank": 0},      # a boolean generation
    {"ev": "end", "step": 1 << 64, "t": 1.9, "gen": 0, "rank": 0},   # past an int64
    {"ev": ["end"], "step": 3, "t": 1.9, "gen": 0, "rank": 0},       # an unhashable kind
]


def _refuse_supervisor(e: dict[str, Any]) -> None:
    if e["ev"] == "gen_start" or e.get("rank") != 0:
        raise ValueError("not this rank's")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_KINDS + _ODD), max_size=30))
def test_a_file_taken_in_columns_is_the_file_taken_event_by_event(picked) -> None:
    lines = [(i, dict(e)) for i, e in enumerate(picked, 1)]
    whole, each = RankStream(0, 0), RankStream(0, 0)
    refused = whole.take(lines, _refuse_supervisor)
    assert refused == each._take_each(lines, _refuse_supervisor)
    assert len(whole) == len(each)
    assert [whole.event(p) for p in range(len(whole))] == [each.event(p) for p in range(len(each))]
    for column in ("kind", "shape", "step", "t", "extra", "other"):
        assert getattr(whole, column) == getattr(each, column), column


def test_equal_strings_of_a_file_are_one_object() -> None:
    # A thousand ranks' points name a handful of phases millions of times: held once each.
    lines = [(i, {"ev": "point", "step": i, "phase": "".join(["for", "ward"]), "t": float(i),
                  "gen": 0, "rank": 0}) for i in range(3)]   # equal strings, each its own object
    assert lines[0][1]["phase"] is not lines[1][1]["phase"]
    s = RankStream(0, 0)
    s.take(lines, lambda e: None)
    assert s.extra[0] is s.extra[1] is s.extra[2]
