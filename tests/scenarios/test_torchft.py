"""torchft under the harness's membership mode (``replica_groups=G``): a fault ends one replica
group, the harness restarts just that group while the others train on, and our checkers judge
what torchft did (docs/torchft-notes.md). Real processes: torchft's Lighthouse hosted by the
supervisor, its Manager, DDP and optimizer wrapper in each group, gloo on CPU; nothing mocked.

Whether the survivor commits steps alone before the restarted group is back depends on timing
(the Lighthouse's 1 s heartbeat timeout against the restart), so the sample and loss verdicts
are asserted to be what that history warrants either way, never a pass over lost samples."""
import socket
from pathlib import Path

import pytest

from pytest_reshard import chaos

pytest.importorskip("torchft", reason="torchft is not installed: pip install -c "
                    "constraints/cpu.txt -e '.[frameworks]' (it pins torchft==0.2.0)")

STEPS = 24
ARGS = ["--groups", "2", "--step-sleep", "0.05", "--ckpt-every", "10", "--timeout", "5"]
pytestmark = pytest.mark.reshard(world_size=2, steps=STEPS, timeout=120, replica_groups=2,
                                 lighthouse={"heartbeat_timeout_ms": 1000}, phases=["heal"])
KILL = chaos.kill(rank=1, at_step=5, phase="backward")
# the restarted group (fresh, step 0) killed again in its heal: the donor's state has arrived
KILL_IN_HEAL = chaos.kill(rank=1, at_step=0, phase="heal")


@pytest.fixture
def torchft_train():
    return str(Path(__file__).parent.parent / "workloads" / "torchft_train.py")


def _heals(history):
    """(load, the donor's save it must equal) for each heal of the run."""
    out = []
    for load in history.checkpoints("load"):
        if load.info.get("source") == "torchft-heal":
            donors = [s for s in history.checkpoints("save") if s.step == load.step
                      and s.index < load.index and s.info.get("source") == "torchft-heal-donor"]
            out.append((load, donors[-1] if donors else None))
    return out


def _judged_honestly(result):
    """Samples and loss say what the history shows: a quorum that trained on without the
    killed group lost that group's share (a fail naming it) and leaves the loss unjudgeable."""
    h, v = result.history, result.verdicts
    reduced = h.reduced_steps(0)
    if reduced:
        assert v["exactly_once_samples"].status == "fail", v["exactly_once_samples"].message
        assert "quorum of fewer replica groups" in v["exactly_once_samples"].message
        assert v["loss_continuity"].status == "unknown", v["loss_continuity"].message
    else:
        assert v["exactly_once_samples"].status == "pass", v["exactly_once_samples"].message
        assert v["loss_continuity"].status == "pass", v["loss_continuity"].message


def test_kill_one_group_mid_step_heals_bit_equal(reshard_run, torchft_train):
    result = reshard_run(torchft_train, args=ARGS, faults=[KILL])
    h, v = result.history, result.verdicts
    [restart] = h.member_restarts(0)
    assert (restart["group"], restart["ranks"]) == (1, [1])
    assert len(h.generations) == 1, "membership mode: the generation went on"
    heals = _heals(h)
    assert heals and all(d is not None and load.digest == d.digest for load, d in heals)
    for name in ("no_rewind", "state_equivalence", "liveness"):
        assert v[name].status == "pass", f"{name}: {v[name].message}"
    assert "1 group restart, no committed step executed again" in v["no_rewind"].message
    _judged_honestly(result)
    [lighthouse] = [e for e in h.supervisor_events("member") if e["action"] == "lighthouse"]
    port = int(lighthouse["address"].rsplit(":", 1)[1])
    with socket.socket() as s:  # shut down with the run: nothing listens on its port
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_kill_during_heal_heals_on_the_next_try(reshard_run, torchft_train):
    result = reshard_run(torchft_train, args=ARGS, faults=[KILL, KILL_IN_HEAL])
    h, v = result.history, result.verdicts
    assert [e["incarnation"] for e in h.member_restarts(0)] == ["0.1", "0.2"]
    assert {f.phase for f in h.faults_fired()} == {"backward", "heal"}
    for name in ("no_rewind", "state_equivalence", "liveness"):
        assert v[name].status == "pass", f"{name}: {v[name].message}"
    _judged_honestly(result)


@pytest.mark.parametrize("faults", [[KILL], [KILL, KILL_IN_HEAL]], ids=["mid_step", "in_heal"])
def test_a_healer_that_skips_the_heal_fails_state_equivalence(reshard_run, torchft_train, faults):
    result = reshard_run(torchft_train, args=[*ARGS, "--bug-skip-heal"], faults=faults)
    v = result.verdicts
    assert v["state_equivalence"].status == "fail", v["state_equivalence"].message
    assert "rank 1" in v["state_equivalence"].message


