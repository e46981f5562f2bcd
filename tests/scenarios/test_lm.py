"""The bundled LM workload under chaos: it passes every checker, and each planted bug is caught
by the checker meant to catch it (real FSDP2 + DCP on gloo, 4 ranks, tiny shapes)."""
import re

import pytest

from pytest_reshard import chaos
from pytest_reshard.chaos.suites.catalog import SCENARIOS, survives

pytestmark = pytest.mark.reshard(world_size=4, steps=10, timeout=180)
RESHARD = [chaos.shift_shards(to_world_size=3, at_step=4, phase="optimizer", notice_s=20)]


@pytest.mark.nightly   # the same scenarios as `pytest-reshard catalog`, which the nightly runs
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_injector_in_the_catalog_passes(reshard_run, name):
    survives(reshard_run, name)


def test_reshard_passes_every_checker_on_real_evidence(reshard_run):
    result = reshard_run("lm", faults=RESHARD)
    result.assert_ok()
    loads = result.history.checkpoints("load")
    assert loads and all(c.gen == 1 and c.step == 4 for c in loads)
    assert {"model", "optimizer", "lr_scheduler", "data", "rng"} <= set(loads[0].digest) | {
        k for c in loads for k in c.digest}
    assert result.history.generations[1].resume_step == 5


def test_unreplicated_kill_costs_at_most_the_checkpoint_interval(reshard_run):
    result = reshard_run("lm", args=["--ckpt-every", "3"],
                         faults=[chaos.kill(rank=2, at_step=7, phase="backward")])
    result.assert_ok()
    assert result.history.generations[1].resume_step in (6, 7)  # checkpoint after step 5 or 6


#: The CI budget: these checkers' fail cases on a user's script run in CI (test_harness_toy.py's
#: restart from zero and dropped optimizer state, test_dflash.py's drafter that exits silently).
BY_THE_TOY = pytest.mark.nightly


@pytest.mark.parametrize("bug, check, pattern", [
    pytest.param("restart_from_zero", "no_rewind", r"committed steps 0\.\.4 replayed",
                 marks=BY_THE_TOY),
    pytest.param("drop_optimizer_state", "state_equivalence", r"optimizer", marks=BY_THE_TOY),
    ("reset_data_position", "exactly_once_samples", r"twice|duplicate"),
    ("skip_batch_on_resume", "exactly_once_samples", r"never consumed"),
    pytest.param("quit_early", "liveness", r"rank 1 exited with code 0", marks=BY_THE_TOY),
    ("perturb_on_load", "loss_continuity", r"resume point step 5"),
])
def test_planted_bug_is_caught_by_its_checker(reshard_run, bug, check, pattern):
    result = reshard_run("lm", args=["--bug", bug], faults=RESHARD)
    verdict = result.verdicts[check]
    assert verdict.status == "fail", verdict
    assert re.search(pattern, verdict.message), verdict.message
    assert verdict.replay and "pytest" in verdict.replay


def test_permuted_device_mesh_corrupts_the_resharded_load(reshard_run):
    """A finding, kept as a regression test: in torch 2.13, FSDP2 on a DeviceMesh whose ranks are
    not in ascending order shards parameters by process-group rank, while DTensor (and so DCP)
    places them by mesh coordinate. Training looks fine; the checkpoint swaps shards on load.
    If this test starts failing, torch fixed it: turn the expectation around."""
    result = reshard_run("lm", args=["--bug", "permuted_mesh"],
                         faults=[chaos.rebalance(fraction=0.5, at_step=4)])
    verdict = result.verdicts["state_equivalence"]
    assert verdict.status == "fail" and "model" in verdict.message, verdict
    assert result.verdicts["loss_continuity"].status == "fail"
