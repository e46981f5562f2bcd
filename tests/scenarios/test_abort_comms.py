"""``abort_comms`` end to end: a rank's process group aborted in place, the process left alive.

The bundled LM fails its next collective, writes its emergency snapshot and exits: the next
generation resumes with nothing lost. A script that retries a failed all-reduce forever (its
group is gone) is a stall: ``liveness`` fails it and shows where its main thread was stuck. One
that skips the failed collectives trains on alone: ``liveness`` fails it, naming the steps."""
import pytest

from pytest_reshard import chaos


@pytest.mark.nightly   # the catalog suite runs the same scenario at 4 ranks
def test_the_lm_resumes_after_a_communicator_abort_with_nothing_lost(reshard_run):
    result = reshard_run("lm", world_size=4, steps=10,
                         faults=[chaos.abort_comms(rank=1, at_step=6, phase="backward")])
    result.assert_ok()
    assert [g.cause for g in result.history.generations.values()] == ["failure", "complete"]


def test_a_job_that_retries_on_a_dead_group_stalls_and_shows_its_stack(reshard_run):
    result = reshard_run("../workloads/ddp_train.py", world_size=2, steps=8, stall_s=4,
                         args=["--retry-comm-errors"],
                         faults=[chaos.abort_comms(rank=1, at_step=3, phase="optimizer")])
    v = result.verdicts["liveness"]
    assert v.status == "fail", v.message
    assert v.message.startswith("rank 1 stalled at step 3") and "its main thread was in: " \
        in v.message and "in main" in v.message, v.message


def test_a_job_that_skips_failed_collectives_trains_alone_and_liveness_fails_it(reshard_run):
    result = reshard_run("../workloads/ddp_train.py", world_size=2, steps=8,
                         args=["--skip-comm-errors"],
                         faults=[chaos.abort_comms(rank=1, at_step=3, phase="optimizer")])
    v = result.verdicts["liveness"]
    assert v.status == "fail", v.message
    assert "rank 1 (role trainer) of generation 0 ended steps " in v.message and \
        "it trained on without its peers" in v.message, v.message
