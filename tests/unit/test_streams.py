"""``history.streams``: the compact event table shared by every history, including those loaded
at once on the session's background threads."""
from __future__ import annotations

import sys
import threading
from typing import Any

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
