"""The bundled LM under ECC errors, through the real harness (FSDP2 + DCP on gloo, 4 ranks, tiny).

- Telemetry layer: the health monitor sees the injected DBE at the step's "optimizer" point, the
  ranks agree, the step is abandoned before its update, the state after the previous step is
  saved and the job drains to 3 ranks, which run the poisoned step again: every checker passes.
- Compute layer: the rank raises the CUDA ECC error; with HSDP (2 replicas) a healthy replica
  holds its shards, so the drain is lossless too.
- ``--bug ignore_ecc``: the poisoned step is committed; only the ``poisoned_commit`` check can
  tell (nothing in the loss, samples or state shows it).
"""
from __future__ import annotations


import pytest

from pytest_reshard import chaos
from pytest_reshard.checkers import poisoned_commit

pytestmark = pytest.mark.reshard(world_size=4, steps=10, timeout=180)
POISONED = 4  # the step the ECC error hits


def _drain_request(result):
    return [e for e in result.history.rank_events("request") if e["gen"] == 0]


def test_telemetry_ecc_drains_the_rank_without_committing_the_poisoned_step(reshard_run):
    result = reshard_run("lm", faults=[chaos.ecc_error(rank=2, at_step=POISONED, phase="forward")])
    result.assert_ok()
    h = result.history
    assert [g.world_size for g in h.generations.values()] == [4, 3]
    g0, g1 = h.generations[0], h.generations[1]
    assert g0.cause == "drain" and g0.planned
    assert POISONED not in h.ended(0) and h.committed(0) == frozenset(range(POISONED))
    assert g1.resume_step == POISONED                  # the poisoned step runs again
    assert h.committed(1) == frozenset(range(POISONED, 10))
    (request,) = _drain_request(result)
    assert request["to_world_size"] == 3
    assert "rank 2 at step 4" in request["reason"] and "volatile DBE count 0 -> 1" in request["reason"]
    errors = h.rank_events("error", gen=0)
    assert {e["rank"] for e in errors} == {0, 1, 2, 3}
    assert all(e["step"] == POISONED and e["phase"] == "optimizer" for e in errors)
    loads = h.checkpoints("load")
    assert loads and all(c.gen == 1 and c.step == POISONED - 1 for c in loads)
    assert poisoned_commit(h).status == "pass"


def test_compute_ecc_with_a_replica_drains_losslessly(reshard_run):
    result = reshard_run("lm", args=["--replicas", "2"],
                         faults=[chaos.ecc_error(rank=2, at_step=POISONED, phase="backward",
                                                 layer="compute")])
    result.assert_ok()
    h = result.history
    assert [g.world_size for g in h.generations.values()] == [4, 3]
    g0, g1 = h.generations[0], h.generations[1]
    assert g0.cause == "drain" and g0.planned
    assert POISONED not in h.ended(0)
    assert g1.resume_step == POISONED and g1.resume_source == "emergency"
    (request,) = _drain_request(result)
    assert request["rank"] == 2 and request["to_world_size"] == 3
    assert "uncorrectable ECC error" in request["reason"]
    lost = [e for e in h.rank_events("note", gen=0) if e["what"] == "device_lost"]
    assert [(e["rank"], e["step"], e["lossless"]) for e in lost] == [(2, POISONED, True)]
    assert poisoned_commit(h).status == "pass"


def test_ignored_ecc_is_caught_only_by_poisoned_commit(reshard_run):
    """A finding: with the monitor off, the poisoned step commits and every bundled checker
    passes (nothing in the loss, samples or state shows it). ``poisoned_commit`` catches it."""
    result = reshard_run("lm", world_size=2, args=["--bug", "ignore_ecc"],  # 2 ranks: cheaper
                         faults=[chaos.ecc_error(rank=1, at_step=POISONED, phase="forward")])
    assert [g.world_size for g in result.history.generations.values()] == [2]
    assert POISONED in result.history.committed(0)
    others = {k: v.status for k, v in result.verdicts.items() if k != "poisoned_commit"}
    assert set(others.values()) == {"pass"}, result.verdicts
    verdict = result.verdicts["poisoned_commit"]
    assert verdict.status == "fail"
    assert "step 4 was committed in generation 0 although rank 1" in verdict.message
