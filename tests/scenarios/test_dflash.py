"""The target + drafter pipeline under role-aware chaos: every scenario of the bundled suite
passes, and each planted pipeline bug is caught by the checker meant to catch it (real gloo
point-to-point queues and an all-reducing drafter group, 4 ranks, tiny shapes)."""
import re

import pytest

from pytest_reshard import chaos
from pytest_reshard.chaos.suites.dflash import SCENARIOS, THREE_ONE, TWO_TWO
from pytest_reshard.fixtures.dflash import REBALANCED_NOTE, SHARES_NOTE

from .test_devices import CGROUPS, NOISY   # skips, with the reason, where cgroups cannot cap a rank

pytestmark = pytest.mark.reshard(world_size=4, steps=12, timeout=120)


@pytest.mark.nightly   # the same scenarios as `pytest-reshard dflash`, which the nightly runs
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_suite_scenario_passes(reshard_run, name):
    result = reshard_run("dflash", **SCENARIOS[name])
    result.assert_ok()
    assert {"sample_ledger", "throughput"} <= set(result.verdicts)


def test_a_killed_drafter_loses_nothing_and_its_share_moves(reshard_run):
    result = reshard_run("dflash", **SCENARIOS["drafter-killed-2+2"])
    result.assert_ok()
    h = result.history
    assert list(h.generations[1].roles) == ["target", "target", "drafter"]
    # the survivor's snapshot of the state after step 4 is what generation 1 loaded
    assert h.generations[1].resume_step == 5
    assert {c.step for c in h.checkpoints("load")} == {4}
    lone = [r for r in range(3) if h.role(1, r) == "drafter"]
    assert len(lone) == 1 and len(h.samples(1, 6)[lone[0]]) == 12  # the whole batch now
    # what the regression gate records of it: recovery time and checkpoint GB/s
    from pytest_reshard.gate import baseline as gate

    m = gate.metrics(h)
    assert 0 < m["recovery"] < 30 and m["save_gbps"] > 0 and m["load_gbps"] > 0


def test_topology_change_moves_a_rank_between_roles(reshard_run):
    result = reshard_run("dflash", **SCENARIOS["topology-2+2-3+1-2+2"])
    result.assert_ok()
    assert [tuple(g.roles).count("drafter") for g in result.history.generations.values()] == [2, 1, 2]


def test_a_silent_drafter_death_is_detected_at_once(reshard_run):
    result = reshard_run("dflash", **SCENARIOS["drafter-silent-2+2"])
    result.assert_ok()
    [d] = result.history.detections()
    assert d.kind == "exited_early" and d.expected and d.exit_code == 0 and d.latency_s < 2


@pytest.mark.parametrize("bug, faults, checks, pattern", [
    ("drop_drafter_share", [chaos.kill(role="drafter", at_step=4, phase="backward", then_world_size=3)],
     {"sample_ledger", "exactly_once_samples"}, r"never reached a drafter.*dropped"),
    ("resend_after_restart", [chaos.kill(role="target", at_step=4, phase="send")],
     {"sample_ledger", "exactly_once_samples"}, r"did not make for this step.*made at step \d.*delivered twice"),
    ("idle_drafter", [chaos.preempt(at_step=3, phase="forward")],
     {"throughput"}, r"drafter rank \d processed 0 tokens.*pool silently shrank to 1 of 2"),
    ("drafter_exits_silently", [], {"liveness"}, r"rank 3 exited early \(exit code 0\)"),
])
def test_planted_pipeline_bugs_fail_the_right_checker(reshard_run, bug, faults, checks, pattern):
    result = reshard_run("dflash", roles=TWO_TWO, args=["--bug", bug], faults=faults)
    failed = {name for name, v in result.verdicts.items() if v.status == "fail"}
    assert checks <= failed, {k: (v.status, v.message) for k, v in result.verdicts.items()}
    messages = " | ".join(result.verdicts[c].message for c in checks)
    assert re.search(pattern, messages), messages
    if bug == "idle_drafter":  # nothing else notices: samples, loss and state are all fine
        assert failed == {"throughput"}, {k: v.message for k, v in result.verdicts.items()}


def test_a_declared_minimum_throughput_fails_a_straggling_drafter_and_names_it(reshard_run):
    result = reshard_run("dflash", roles=TWO_TWO, min_throughput=0.5, faults=[
        chaos.slow_rank(role="drafter", at_step=3, delay_ms=400, steps=8, phase="backward")])
    v = result.verdicts["throughput"]
    assert v.status == "fail", v.message
    assert re.search(r"generation 0 \(2 target \+ 2 drafter\): \w+ throughput .* of the "
                     r"fault-free run's .*declared minimum 50%.*bottleneck: drafter", v.message)
    others = {k for k, x in result.verdicts.items() if x.status != "pass"}
    assert others == {"throughput"}, {k: x.message for k, x in result.verdicts.items()}


