"""Membership mode's history and checkers, on hand-built histories (tests/histories.py): one
generation in which replica group 1 is killed and restarted alone while group 0 trains on."""
from ..histories import DIGEST, Builder, clean_run, membership_run

from pytest_reshard.checkers import (exactly_once_samples, loss_continuity, no_rewind,
                                     state_equivalence)

STEPS = 12


def test_incarnations_attempts_and_commits():
    h = membership_run(steps=STEPS, kill_at=4).history()
    assert h.replica_groups == (2, 1)
    assert [a.incarnation for a in h.attempts(0, rank=1) if a.step in (3, 4, 5)] == [0, 0, 1, 1]
    # step 4: rank 0's first attempt was not committed, rank 1's first died in it; both retried
    assert [a.ended for a in h.attempts(0) if a.step == 4] == [False, False, True, True]
    assert h.committed(0) == frozenset(range(STEPS))
    assert h.samples(0, 4) == {0: [(0, 16), (0, 18)], 1: [(0, 17), (0, 19)]}  # ended ones only
    assert h.replays(0) == [] and h.reduced_steps(0) == frozenset()
    assert [e["incarnation"] for e in h.member_restarts(0)] == ["0.1"]


def test_a_quorum_of_one_commits_steps_alone():
    h = membership_run(steps=STEPS, kill_at=4, heal_at=7).history()
    assert h.committed(0) == frozenset(range(STEPS))   # group 0 committed 4..6 by itself
    assert h.reduced_steps(0) == frozenset({4, 5, 6})


def test_no_rewind_passes_a_heal_and_fails_a_group_that_retrains_committed_steps():
    ok = no_rewind(membership_run(steps=STEPS).history())
    assert ok.status == "pass", ok.message
    assert "1 group restart, no committed step executed again" in ok.message
    h = membership_run(steps=STEPS, kill_at=4, heal_at=6, rejoin_from=0).history()
    assert {r.step for r in h.replays(0)} == {0, 1, 2, 3, 4, 5}
    bad = no_rewind(h)
    assert bad.status == "fail", bad.message
    assert "rank 1 (incarnation 1): committed steps 0..5 executed and ended again" in bad.message


def test_state_equivalence_compares_the_heal_with_the_donor_in_the_same_generation():
    ok = state_equivalence(membership_run(steps=STEPS).history())
    assert ok.status == "pass", ok.message
    assert ok.details["loads_verified"] == 1
    # the healer's load comes after its first incarnation began steps: not "late", a fail
    bad = state_equivalence(membership_run(steps=STEPS, heal_digest={**DIGEST, "model": "ffff"})
                            .history())
    assert bad.status == "fail", bad.message
    assert "model state differs after the load of step 3 in generation 0" in bad.message
    assert "on rank 1" in bad.message and "sent by a live peer (a heal)" in bad.message


def test_exactly_once_counts_ended_attempts_and_names_the_share_a_quorum_of_one_lost():
    ref = clean_run(steps=STEPS)
    ok = exactly_once_samples(membership_run(steps=STEPS).history(), reference=ref)
    assert ok.status == "pass", ok.message   # step 4's failed attempts are not a second use
    lost = exactly_once_samples(membership_run(steps=STEPS, heal_at=7).history(), reference=ref)
    assert lost.status == "fail", lost.message
    assert "6 samples the reference consumed by step 11 were never consumed" in lost.message
    assert "steps 4..6 were committed by a quorum of fewer replica groups" in lost.message


def test_loss_continuity_is_unknown_after_a_quorum_of_fewer_groups():
    ref = clean_run(steps=STEPS)
    ok = loss_continuity(membership_run(steps=STEPS).history(), references=[ref])
    assert ok.status == "pass", ok.message
    alone = loss_continuity(membership_run(steps=STEPS, heal_at=7).history(), references=[ref])
    assert alone.status == "unknown", alone.message   # matching losses, but never judged so
    assert alone.message.startswith("steps 4..6 were committed by a quorum of fewer than 2")
    # a trajectory the smaller quorum moved is no false alarm: unknown, saying it differs
    b = membership_run(steps=STEPS, heal_at=7)
    for e in b.events:
        if e["ev"] == "record" and e.get("step", 0) >= 8 and "loss" in e:
            e["loss"] += 0.5
    assert loss_continuity(clean_run(steps=STEPS), references=[ref]).status == "pass"
    moved = loss_continuity(b.history(), references=[ref])
    assert moved.status == "unknown", moved.message
    assert moved.details["verdict_before"] == "fail"
    assert "the run differs from the clean run" in moved.message
    # the same difference without a smaller quorum is a fail
    b = membership_run(steps=STEPS)
    for e in b.events:
        if e["ev"] == "record" and e.get("step", 0) >= 8 and "loss" in e:
            e["loss"] += 0.5
    bad = loss_continuity(b.history(), references=[ref])
    assert bad.status == "fail", bad.message


