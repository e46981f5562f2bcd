"""``bitflip`` end to end: one bit of a DDP replica's parameter flipped on rank 1 at step 4,
judged by ``silent_corruption`` against the clean run's saves (``workloads/sdc_train.py``
checkpoints every 3 steps, rank 0 writing)."""
import pytest

from pytest_reshard import chaos

SCRIPT = "../workloads/sdc_train.py"


def run(reshard_run, guard, bit=30):
    return reshard_run(SCRIPT, world_size=2, steps=12, args=["--guard", guard],
                       faults=[chaos.bitflip(rank=1, at_step=4, phase="optimizer", bit=bit)])


def test_a_guard_that_compares_the_replicas_stops_the_job_before_a_corrupted_save(reshard_run):
    result = run(reshard_run, "replicas")
    result.assert_ok()
    v = result.verdicts["silent_corruption"]
    assert "rank 0's own check caught the flip at step 4 (sdc)" in v.message, v.message
    assert result.history.generations[1].resume_step == 3


def test_without_a_guard_the_flip_reaches_a_checkpoint_unnoticed(reshard_run):
    v = run(reshard_run, "off").verdicts["silent_corruption"]
    assert v.status == "fail", v.message
    assert v.message.startswith("the flip of bit 30 of 0.weight's param") and \
        "on rank 1 at step 4 (optimizer, generation 0) reached the checkpoint of step 5 " \
        "unnoticed: its model and optimizer differ from the clean run's" in v.message, v.message


def test_a_nan_guard_misses_a_flip_the_loss_never_shows(reshard_run):
    v = run(reshard_run, "nan", bit=3).verdicts["silent_corruption"]
    assert v.status == "fail" and "the flip of bit 3 of 0.weight's param" in v.message and \
        "unnoticed" in v.message, v.message


@pytest.mark.nightly   # the CI budget: the guards above catch (or miss) a flip in CI
def test_the_lms_loss_guard_catches_a_flipped_exponent_and_the_relaunch_loses_nothing(reshard_run):
    """FSDP2: the flip lands in rank 1's shard of the embedding; the loss goes NaN at step 8,
    the guard stops every rank before that update and before the save of step 9, and the
    relaunch resumes from the save of step 4. Without the guard the NaN losses fail
    loss_continuity and the save of step 9 fails silent_corruption."""
    flip = [chaos.bitflip(rank=1, at_step=6, phase="optimizer", bit=30)]
    guarded = reshard_run("lm", world_size=4, steps=10, faults=flip)
    guarded.assert_ok()
    assert "caught the flip at step 8 (loss_guard) before any save held it" in \
        guarded.verdicts["silent_corruption"].message
    assert [g.resume_step for g in guarded.history.generations.values()][1:] == [5]
    unguarded = reshard_run("lm", world_size=4, steps=10, args=["--loss-guard", "0"], faults=flip)
    assert {c for c, v in unguarded.verdicts.items() if v.status == "fail"} == \
        {"loss_continuity", "silent_corruption"}, unguarded.verdicts
    assert "nan where the clean run at 4 ranks has" in \
        unguarded.verdicts["loss_continuity"].message
