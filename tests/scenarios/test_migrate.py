"""A zero-downtime migration (the LM's ``--live`` under ``chaos.migrate``): one rank's shard goes
to a new process in chunks while every rank trains on, the updates it missed follow, and the
shadow is swapped in at a step boundary; the old process leaves (real FSDP2 on gloo)."""
import pytest

from pytest_reshard import chaos

# On 2 busy cores a step beside the joiner's start took 1.2 to 2.4 median steps (the joiner's
# warm-up takes a core); one that waits for a cold-started joiner 27.
pytestmark = pytest.mark.reshard(world_size=4, steps=20, timeout=180, max_stall_steps=3)
MOVE_RANK_2 = [chaos.migrate(2, at_step=3)]


def test_a_migration_keeps_every_rank_training_and_passes_every_checker(reshard_run):
    result = reshard_run("lm", args=["--live"], faults=MOVE_RANK_2)
    result.assert_ok()
    history = result.history
    start = next(e for e in history.events if e["ev"] == "gen_start" and e["gen"] == 1)
    assert start["by"] == "migration" and start["survivors"] == [0, 1, None, 3], start
    pid = {(e["gen"], e["rank"]): e["pid"] for e in history.events if e["ev"] == "start"}
    assert [pid[(1, r)] == pid[(0, r)] for r in range(4)] == [True, True, False, True]
    # The shadow was built while training went on: steps ran between the notice and the swap.
    swapped = history.generations[1].resume_step - 1
    assert swapped > 4, swapped
    loads = history.checkpoints("load", gen=1)
    assert sorted(c.rank for c in loads) == [0, 1, 2, 3]
    assert all(c.info.get("source") == "live" and c.step == swapped for c in loads)
    assert "rank 2's shard" in result.verdicts["downtime"].message


def test_a_shadow_that_missed_the_last_update_is_caught_on_its_rank(reshard_run):
    result = reshard_run("lm", args=["--live", "--bug", "shadow_misses_last_update"],
                         faults=MOVE_RANK_2)
    verdict = result.verdicts["state_equivalence"]
    swapped = result.history.generations[1].resume_step - 1
    assert verdict.status == "fail", verdict
    assert verdict.message.startswith(f"shard state differs after the load of step {swapped} in "
                                      "generation 1 (world size 4 -> 4) on rank 2"), verdict.message
    assert (verdict.rank, verdict.step) == (2, swapped)
    assert result.verdicts["loss_continuity"].status == "fail"


def test_a_migration_that_stalls_every_rank_fails_downtime(reshard_run):
    """Cold interpreters (``launcher="local"``): a joiner starts as on a new node, in seconds,
    and every rank waits for it."""
    result = reshard_run("lm", args=["--live", "--bug", "migration_blocks"], faults=MOVE_RANK_2,
                         launcher="local")
    verdict = result.verdicts["downtime"]
    assert verdict.status == "fail", verdict
    assert verdict.message.startswith("the migration of rank 2's shard in generation 0 (asked "
                                      "after step 3): the step ending at step"), verdict.message
    assert "while the handover was prepared (at most 3)" in verdict.message
    assert verdict.rank == 2 and verdict.step is not None and verdict.step > 3
    # The state still moved intact: only the pause is wrong.
    assert result.verdicts["state_equivalence"].status == "pass"


@pytest.mark.nightly   # a usage error's message (10 s); the nightly workflow runs it
@pytest.mark.reshard(steps=8)
def test_a_run_too_short_for_its_migration_fails_saying_so(reshard_run):
    result = reshard_run("lm", args=["--live"], faults=MOVE_RANK_2)
    verdict = result.verdicts["liveness"]
    assert verdict.status == "fail", verdict
    assert "the run's last step ran before the handover answered after step 3 took place, so " \
           "it was never tested: give the run more steps" in verdict.message, verdict.message


def test_an_old_owner_that_goes_on_writing_after_the_swap_fails_liveness(reshard_run):
    result = reshard_run("lm", args=["--live", "--bug", "owner_keeps_writing"], faults=MOVE_RANK_2)
    verdict = result.verdicts["liveness"]
    swapped = result.history.generations[1].resume_step - 1
    assert verdict.status == "fail", verdict
    assert verdict.message.startswith("rank 2 (role trainer) of generation 0 ended steps "), \
        verdict.message
    assert f"all of them ended up to step {swapped}): its shard had moved to a new process " \
           "(rank 2 of generation 1), and the old owner went on beside it" in verdict.message
    assert (verdict.rank, verdict.generation) == (2, 0) and verdict.step == swapped + 2
    assert result.verdicts["state_equivalence"].status == "pass"   # the swap itself was right