@pytest.mark.parametrize("roles, faults", [
    # the drafters stop while a slow target is still in the next step: its send finds them gone
    (TWO_TWO, [chaos.preempt(at_step=5, phase="recv"),
               chaos.slow_rank(rank=0, at_step=6, phase="send", delay_ms=1500)]),
    # an error at the end of a step, after its update: the snapshot must hold that update
    (THREE_ONE, [chaos.ecc_error(rank=3, at_step=6, phase="end", layer="compute")]),
    # a death at the last step: the next generation resumes past it and has nothing to run
    (TWO_TWO, [chaos.kill(rank=3, at_step=11, phase="end")]),
], ids=["stop-while-a-target-sends", "error-after-the-update", "death-at-the-last-step"])
def test_edge_placements_pass(reshard_run, roles, faults):
    reshard_run("dflash", roles=roles, faults=faults).assert_ok()


def test_a_hung_drafter_costs_nothing_the_survivor_holds(reshard_run):
    """Only the hung rank is killed: the other drafter gets the failure grace to snapshot."""
    result = reshard_run("dflash", roles=TWO_TWO, faults=[
        chaos.hang(rank=3, at_step=6, phase="backward", then_world_size=3)])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 6  # the survivor's snapshot of step 5


#: A target (an A100, 0.32 of an H100) on rank 0, drafters on 1 (an H100) and 2 (an A100): 1.64
#: CPUs of demand, within 2 cores (an uncapped rank that must share a core runs slower than its
#: class, and no share measured beforehand can know by how much). A batch of 24 gives the A100
#: drafter enough samples that one more or less is a small part of its step.
MIXED_PIPELINE = {"world_size": 3, "roles": {"target": 1, "drafter": 2},
                  "devices": ["a100", "h100", "a100"], "throttle": "cgroup", "steps": 20,
                  "faults": [chaos.kill(role="drafter", at_step=10)]}
MIXED_ARGS = ["--global-batch", "24", "--dataset-size", "240"]


@CGROUPS
def test_uneven_drafter_shares_in_proportion_to_speed_pass_every_data_checker(reshard_run):
    """Each generation times its drafters on a kernel (the H100 about 3x the A100's samples),
    then feeds their step times back into the shares; the update is the batch's mean all the
    same, so the loss matches the clean even-share run, and the drafters balance."""
    result = reshard_run("dflash", args=["--shares", "measured", *MIXED_ARGS],
                         settle_steps=2, max_idle=NOISY, **MIXED_PIPELINE)
    history = result.history
    first = {n.gen: n.fields["counts"] for n in history.notes(SHARES_NOTE)}
    assert sorted(first) == [0, 1] and all(c[0] > 2 * c[1] and sum(c) == 24
                                           for c in first.values()), first
    changes = {(n.gen, n.step): n.fields["counts"] for n in history.notes(REBALANCED_NOTE)}
    for occ in history.kept():   # every kept step used the shares in force at it
        drafters = sorted(r for r in history.samples(occ.gen, occ.step)
                          if history.role(occ.gen, r) == "drafter")
        sizes = [len(history.samples(occ.gen, occ.step)[r]) for r in drafters]
        in_force = max((s for g, s in changes if g == occ.gen and s <= occ.step), default=None)
        assert sizes == (first[occ.gen] if in_force is None else changes[occ.gen, in_force]), \
            (occ, sizes, first, changes)
    assert {c: v.message for c, v in result.verdicts.items() if v.status != "pass"} == {}
    assert result.verdicts["balance"].message.startswith("generation 0 (drafter), steps 2-9: "), \
        result.verdicts["balance"].message


@CGROUPS
def test_even_drafter_shares_on_mixed_devices_fail_balance_naming_the_idle_drafter(reshard_run):
    result = reshard_run("dflash", args=["--shares", "even", *MIXED_ARGS], **MIXED_PIPELINE)
    verdict = result.verdicts["balance"]
    assert verdict.status == "fail" and verdict.rank == 1, verdict
    assert re.match(r"generation 0 \(drafter\), steps 1-9: rank 1 \(h100, 50% of the samples\) idled "
                    r"(\d+)% of its steps waiting at the collectives for rank 2 \(a100",
                    verdict.message), verdict.message
    assert int(re.search(r"idled (\d+)%", verdict.message).group(1)) >= 50


@CGROUPS
def test_unweighted_drafter_means_fail_loss_continuity(reshard_run):
    result = reshard_run("dflash", args=["--shares", "measured", "--bug", "unweighted_drafters",
                                         *MIXED_ARGS], **MIXED_PIPELINE)
    verdict = result.verdicts["loss_continuity"]
    assert verdict.status == "fail", verdict
    assert verdict.message.startswith("loss departs from the reference at step 0 (generation 0)"), \
        verdict.message
    assert result.verdicts["exactly_once_samples"].status == "pass"
