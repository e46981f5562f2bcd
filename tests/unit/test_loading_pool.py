"""A big history is parsed by a pool of forked processes: it must load exactly as one parsed here,
field orders the pool's processes saw first, damaged and torn lines included."""
from __future__ import annotations

from pathlib import Path

import pytest

from ..histories import reshard_run
from pytest_reshard.checkers import CheckContext, run_all
from pytest_reshard.contract import encode_event
from pytest_reshard.history import History, loading


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


def test_a_history_parsed_by_the_pool_is_the_one_parsed_here(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path)
    here = History.load(folder)
    assert here.damaged and here.torn, "the planted damage must be seen"
    monkeypatch.setattr(loading, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(loading.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(loading.threading, "active_count", lambda: 1)   # pytest may run others
    pools = []
    real = loading.ProcessPoolExecutor
    monkeypatch.setattr(loading, "ProcessPoolExecutor", lambda *a, **k: pools.append(1) or real(*a, **k))
    apart = History.load(folder)
    assert pools, "the pool was not used"
    assert _everything(apart) == _everything(here)
