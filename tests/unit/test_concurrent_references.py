"""A scenario's clean reference run beside the chaos run (``Session(concurrent_references=)``).

The verdicts must be the ones the sequential session gives, the reference must really have run
while the scenario did, and nothing may outlive the scenario or the session: no thread, no fork
server, no rank, whatever the outcome. Real processes (the toy script, 2 ranks, gloo).
"""
from __future__ import annotations

from pathlib import Path


from pytest_reshard import chaos
from pytest_reshard.session import references as references_mod
from pytest_reshard.session import Session, concurrent_reference_ok, scenario_from

TOY = str(Path(__file__).resolve().parents[1] / "workloads" / "toy_train.py")


def _scenario(**kw):
    return scenario_from(TOY, world_size=2, steps=6, args=["--ckpt-every", "2"],
                         faults=[chaos.kill(rank=1, at_step=3)], timeout_s=120, **kw)


def test_the_default_needs_two_cpus_per_rank_of_both_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(references_mod, "usable_cpus", lambda: 16)
    assert concurrent_reference_ok(4, 4) and not concurrent_reference_ok(4, 5)
    monkeypatch.setattr(references_mod, "usable_cpus", lambda: 7)
    assert not concurrent_reference_ok(2, 2)
    with Session(tmp_path) as s:  # the default on a machine short of cores: one after the other
        s._start_reference(_scenario())
        assert not s._pending
