"""A planned reshard done in the running processes (the LM's ``--live``): the ranks that stay
re-form the world in place, a rank that leaves hands its shards over and exits, a new rank
joins; every checker judges it as it judges save-exit-relaunch-load (real FSDP2 on gloo)."""
import pytest

from pytest_reshard import chaos

pytestmark = pytest.mark.reshard(world_size=4, steps=12, timeout=180)
SHRINK_GROW = [chaos.shift_shards(to_world_size=3, at_step=3, notice_s=30),
               chaos.shift_shards(to_world_size=4, at_step=7, notice_s=30)]


def _live_generations(result):
    starts = [e for e in result.history.events if e["ev"] == "gen_start"]
    return [e["gen"] for e in starts if e.get("by") == "live reshard"]


def test_live_shrink_and_grow_pass_every_checker(reshard_run):
    result = reshard_run("lm", args=["--live"], faults=SHRINK_GROW)
    result.assert_ok()
    history = result.history
    assert _live_generations(result) == [1, 2]
    assert [history.generations[g].world_size for g in (0, 1, 2)] == [4, 3, 4]
    assert [history.generations[g].resume_step for g in (1, 2)] == [4, 8]
    # The survivors are the same processes; only the joiner of generation 2 is new.
    pid = {(g, r): e["pid"] for e in history.events if e["ev"] == "start"
           for g, r in [(e["gen"], e["rank"])]}
    assert pid[(1, 0)] == pid[(0, 0)] and pid[(2, 2)] == pid[(0, 2)]
    assert pid[(2, 3)] not in {pid[(0, r)] for r in range(4)}
    loads = history.checkpoints("load")
    assert {(c.gen, c.step) for c in loads} == {(1, 3), (2, 7)}
    assert all(c.info.get("source") == "live" for c in loads)
    assert not any(c.info.get("source") != "live" for c in history.checkpoints("save")
                   if c.step in (3, 7))


def test_live_reshard_that_keeps_the_old_shard_map_is_caught(reshard_run):
    result = reshard_run("lm", args=["--live", "--bug", "keep_old_shard_map"], faults=SHRINK_GROW)
    verdict = result.verdicts["state_equivalence"]
    assert verdict.status == "fail", verdict
    assert "model" in verdict.message and "step 3" in verdict.message, verdict.message
    assert result.verdicts["loss_continuity"].status == "fail", result.verdicts["loss_continuity"]


@pytest.mark.nightly   # a refusal, on a real torchrun run (12 s); the nightly workflow runs it
def test_live_reshard_needs_a_launcher_that_keeps_processes(reshard_run):
    result = reshard_run("lm", args=["--live"], launcher="torchrun",
                         faults=[chaos.shift_shards(to_world_size=3, at_step=3, notice_s=30)])
    verdict = result.verdicts["liveness"]
    assert verdict.status == "fail", verdict
    assert "refused: launcher 'torchrun' does not keep ranks across generations; use launcher " \
           "fork or local" in verdict.message, verdict.message


def test_a_rank_killed_during_the_handover_ends_the_run_and_leaves_nothing(reshard_run):
    """Killed in the grow, once the joiner is started: the run fails saying so, and the
    joiner, the survivors and the old world's processes are all gone (the fixture checks)."""
    result = reshard_run("lm", args=["--live"], faults=[
        *SHRINK_GROW, chaos.kill(rank=1, at_step=7, phase="handover")])
    verdict = result.verdicts["liveness"]
    assert verdict.status == "fail", verdict
    assert "generation 2 ended by failure: never formed: the live reshard from generation 1 " \
           "failed (rank 1 died (exit code -9) at step 7, phase handover (generation 1)" \
           in verdict.message, verdict.message
    ends = {e["gen"]: e["cause"] for e in result.history.events if e["ev"] == "gen_end"}
    assert ends == {0: "reshard", 1: "failure", 2: "failure"}
    assert any(e["ev"] == "start" and e["gen"] == 2 for e in result.history.events)  # the joiner
