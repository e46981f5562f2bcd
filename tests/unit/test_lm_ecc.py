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

import types

import pytest


pytestmark = pytest.mark.reshard(world_size=4, steps=10, timeout=180)


def test_drain_size_keeps_every_sample_exactly_once():
    """The drain goes to the largest world size that still divides the global batch (no process)."""
    lm = pytest.importorskip("pytest_reshard.fixtures.lm")
    trainer = types.SimpleNamespace(world=4, cfg=types.SimpleNamespace(global_batch=12))
    assert [lm.Trainer.drain_size(trainer, bad) for bad in (1, 2, 3, 4)] == [3, 2, 1, 4]
    trainer.world = 8
    assert lm.Trainer.drain_size(trainer, 1) == 6  # 7 ranks would split 12 samples unevenly