def test_liveness_counts_steps_after_a_sigterm_in_that_process_only():
    """A preempted group's next process trains on after its heal: not 'kept training after
    SIGTERM'; the preempted process itself doing so is."""
    from pytest_reshard.checkers import liveness

    def run(restarted: bool):
        b = Builder(steps=8, faults=[{"kind": "preempt", "target": "rank:1", "step": 3,
                                      "phase": "forward", "params": {"grace_s": 10}}])
        b.sup("member", action="groups", groups=2, per=1, member_restarts=3)
        b.sup("gen_start", gen=0, world_size=2, roles=["trainer", "trainer"], launcher="fork")
        for r in (0, 1):
            b.rank(0, r, "start", world_size=2, role="trainer", pid=100 + r)
            b.rank(0, r, "signal", signal="SIGTERM", armed=True)
            b.rank(0, r, "resumed", step=0, source="fresh")
        for s in range(8):
            for r in (0, 1):
                if r == 1 and s == 4 and restarted:
                    b.rank(0, 1, "exit", code=0)
                    b.sup("member", action="restart", gen=0, group=1, ranks=[1],
                          incarnation="0.1", cause="preempted", codes={"1": 0}, restart=1,
                          fault_id=0)
                    b.rank(0, 1, "start", world_size=2, role="trainer", pid=200)
                b.rank(0, r, "begin", step=s)
                if r == 1 and s == 3:
                    b.rank(0, 1, "fault", step=3, phase="forward", kind="preempt", id=0,
                           params={"grace_s": 10})
                    b.rank(0, 1, "signal", signal="SIGTERM")
                b.rank(0, r, "end", step=s)
        for r in (0, 1):
            b.rank(0, r, "exit", code=0)
        b.sup("gen_end", gen=0, cause="complete", planned=False, fault_id=None, detail="")
        return liveness(b.history())

    assert run(restarted=True).status == "pass", run(restarted=True).message
    stayed = run(restarted=False)
    assert stayed.status == "fail" and "rank 1 kept training 4 steps after SIGTERM" in \
        stayed.message, stayed.message


def test_no_rewind_fails_two_quorums_committing_the_same_steps():
    """A split brain: each group formed a quorum of its own and committed the same steps."""
    b = membership_run(steps=STEPS)
    for e in b.events:
        if e["ev"] == "record" and "quorum" in e and e["rank"] == 1 and e["step"] >= 8:
            e["quorum"] = 9
    h = b.history()
    assert set(h.split_commits(0)) == set(range(8, STEPS))
    bad = no_rewind(h)
    assert bad.status == "fail", bad.message
    assert "step 8 was committed by group 0 in quorum 1 and group 1 in quorum 9 (4 steps in " \
           "all: 8..11)" in bad.message, bad.message
    assert no_rewind(membership_run(steps=STEPS).history()).status == "pass"


def test_a_zeroed_gradient_does_not_count_as_consumed():
    """--quorum async: a healing group trains a step with its gradient zeroed."""
    ref = clean_run(steps=STEPS)
    b = membership_run(steps=STEPS)
    for e in b.events:
        if e["ev"] == "record" and "quorum" in e and e["rank"] == 1 and e["step"] == 4:
            e["participating"] = False
    lost = exactly_once_samples(b.history(), reference=ref)
    assert lost.status == "fail", lost.message
    assert "2 samples the reference consumed by step 11 were never consumed" in lost.message


def test_samples_of_a_group_killed_after_its_backward_are_unknown_not_lost():
    """Killed at its optimizer point: its gradient was in the all-reduce that group 0's
    committed update of step 4 used, so its samples may well have been trained."""
    ref = clean_run(steps=STEPS)

    def run(phase: str):
        b = membership_run(steps=STEPS, kill_at=4, heal_at=5)
        out = []
        for e in b.events:
            if e["ev"] == "record" and e.get("step") == 4 and e["rank"] == 0 and "quorum" in e:
                e.update(quorum=1, participants=2)  # group 0 committed step 4 in the full quorum
            if e["ev"] == "fault" and e["rank"] == 1:
                out.append({"ev": "point", "t": e["t"] - 0.001, "gen": 0, "rank": 1, "step": 4,
                            "phase": phase})
            out.append(e)
        b.events = out
        return exactly_once_samples(b.history(), reference=ref)

    after = run("optimizer")
    assert after.status == "unknown", after.message
    assert "died after its backward (first: sample 17, step 4 on rank 1 (generation 0), which " \
           "died at its optimizer point)" in after.message, after.message
    before = run("backward")   # its gradient never left: the samples are lost
    assert before.status == "fail", before.message


def test_a_step_is_committed_by_one_incarnation_of_a_group_not_a_mix():
    """Group 1 (ranks 2, 3): rank 2 ended step 3 before the group was restarted, rank 3 only in
    the next incarnation; no incarnation of the group ended it on every rank."""
    b = Builder(steps=4, world_size=4)
    b.sup("member", action="groups", groups=2, per=2, member_restarts=3)
    b.sup("gen_start", gen=0, world_size=4, roles=["trainer"] * 4, launcher="fork")
    for r in range(4):
        b.rank(0, r, "start", world_size=4, role="trainer", pid=100 + r)
    for r in (2, 3):
        b.rank(0, r, "begin", step=3)
    b.rank(0, 2, "end", step=3)
    for r in (2, 3):
        b.rank(0, r, "start", world_size=4, role="trainer", pid=200 + r)
    b.rank(0, 3, "begin", step=3)
    b.rank(0, 3, "end", step=3)
    assert 3 not in b.history().committed(0)
    b.rank(0, 2, "begin", step=3)
    b.rank(0, 2, "end", step=3)
    assert 3 in b.history().committed(0)
