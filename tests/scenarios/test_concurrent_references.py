"""A scenario's clean reference run beside the chaos run (``Session(concurrent_references=)``).

The verdicts must be the ones the sequential session gives, the reference must really have run
while the scenario did, and nothing may outlive the scenario or the session: no thread, no fork
server, no rank, whatever the outcome. Real processes (the toy script, 2 ranks, gloo).
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from pytest_reshard import chaos
from pytest_reshard.session import Session, scenario_from

TOY = str(Path(__file__).resolve().parents[1] / "workloads" / "toy_train.py")


def _scenario(**kw):
    return scenario_from(TOY, world_size=2, steps=6, args=["--ckpt-every", "2"],
                         faults=[chaos.kill(rank=1, at_step=3)], timeout_s=120, **kw)


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                out[int(pid)] = int(fields[1])
    return out


def _processes_of(s: Session) -> set[int]:
    """The session's fork servers and every process under them, now."""
    servers = {l._server.pid for l in s._launchers.values() if l._server is not None}
    parents, found = _parents(), set(servers)
    while True:
        more = {p for p, pp in parents.items() if pp in found} - found
        if not more:
            return found
        found |= more


def _reference_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pytest-reshard reference" and t.is_alive()]


def _alive(pids: set[int], deadline_s: float = 30.0) -> set[int]:
    """Those of ``pids`` still alive once they had ``deadline_s`` to go."""
    end = time.monotonic() + deadline_s
    while pids & set(_parents()) and time.monotonic() < end:
        time.sleep(0.05)
    return pids & set(_parents())


def test_the_reference_runs_beside_the_scenario_and_the_verdicts_are_the_same(tmp_path):
    sc = _scenario()
    with Session(tmp_path / "seq", concurrent_references=False) as s:
        sequential = s.run(sc, "toy")
    said: list[str] = []
    with Session(tmp_path / "conc", concurrent_references=True, progress=said.append) as s:
        together = s.run(sc, "toy")
        assert not s._pending and not _reference_threads()  # settled before run() returned
        ours = _processes_of(s)
        assert len(ours) == 1  # the warm server, and no rank left on it
    assert {k: v.status for k, v in together.verdicts.items()} == \
        {k: v.status for k, v in sequential.verdicts.items()}, \
        ({k: v.message for k, v in together.verdicts.items()},
         {k: v.message for k, v in sequential.verdicts.items()})
    assert together.ok, together.verdicts
    assert sum(m.startswith("reference run") for m in said) >= 1
    # The first topology's clean run began before the scenario's first generation ended.
    chaos_end = min(e["t"] for e in _events(together.run_dir / "events" / "supervisor.jsonl")
                    if e["ev"] == "gen_end")
    starts = [min(e["t"] for e in _events(f) if e["ev"] == "scenario")
              for f in (tmp_path / "conc" / "_references").glob("*/events/supervisor.jsonl")]
    assert min(starts) < chaos_end
    assert _alive(ours) == set()


def test_closing_the_session_ends_a_reference_still_running(tmp_path):
    s = Session(tmp_path, concurrent_references=True)
    try:
        s._start_reference(_scenario())
        assert _reference_threads()
        ours = _processes_of(s)
    finally:
        s.close()
    assert not _reference_threads()
    assert _alive(ours | _processes_of(s)) == set()


def test_an_interrupted_scenario_ends_its_reference(tmp_path, monkeypatch):
    s = Session(tmp_path, concurrent_references=True)

    seen: set[int] = set()

    def interrupted(*a, **kw):  # the scenario ran; its reference may be running still
        seen.update(_processes_of(s))
        raise KeyboardInterrupt

    try:
        monkeypatch.setattr(s, "check", interrupted)
        with pytest.raises(KeyboardInterrupt):
            s.run(_scenario(), "toy")
        assert not s._pending and not _reference_threads()
        assert all(launcher.closed for launcher in s._launchers.values())
        assert seen and _alive(seen) == set()
    finally:
        s.close()