# delay: the survivor trained alone from 0.94-1.03 s after the kill (the heartbeat timeout) until
# the group was back, 1.6-2.1 s (CI, load 4.5): 7-12 steps alone; it finished 7.2 s after the kill
@pytest.mark.nightly   # the CI budget: membership mode's other runs stay in CI
@pytest.mark.reshard(steps=60, member_restart_delay_s=1.5)
def test_a_group_down_longer_than_the_heartbeat_loses_its_share(reshard_run, torchft_train):
    """What torchft loses, judged from the history: while group 1 is down (1.5 s and its start,
    against the Lighthouse's 1 s heartbeat timeout) group 0 commits steps alone; group 1's share
    of those steps is never trained (a documented trade-off of torchft), then it comes back and
    heals exactly (60 steps of 0.1 s: the survivor cannot finish alone before it is back)."""
    result = reshard_run(torchft_train, args=[*ARGS, "--step-sleep", "0.1"], faults=[KILL])
    h, v = result.history, result.verdicts
    [restart] = h.member_restarts(0)
    assert restart["delay_s"] == 1.5
    heals = _heals(h)
    assert heals and all(d is not None and load.digest == d.digest for load, d in heals)
    reduced = h.reduced_steps(0)
    assert reduced, "group 0 should have committed steps alone"
    samples = v["exactly_once_samples"]
    assert samples.status == "fail" and "quorum of fewer replica groups" in samples.message, samples
    assert v["loss_continuity"].status == "unknown", v["loss_continuity"].message
    for name in ("no_rewind", "state_equivalence", "liveness"):
        assert v[name].status == "pass", f"{name}: {v[name].message}"


def test_preempting_one_group_restarts_it_alone(reshard_run, torchft_train):
    result = reshard_run(torchft_train, args=ARGS,
                         faults=[chaos.preempt(rank=1, at_step=5, phase="forward", grace_s=20)])
    h, v = result.history, result.verdicts
    [preempt] = [e for e in h.supervisor_events("member") if e["action"] == "preempt"]
    assert preempt["groups"] == [1]
    [restart] = h.member_restarts(0)
    assert restart["group"] == 1 and restart["fault_id"] == 0
    assert len(h.generations) == 1, "a preemption of one group is not the generation's"
    assert not [d for d in h.detections() if d.kind != "died" or not d.expected]
    for name in ("no_rewind", "state_equivalence", "liveness"):
        assert v[name].status == "pass", f"{name}: {v[name].message}"
    _judged_honestly(result)


def test_two_groups_killed_in_a_row_both_heal(reshard_run, torchft_train):
    result = reshard_run(torchft_train, args=ARGS, faults=[
        KILL, chaos.kill(rank=0, at_step=14, phase="backward")])
    h, v = result.history, result.verdicts
    assert [e["group"] for e in h.member_restarts(0)] == [1, 0]
    heals = _heals(h)
    assert len(heals) >= 2 and all(d is not None and load.digest == d.digest for load, d in heals)
    for name in ("no_rewind", "state_equivalence", "liveness"):
        assert v[name].status == "pass", f"{name}: {v[name].message}"
    _judged_honestly(result)


@pytest.mark.parametrize("world, groups", [(4, 2), pytest.param(3, 3, marks=pytest.mark.nightly)],
                         ids=["2x2_ddp_inside", "3x1"])
def test_kill_one_group_of_several_layouts_heals(reshard_run, torchft_train, world, groups):
    """Two groups of two ranks (data parallel inside each group too), and three groups."""
    result = reshard_run(torchft_train, world_size=world, replica_groups=groups,
                         args=[*ARGS[2:], "--groups", str(groups)],
                         faults=[chaos.kill(rank=world - 1, at_step=5, phase="backward")])
    h, v = result.history, result.verdicts
    [restart] = h.member_restarts(0)
    assert restart["ranks"] == list(range(world - world // groups, world))
    heals = _heals(h)
    assert len(heals) == world // groups and all(d is not None and load.digest == d.digest
                                                  for load, d in heals)
    for name in ("no_rewind", "state_equivalence", "liveness"):
        assert v[name].status == "pass", f"{name}: {v[name].message}"
    _judged_honestly(result)


def test_a_group_still_down_when_the_others_finish_is_not_restarted(reshard_run, torchft_train):
    """Group 1 is due back after 30 s; group 0 finishes the run alone long before: the pending
    restart is dropped (recorded), the run is complete, and group 1's share is lost."""
    # 30 s: the survivor finished 2.1 s after the kill (CI, load 4.5)
    result = reshard_run(torchft_train, args=ARGS, member_restart_delay_s=30.0, faults=[KILL])
    h, v = result.history, result.verdicts
    [dropped] = [e for e in h.supervisor_events("member") if e["action"] == "dropped"]
    assert dropped["group"] == 1 and "finished the run" in dropped["detail"]
    assert [g.cause for g in h.generations.values()] == ["complete"]
    samples = v["exactly_once_samples"]
    assert samples.status == "fail" and "quorum of fewer replica groups" in samples.message, samples
    for name in ("no_rewind", "state_equivalence"):
        assert v[name].status == "pass", f"{name}: {v[name].message}"
