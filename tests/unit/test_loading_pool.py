"""A big history is parsed by a pool of forked processes: it must load exactly as one parsed here,
field orders the pool's processes saw first, damaged and torn lines included."""
from __future__ import annotations

from pathlib import Path

import pytest

from ..histories import reshard_run
from .test_recorded import crash_and_resume
from pytest_reshard.checkers import CheckContext, run_all
from pytest_reshard.contract import encode_event
from pytest_reshard.history import History, loading
from pytest_reshard.history.recorded import load_recorded


def _folder(tmp_path: Path) -> Path:
    folder = reshard_run(steps=10, at=6).write(tmp_path)
    g1 = folder / "events" / "g1-r1.jsonl"
    lines = g1.read_bytes().splitlines(keepends=True)
    # a field order no other event has (a new shape id in whichever process parses it first),
    # a line changed after it was written, and a torn last line
    odd = encode_event({"t": 1e9, "ev": "record", "gen": 1, "rank": 1, "step": 7,
                        "never_seen_before": [1, 2]})
    bad = lines[3].replace(b'"rank":1', b'"rank":0')
    g1.write_bytes(b"".join([*lines[:3], odd, bad, *lines[4:], lines[-1][:-9]]))
    return folder


def _everything(h: History) -> tuple:
    return (list(h.events), sorted(map(repr, h.damaged)), sorted(map(repr, h.torn)),
            {k: v.status for k, v in run_all(CheckContext(h)).items()})


def _in_the_pool(m: pytest.MonkeyPatch) -> list[int]:
    """Every load parses in the pool (two CPUs, no size floor); returns the pools started."""
    pools: list[int] = []
    real = loading.ProcessPoolExecutor
    m.setattr(loading, "PARALLEL_BYTES", 0)
    m.setattr(loading.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    m.setattr(loading.threading, "active_count", lambda: 1)   # pytest may run other threads
    m.setattr(loading, "ProcessPoolExecutor", lambda *a, **k: pools.append(1) or real(*a, **k))
    return pools


def test_a_history_parsed_by_the_pool_is_the_one_parsed_here(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    here = History.load(folder)
    assert here.damaged and here.torn, "the planted damage must be seen"
    with pytest.MonkeyPatch.context() as m:
        pools = _in_the_pool(m)
        apart = History.load(folder)
    assert pools, "the pool was not used"
    assert _everything(apart) == _everything(here)


def test_a_recording_parsed_by_the_pool_is_the_one_parsed_here(tmp_path: Path) -> None:
    crash_and_resume(tmp_path / "replay", resume=0)   # a replay from step 0: no_rewind fails
    damaged = tmp_path / "damaged"
    crash_and_resume(damaged, resume=3)
    rec = sorted(damaged.glob("rec-r1-*.jsonl"))[-1]
    lines = rec.read_bytes().splitlines(keepends=True)
    rec.write_bytes(b"".join([*lines[:-2], lines[-2].replace(b'"step":7', b'"step":6'), lines[-1]]))
    here = {name: load_recorded(tmp_path / name) for name in ("replay", "damaged")}
    assert _everything(here["replay"])[3]["no_rewind"] == "fail" and here["damaged"].damaged
    with pytest.MonkeyPatch.context() as m:
        pools = _in_the_pool(m)
        apart = {name: load_recorded(tmp_path / name) for name in here}
    assert len(pools) == 2, "the pool was not used"
    for name in here:
        assert _everything(apart[name]) == _everything(here[name]), name
