from __future__ import annotations

import dataclasses

import pytest

from ..histories import DIGEST, Builder, clean_run, default_loss, reshard_run
from pytest_reshard import checkers
from pytest_reshard.checkers import (SPREAD_FACTOR, exactly_once_samples, liveness,
                                     loss_continuity, measure_spread, no_rewind,
                                     one_step_checkpoint, state_equivalence)
from pytest_reshard.contract import ADVICE, NOT_INJECTED, Ev
from pytest_reshard.history import History
from pytest_reshard.verdict import Verdict, combine

KILL = {"kind": "kill", "target": "rank:1", "step": 14, "phase": "backward", "params": {}}


def killed_run(*, resume: int, max_rewind: int | None = None, steps: int = 20) -> Builder:
    """Rank 1 is SIGKILLed in step 14 (backward); generation 1 resumes at ``resume``."""
    b = Builder(steps=steps, faults=[KILL])
    b.gen(run=range(14), partial={14: [0]}, cause="failure", fault_id=0, max_rewind=max_rewind,
          saves={9: DIGEST},
          fault={"rank": 1, "step": 14, "phase": "backward", "kind": "kill", "id": 0})
    b.detect(0, "died", 1, 14, "backward", expected=True, exit_code=-9)
    b.gen(resume=resume, run=range(resume, steps), max_rewind=max_rewind, load=(resume - 1, DIGEST))
    return b


# -- verdict ---------------------------------------------------------------------------------
def test_verdict_str_and_combine_priority() -> None:
    ok = Verdict.passed("a", "fine")
    unk = Verdict.unknown("b", "cannot tell")
    bad = Verdict.failed("c", "broke", step=3, rank=1, generation=2, fault="kill(rank:1)",
                         replay="replay me")
    assert str(bad) == ("FAIL c: broke [step 3, rank 1, generation 2, fault kill(rank:1)] "
                        "(replay: replay me)")
    assert str(ok) == "PASS a: fine"
    assert combine([ok, unk]).status == "unknown"
    both = combine([ok, unk, bad])
    assert (both.status, both.step, both.replay) == ("fail", 3, "replay me")
    assert both.message.startswith("c fail: broke; b unknown")
    assert combine([ok]).status == "pass" and combine([]).status == "unknown"
    with pytest.raises(ValueError):
        Verdict("maybe", "x", "y")


# -- no_rewind -------------------------------------------------------------------------------
def test_no_rewind_passes_a_clean_planned_reshard() -> None:
    v = no_rewind(reshard_run().history())
    assert v.status == "pass", v
    assert "replayed no committed step" in v.message


def test_no_rewind_single_generation() -> None:
    assert no_rewind(clean_run()).status == "pass"


def test_no_rewind_fails_a_planned_reshard_that_restarts_from_zero() -> None:
    h = reshard_run(resume=0, run=range(0, 20), load=None).history()
    v = no_rewind(h)
    assert v.status == "fail"
    assert v.message.startswith(
        "generation 1 resumed at step 0 after a planned reshard (shift_shards(all) at step 12 "
        "optimizer notice_s=1 to_world_size=3): committed steps 0..12 replayed (13 steps, "
        "budget 0)")
    assert (v.step, v.generation) == (0, 1)
    assert v.fault and v.fault.startswith("shift_shards")
    # the registry attaches the run's replay command to every verdict it files
    filed = checkers.get("no_rewind").run(checkers.CheckContext(h))
    assert filed == dataclasses.replace(v, replay=h.replay) and filed.replay


def test_no_rewind_fails_an_unplanned_kill_beyond_the_declared_budget() -> None:
    v = no_rewind(killed_run(resume=10, max_rewind=2).history())
    assert v.status == "fail"
    assert "after an unplanned failure (kill(rank:1) at step 14 backward)" in v.message
    assert "committed steps 10..13 replayed (4 steps, budget 2)" in v.message
    assert "max_rewind_steps=2" in v.message


def test_no_rewind_undeclared_budget_is_zero() -> None:
    v = no_rewind(killed_run(resume=13).history())
    assert v.status == "fail" and "budget 0" in v.message and "declared so, or unset" in v.message


def test_no_rewind_allows_redoing_the_in_flight_step_and_a_declared_budget() -> None:
    assert no_rewind(killed_run(resume=14).history()).status == "pass"   # 14 never committed
    v = no_rewind(killed_run(resume=10, max_rewind=5).history())
    assert v.status == "pass" and "replayed 4 of budget 5" in v.message


def test_no_rewind_fails_a_resume_that_skips_steps() -> None:
    v = no_rewind(reshard_run(resume=15, run=range(15, 20)).history())
    assert v.status == "fail"
    assert "generation 1 resumed at step 15 but the last step finished before was 12: steps " \
           "13..14 were never run" in v.message


def test_no_rewind_catches_a_workload_that_declares_one_resume_and_runs_another() -> None:
    # declares resume at 13 but re-runs 10..12 too
    b = reshard_run(resume=13, run=range(10, 20))
    v = no_rewind(b.history())
    assert v.status == "fail" and "committed steps 10..12 replayed (3 steps" in v.message


def test_no_rewind_charges_a_discarded_step_only_once() -> None:
    b = Builder(steps=30)
    b.gen(run=range(21), cause="failure", max_rewind=11)
    b.gen(resume=10, run=range(10, 16), partial={16: [0]}, cause="failure", max_rewind=11)
    b.gen(resume=16, run=range(16, 30), max_rewind=11)
    v = no_rewind(b.history())
    assert v.status == "pass", v
    assert [len(t["replayed"]) for t in v.details["transitions"]] == [11, 0]


def test_no_rewind_skip_is_measured_against_the_surviving_lineage() -> None:
    b = Builder(steps=30)
    b.gen(run=range(21), cause="failure", max_rewind=20)
    b.gen(resume=10, run=range(10, 13), cause="failure", max_rewind=20)
    b.gen(resume=18, run=range(18, 30), max_rewind=20)   # 13..17 ran only in the discarded gen 0
    v = no_rewind(b.history())
    assert v.status == "fail" and "steps 13..17 were never run" in v.message


# -- loss_continuity -------------------------------------------------------------------------
def test_measure_spread() -> None:
    a = clean_run(world_size=2)
    b = clean_run(world_size=3, loss=lambda s: default_loss(s) + (3e-7 if s == 5 else 1e-8))
    assert measure_spread(a, b) == pytest.approx(3e-7)
    with pytest.raises(ValueError, match="share no step"):
        measure_spread(a, clean_run(loss=lambda s: None))


def two_sizes(noise=lambda s: 1e-8 * (s % 3)) -> list:
    """Clean runs at 2 and 3 ranks that differ by reduction-order noise only."""
    return [clean_run(world_size=2), clean_run(world_size=3, loss=lambda s: default_loss(s) + noise(s))]


def test_loss_continuity_passes_within_the_noise_floor() -> None:
    run = reshard_run(loss=lambda s: default_loss(s) + (2e-7 if s > 12 else 0.0)).history()
    v = loss_continuity(run, references=two_sizes(lambda s: 1e-7))
    assert v.status == "pass", v
    assert v.message.startswith("generation 0 (2 ranks, steps 0..12): identical to the clean run "
                                "at that size; generation 1 (3 ranks, steps 13..19, resumed at "
                                "step 13 after 2 ranks): within 10x the per-step spread"), v.message
    assert v.details["regimes"][5] == "same" and v.details["regimes"][15] == "cross"


def test_loss_continuity_names_a_spike_at_the_resume_point() -> None:
    run = reshard_run(loss=lambda s: default_loss(s) + (0.0123 if s == 13 else 0.0)).history()
    v = loss_continuity(run, references=two_sizes(lambda s: 1e-6))
    assert v.status == "fail"
    assert v.message.startswith("loss spike at resume point step 13 (generation 1):")
    assert "in the clean run at 3 ranks (off by 0.0123, 1.23e+03x the tolerance)" in v.message
    assert "tolerance 10x the largest difference between those clean runs up to step 13 (1e-06)" \
        in v.message
    assert (v.step, v.generation) == (13, 1) and v.fault.startswith("shift_shards")


def test_loss_continuity_names_drift_after_the_resume() -> None:
    # the optimizer-moments trap: the first loss after the resume matches, then it drifts
    run = reshard_run(loss=lambda s: default_loss(s) + (0.01 * (s - 13) if s > 13 else 0)).history()
    v = loss_continuity(run, references=two_sizes(lambda s: 1e-6))
    assert v.status == "fail"
    assert "departs from the reference at step 14 (generation 1, 1 step after the resume at step 13)" in v.message
    assert "worst at step 19" in v.message and v.step == 14


def test_loss_continuity_at_one_size_is_bit_exact() -> None:
    """A resume at the size the run never left is the clean run's own computation: a deviation
    of 1e-5 is a bug there, however far clean runs at other sizes are apart."""
    b = Builder(steps=20, faults=[KILL])
    b.gen(run=range(14), partial={14: [0]}, cause="failure", fault_id=0, saves={9: DIGEST},
          fault={"rank": 1, "step": 14, "phase": "backward", "kind": "kill", "id": 0})
    b.gen(resume=10, run=range(10, 20), load=(9, DIGEST),
          loss=lambda s: default_loss(s) + (1e-5 if s >= 12 else 0.0))
    v = loss_continuity(b.history(), reference=clean_run())
    assert v.status == "fail", v
    assert v.message.startswith("loss departs from the reference at step 12 (generation 1, 2 "
                                "steps after the resume at step 10)")
    assert "the run never left 2 ranks before this step, so it must match that clean run bit " \
           "for bit" in v.message
    exact = Builder(steps=20, faults=[KILL])
    exact.gen(run=range(14), partial={14: [0]}, cause="failure", fault_id=0, saves={9: DIGEST},
              fault={"rank": 1, "step": 14, "phase": "backward", "kind": "kill", "id": 0})
    exact.gen(resume=10, run=range(10, 20), load=(9, DIGEST))
    v = loss_continuity(exact.history(), reference=clean_run())
    assert v.status == "pass" and "generation 1 (2 ranks, steps 10..19, resumed at step 10): " \
        "identical to the clean run at that size" in v.message, v.message


def test_loss_continuity_floor_is_per_step_not_the_runs_maximum() -> None:
    """Clean runs agree to 1e-4 after the first update until step 16, then a loss-scaler
    overflow at one size only makes them 0.09 apart: a deviation of 0.02 at step 14 is 20x that
    step's tolerance."""
    refs = two_sizes(lambda s: 0.0 if s == 0 else 1e-4 if s < 16 else 0.09)
    bug = reshard_run(loss=lambda s: default_loss(s) + (0.02 if s == 14 else 0.0)).history()
    assert 0.02 < SPREAD_FACTOR * measure_spread(*refs)  # the old run-wide floor hid it
    v = loss_continuity(bug, references=refs)
    assert v.status == "fail" and "step 14" in v.message and "19.9x the tolerance" in v.message
    # after the divergence a run that tracks its own size's clean run still passes
    ok = reshard_run(loss=lambda s: default_loss(s) + (0.09 if s >= 16 else 1e-4)).history()
    v = loss_continuity(ok, references=refs)
    assert v.status == "pass", v
    assert "from step 16, where the clean runs at 2 ranks and 3 ranks diverge, it tracks the " \
           "clean run at its own size" in v.message
    # one that tracks neither is unknown: the clean runs no longer bound what is noise
    off = reshard_run(loss=lambda s: default_loss(s) + (0.04 if s >= 16 else 1e-4)).history()
    v = loss_continuity(off, references=refs)
    assert v.status == "unknown" and v.message.startswith(
        "training depends on the world size: the clean runs at 2 ranks and 3 ranks differ by "
        "0.09 from step 16 on"), v.message


def test_loss_continuity_is_unknown_when_training_depends_on_the_world_size() -> None:
    """The linear LR scaling rule: the clean runs part from step 1 by far more than reduction
    order can do. Nothing after the reshard can be judged against them; never pass."""
    refs = [clean_run(world_size=2),
            clean_run(world_size=3, loss=lambda s: default_loss(1.5 * s))]
    run = reshard_run(loss=lambda s: default_loss(s if s <= 12 else 12 + 1.5 * (s - 12))).history()
    v = loss_continuity(run, references=refs)
    assert v.status == "unknown", v
    assert v.message.startswith("training depends on the world size: the clean runs at 2 ranks "
                                "and 3 ranks differ by 0.0791 from step 1 on (their loss moved ")
    assert "steps 13..19 of generations that crossed world sizes cannot be judged" in v.message
    assert "only where nothing depends on the world size: the global batch, the learning rate" in v.message
    assert "generation 0 (2 ranks, steps 0..12): identical to the clean run" in v.message
    # the global batch changes with the world size: apart from step 0, before any update
    refs = [clean_run(world_size=2), clean_run(world_size=3, loss=lambda s: default_loss(s) + 0.07)]
    v = loss_continuity(reshard_run().history(), references=refs)
    assert v.status == "unknown" and "differ by 0.07 from step 0 (before any update" in v.message


def test_loss_continuity_fails_a_jump_at_a_resume_point() -> None:
    """A resume that never loads the model, under the LR scaling rule: the floors cannot judge
    it, but the loss leaps back to where training began, more than a clean run ever moved."""
    refs = [clean_run(world_size=2),
            clean_run(world_size=3, loss=lambda s: default_loss(1.5 * s))]
    run = reshard_run(loss=lambda s: default_loss(s if s <= 12 else s - 13)).history()
    v = loss_continuity(run, references=refs)
    assert v.status == "fail", v
    assert v.message.startswith("loss jumps at resume point step 13 (generation 1, 3 ranks): from "
                                "0.909091 at step 12 to 2, a move of 1.09; the clean runs never "
                                "moved more than 0.261 in 1 step"), v.message
    assert v.details["jumps"] == [13]


def test_loss_continuity_when_one_size_is_not_deterministic() -> None:
    """Generation 0 before its first fault repeats the clean run: where it differs, that
    difference is the same-size floor, and a resume beyond it is unknown, not a verdict."""
    def noisy(s):
        return default_loss(s) + (3e-6 if s % 2 else 0.0)

    b = Builder(steps=20, faults=[KILL])
    b.gen(run=range(14), partial={14: [0]}, cause="failure", fault_id=0, saves={9: DIGEST},
          fault={"rank": 1, "step": 14, "phase": "backward", "kind": "kill", "id": 0}, loss=noisy)
    b.gen(resume=10, run=range(10, 20), load=(9, DIGEST),
          loss=lambda s: noisy(s) + (1e-3 if s == 15 else 0.0))
    v = loss_continuity(b.history(), reference=clean_run())
    assert v.status == "unknown", v
    assert v.message.startswith("the workload is not bit-exact at one world size: before any "
                                "fault, generation 0 differs from the clean run at 2 ranks by up "
                                "to 3e-06, and steps 15 differ")
    b2 = Builder(steps=20, faults=[KILL])
    b2.gen(run=range(14), partial={14: [0]}, cause="failure", fault_id=0, saves={9: DIGEST},
           fault={"rank": 1, "step": 14, "phase": "backward", "kind": "kill", "id": 0}, loss=noisy)
    b2.gen(resume=10, run=range(10, 20), load=(9, DIGEST), loss=noisy)
    v = loss_continuity(b2.history(), reference=clean_run())
    assert v.status == "pass" and "same-size nondeterminism measured before the first fault" \
        in v.message, v.message


def test_loss_continuity_missing_steps() -> None:
    skipped = reshard_run(resume=15, run=range(15, 20)).history()
    v = loss_continuity(skipped, references=two_sizes())
    assert v.status == "fail" and "no loss for kept steps 13..14" in v.message
    short = Builder()
    short.gen(run=range(10), cause="failure")
    v = loss_continuity(short.history(), reference=clean_run())
    assert v.status == "unknown" and "steps 10..19 were never compared" in v.message
    assert loss_continuity(clean_run(), reference=None).status == "unknown"
    nolo = clean_run(loss=lambda s: None)
    assert loss_continuity(nolo, reference=clean_run()).status == "unknown"
    # no clean run at the second topology: those steps cannot be judged
    v = loss_continuity(reshard_run().history(), reference=clean_run())
    assert v.status == "unknown" and v.message.startswith("no clean run at 3 ranks to judge "
                                                           "steps 13..19 against")


# -- exactly_once_samples --------------------------------------------------------------------
def test_exactly_once_passes_a_clean_reshard() -> None:
    v = exactly_once_samples(reshard_run().history(), reference=clean_run())
    assert v.status == "pass", v
    assert "80 samples consumed exactly once over 20 kept steps" in v.message


def test_exactly_once_duplicate_across_a_reshard() -> None:
    # generation 1 restarts its data loader at the epoch start: step 13 re-reads step 0's batch
    run = reshard_run(samples=lambda s, r, w: list(range((s - 13) * 4, (s - 12) * 4))[r::w])
    v = exactly_once_samples(run.history())
    assert v.status == "fail"
    assert v.message.startswith("sample 0 (epoch 0) consumed twice: at step 0 (generation 0, "
                                "rank 0) and again at step 13 (generation 1, rank 0)")
    assert "data position was not restored" in v.message
    assert (v.step, v.generation, v.rank) == (13, 1, 0) and v.fault.startswith("shift_shards")


def test_exactly_once_duplicate_between_ranks_of_one_step() -> None:
    # the new world size is ignored: every rank takes the whole batch
    run = reshard_run(samples=lambda s, r, w: list(range(s * 4, s * 4 + 4)))
    v = exactly_once_samples(run.history())
    assert v.status == "fail"
    assert "at step 13 (generation 1, rank 0) and at step 13 (generation 1, rank 1)" in v.message
    assert "two ranks of one step" in v.message


def test_exactly_once_allows_one_consumption_per_role() -> None:
    b = Builder(world_size=2, steps=5)
    b.gen(run=range(5), roles=["target", "drafter"], samples=lambda s, r, w: [s])
    assert exactly_once_samples(b.history()).status == "pass"


def test_exactly_once_reports_lost_samples_against_a_reference() -> None:
    # generation 1 draws one batch ahead: step 13's batch is never consumed
    run = reshard_run(samples=lambda s, r, w: list(range((s + 1) * 4, (s + 2) * 4))[r::w])
    v = exactly_once_samples(run.history(), reference=clean_run())
    assert v.status == "fail"
    assert v.message.startswith("4 samples the reference consumed by step 19 were never consumed: "
                                "first sample 52 (epoch 0), reference step 13")


def test_exactly_once_judges_sample_ids_past_64_bits_as_any_other() -> None:
    # Sample ids are the user's: a hash of a document may not fit an int64.
    big = 1 << 70

    def run(first: int, ahead: int = 0) -> History:   # gen 1 draws from step ``first``'s batch
        b = Builder(steps=10)
        b.gen(run=range(5), saves={4: DIGEST},
              samples=lambda s, r, w: [big + x for x in range(s * 4, s * 4 + 4)][r::w])
        b.gen(resume=5, load=(4, DIGEST), run=range(5, 10), samples=lambda s, r, w: [
            big + x for x in range((s - 5 + first + ahead) * 4, (s - 4 + first + ahead) * 4)][r::w])
        return b.history()

    assert exactly_once_samples(run(5)).status == "pass"
    v = exactly_once_samples(run(3))
    assert v.status == "fail" and v.message.startswith(
        f"sample {big + 12} (epoch 0) consumed twice: at step 3 (generation 0, rank 0) and again "
        "at step 5 (generation 1, rank 0)")
    v = exactly_once_samples(run(5, ahead=1), reference=run(5))
    assert v.status == "fail" and f"first sample {big + 20} (epoch 0), reference step 5" in v.message


def test_exactly_once_lost_sample_of_a_discarded_step() -> None:
    b = Builder()
    b.gen(run=range(5), partial={5: [0]}, cause="failure")
    b.gen(resume=5, run=range(5, 20), samples=lambda s, r, w: list(range(s * 4 + 4, s * 4 + 8))[r::w]
          if s >= 5 else None)
    v = exactly_once_samples(b.history(), reference=clean_run())
    assert v.status == "fail" and "drawn at step 5 in generation 0, whose effect was discarded" \
        in v.message


def test_exactly_once_unknown_without_samples() -> None:
    b = Builder()
    b.gen(run=range(3), samples=lambda s, r, w: None)
    assert exactly_once_samples(b.history()).status == "unknown"


# -- state_equivalence -----------------------------------------------------------------------
def test_state_equivalence_passes_a_bit_exact_resharded_load() -> None:
    v = state_equivalence(reshard_run().history())
    assert v.status == "pass", v
    assert state_equivalence(clean_run()).message == "single generation: no reshard to check"


def test_state_equivalence_cannot_pass_a_restart_that_ignored_a_saved_state() -> None:
    """A generation that starts at step 0 although a save came before loaded nothing: no state
    was carried over, so nothing says it would have survived (unknown, not a vacuous pass);
    starting over before any save there is nothing to carry."""
    b = Builder()
    b.gen(run=range(6), cause="failure", saves={3: DIGEST})
    b.gen(resume=0, run=range(6))
    v = state_equivalence(b.history())
    assert v.status == "unknown", v
    assert v.message.startswith("generation 1 started at step 0 although step 3 was saved "
                                "before it: nothing was loaded"), v.message
    b = Builder()
    b.gen(run=range(3), cause="failure")
    b.gen(resume=0, run=range(6))
    assert state_equivalence(b.history()).status == "pass"


def test_state_equivalence_names_the_component_that_differs() -> None:
    bad = dict(DIGEST, optimizer="ffff")
    v = state_equivalence(reshard_run(load=(12, bad)).history())
    assert v.status == "fail"
    assert v.message.startswith("optimizer state differs after the resharded load of step 12 in "
                                "generation 1 (world size 2 -> 3) on rank 0")
    assert (v.step, v.generation, v.rank) == (12, 1, 0) and v.details["differ"] == ["optimizer"]


def test_state_equivalence_holds_a_load_against_a_save_begun_but_never_recorded_done() -> None:
    """A crash after the save's last write and before its record (killed at the folder fsync
    that follows the rename) leaves only the checkpoint_saving record: the load is held
    against what that save was writing; without it, unknown, naming the call."""
    for loaded, status in (({"model": "m3"}, "pass"), ({"model": "other"}, "fail")):
        b = Builder()
        b.gen(run=range(4), cause="failure")
        b.rank(0, 0, Ev.CKPT_SAVING, step=3, digest={"model": "m3"})
        b.gen(resume=4, run=range(4, 6), load=(3, loaded))
        assert state_equivalence(b.history()).status == status
    b = Builder()
    b.gen(run=range(4), cause="failure")
    b.gen(resume=4, run=range(4, 6), load=(3, {"model": "m3"}))
    v = state_equivalence(b.history())
    assert v.status == "unknown" and "run.checkpoint_saving(step" in v.message, v


def test_state_equivalence_judges_a_live_handover_as_a_save_and_a_load() -> None:
    def live(b: Builder) -> Builder:
        for e in b.events:
            if e["ev"] in ("ckpt_save", "ckpt_load"):
                e["source"] = "live"
        return b

    assert state_equivalence(live(reshard_run()).history()).status == "pass"
    v = state_equivalence(live(reshard_run(load=(12, dict(DIGEST, model="ffff")))).history())
    assert v.status == "fail"
    assert "the model was handed over in memory (a live reshard) and rank 0 holds something " \
           "else" in v.message, v.message


def test_state_equivalence_uses_expected_when_nothing_was_saved() -> None:
    b = Builder()
    b.gen(run=range(5), cause="failure")
    b.gen(resume=5, run=range(5, 20), load=(4, DIGEST), load_expected=DIGEST)
    assert state_equivalence(b.history()).status == "pass"
    b = Builder()
    b.gen(run=range(5), cause="failure")
    b.gen(resume=5, run=range(5, 20), load=(4, DIGEST), load_expected=dict(DIGEST, data="0"))
    v = state_equivalence(b.history())
    assert v.status == "fail" and "data state differs" in v.message and "expected digest" in v.message


def test_state_equivalence_names_record_modes_digests_when_state_went_undigested() -> None:
    # record mode takes no digest of state= unless asked: the verdict says how to ask
    b = reshard_run(load=None)
    b.rank(1, 0, "ckpt_load", step=12, digest={}, undigested=["model", "opt"])
    v = state_equivalence(b.history())
    assert v.status == "unknown" and "took no digest of the state it was given (model, opt)" \
        in v.message and "RESHARD_RECORD_DIGESTS=1" in v.message


def test_state_equivalence_unknown_without_digests() -> None:
    v = state_equivalence(reshard_run(load=None).history())
    assert v.status == "unknown" and "run.checkpoint_saved" in v.message
    assert "generation 1 resumed at step 13 without recording a load digest" in v.message
    b = Builder()
    b.gen(run=range(5), cause="failure")
    b.gen(resume=5, run=range(5, 20), load=(4, DIGEST))      # no save, no expected
    assert state_equivalence(b.history()).status == "unknown"


# -- one_step_checkpoint ---------------------------------------------------------------------
def live_states(b: Builder, gen: int, steps: range) -> Builder:
    """Rank 0 records its live state after each step: model ``m<step>``, optimizer ``o<step>``."""
    for s in steps:
        b.rank(gen, 0, Ev.STATE, step=s, digest={"model": f"m{s}", "optimizer": f"o{s}"})
    return b


def resumed_from(loaded: dict[str, str], *, live: bool = True) -> History:
    b = Builder()
    b.gen(run=range(9), cause="failure", saves={7: {"model": "m7", "optimizer": "o7"}})
    if live:
        live_states(b, 0, range(9))
    b.gen(resume=8, run=range(8, 20), load=(7, loaded))
    return b.history()


def test_one_step_checkpoint_passes_a_load_that_holds_the_step_it_was_saved_at() -> None:
    v = one_step_checkpoint(resumed_from({"model": "m7", "optimizer": "o7", "data": "d"}))
    assert v.status == "pass" and v.message.startswith("the one save or load judged held"), v


def test_one_step_checkpoint_names_the_steps_a_mixed_checkpoint_holds() -> None:
    v = one_step_checkpoint(resumed_from({"model": "m8", "optimizer": "o7"}))
    assert v.status == "fail", v
    assert v.message.startswith("the checkpoint of step 7 that rank 0 loaded in generation 1 "
                                "mixes steps: model of step 8; optimizer of step 7."), v.message
    assert (v.step, v.generation) == (7, 1) and v.details["mixed"][0][4]["model"] == [8]


def test_one_step_checkpoint_names_a_checkpoint_wholly_of_a_later_step() -> None:
    v = one_step_checkpoint(resumed_from({"model": "m8", "optimizer": "o8"}))
    assert v.status == "fail"
    assert "holds step 8 (model and optimizer), not the step it was saved at" in v.message, v


def test_one_step_checkpoint_cannot_name_steps_without_live_states() -> None:
    v = one_step_checkpoint(resumed_from({"model": "m8", "optimizer": "o7"}, live=False))
    assert v.status == "unknown" and "run.state_after" in v.message, v
    v = one_step_checkpoint(resumed_from({"model": "x", "optimizer": "y"}))
    assert v.status == "unknown" and "model and optimizer of a save or load matched no step" \
        in v.message and "DDP wrapper" in v.message, v


def test_one_step_checkpoint_judges_what_a_save_wrote_even_when_nothing_is_loaded() -> None:
    b = Builder()
    b.gen(run=range(9))
    live_states(b, 0, range(9))    # an async save's record comes after later steps' states
    b.rank(0, 0, Ev.CKPT_SAVE, step=7, digest={"model": "m8", "optimizer": "o7"})
    v = one_step_checkpoint(b.history())
    assert v.status == "fail" and v.message.startswith(
        "the checkpoint of step 7 that rank 0 saved in generation 0 mixes steps: model of step 8"), v
    b = Builder()
    b.gen(run=range(9))
    live_states(b, 0, range(9))
    v = one_step_checkpoint(b.history())
    assert v.status == "unknown" and "no save or load recorded digests" in v.message, v


# -- liveness --------------------------------------------------------------------------------
def test_liveness_passes_a_complete_run_with_an_expected_kill() -> None:
    v = liveness(killed_run(resume=14).history())
    assert v.status == "pass", v
    assert liveness(reshard_run().history()).status == "pass"


def test_liveness_fails_a_fault_that_fired_but_could_not_be_injected() -> None:
    """The rank noted that its injector refused (NOT_INJECTED): whatever the watch made of the
    death that followed, the run never faced the fault, so it cannot pass."""
    b = killed_run(resume=10)
    b.rank(0, 1, Ev.NOTE.value, what=NOT_INJECTED, step=14, fault_id=0,
           reason="kill_node needs ranks under a node's agent")
    v = liveness(b.history())
    assert v.status == "fail", v
    assert "could not be injected: kill_node needs ranks under a node's agent" in v.message
    assert "never faced it" in v.message and (v.rank, v.generation) == (1, 0)


def test_liveness_names_an_unexpected_stop() -> None:
    b = Builder()
    b.gen(run=range(17), partial={17: [0, 1]}, cause="hang")
    b.detect(0, "stopped", 1, 17, "backward", expected=False)
    b.gen(resume=17, run=range(17, 20))
    v = liveness(b.history())
    assert v.status == "fail"
    assert v.message.startswith("rank 1 stopped responding at step 17, phase backward "
                                "(generation 0)")
    assert (v.rank, v.step, v.generation) == (1, 17, 0)


def test_liveness_target_not_reached() -> None:
    b = Builder(steps=20)
    b.gen(run=range(15), cause="failure")
    v = liveness(b.history())
    assert v.status == "fail"
    assert "step 19 never committed in the final generation 0 (last committed step 14)" in v.message


def test_liveness_silent_death_of_a_drafter() -> None:
    b = Builder(world_size=3, steps=5)
    b.gen(run=range(5), partial={s: [0, 1] for s in range(5)}, roles=["target", "target",
                                                                     "drafter"])
    v = liveness(b.history())
    assert v.status == "fail"
    assert "rank 2 (role drafter) of generation 0 finished no step while ranks 0, 1 finished up " \
           "to step 4: it died silently" in v.message


def test_liveness_unfired_fault_missing_start_and_timeout() -> None:
    b = Builder(steps=30, faults=[{"kind": "kill", "target": "rank:1", "step": 25,
                                   "phase": "backward", "params": {}}])
    b.gen(run=range(30), started=[0, 1], world_size=3, cause="timeout")
    b.sup("unfired", fault_id=0, detail="")
    v = liveness(b.history())
    assert v.status == "fail"
    problems = v.details["problems"]
    assert "rank 2 of generation 0 never recorded a start" in problems[0]
    assert "fault kill(rank:1) at step 25 backward never fired: no rank ever marked the point " \
           "'backward'; does the workload call s.point('backward')?" in problems
    assert any("hit its timeout in generation 0" in p for p in problems)


def test_liveness_without_scenario_is_unknown() -> None:
    b = Builder(scenario=False)
    b.gen(run=range(3))
    assert liveness(b.history()).status == "unknown"


# -- registry --------------------------------------------------------------------------------
def test_the_registry_runs_every_checker_that_applies_to_a_history() -> None:
    """A context without a scenario or clean runs: the checkers that need a reference say
    unknown; the pipeline, token, memory and CUDA checkers do not apply."""
    verdicts = checkers.run_all(checkers.CheckContext(reshard_run().history()))
    assert list(verdicts) == ["no_rewind", "loss_continuity", "exactly_once_samples",
                              "state_equivalence", "liveness", "poisoned_commit"]
    assert verdicts["loss_continuity"].status == "unknown"
    assert "no reference run" in verdicts["loss_continuity"].message
    assert all(verdicts[c].status == "pass" for c in ("no_rewind", "state_equivalence", "liveness"))


def test_the_registry_gives_clean_runs_from_the_context() -> None:
    calls: list[list[str]] = []

    def reference(roles):
        calls.append(list(roles))
        return clean_run()

    ctx = checkers.CheckContext(reshard_run().history(), reference_runs=reference)
    verdicts = checkers.run_all(ctx)
    assert combine(list(verdicts.values())).status == "pass", verdicts
    # the first topology, then the run's second one (the noise floor); asked for once
    assert [len(r) for r in calls] == [2, 3]


def test_a_reference_that_did_not_finish_makes_loss_and_samples_unknown() -> None:
    b = Builder(steps=20)
    b.gen(run=range(5), cause="failure")
    ctx = checkers.CheckContext(reshard_run().history(), reference_runs=lambda roles: b.history())
    verdicts = checkers.run_all(ctx)
    for name in ("loss_continuity", "exactly_once_samples"):
        assert verdicts[name].status == "unknown"
        assert verdicts[name].message.startswith("the clean reference run (world size 2) did not "
                                                 "finish: the run did not reach its target")


def test_liveness_when_the_supervisor_gave_up() -> None:
    b = Builder(steps=20)
    b.gen(run=range(3), cause="failure")
    b.sup("gen_end", gen=1, cause="error", planned=False, fault_id=None,
          detail="gave up after 1 generations")
    v = liveness(b.history())
    assert v.status == "fail" and "generation 1 ended by error: gave up" in v.message
    assert no_rewind(b.history()).status == "pass"


@pytest.mark.parametrize("delivered,arrives_after,last_step,flagged", [
    (False, ("fault", 5), 5, set()),    # raised by the rank at the point; it stops after step 5
    (False, ("fault", 5), 7, {6, 7}),   # ... and trains two more steps: the fail
    (False, None, 7, {6, 7}),           # ... no arrival recorded (SIGTERM ignored): from the point
    (True, ("begin", 6), 6, set()),     # a scheduler's SIGTERM lands in step 6; it stops after it
    (True, ("end", 6), 7, set()),       # ... lands between steps 6 and 7: step 7 may begin
    (True, ("end", 5), 6, set()),       # ... lands right after the fault's own step: step 6 may
    (True, ("end", 5), 7, {7}),         # ... but not step 7
    (True, ("begin", 6), 8, {7, 8}),    # ... lands in step 6, and it trains 7 and 8: the fail
    (True, None, 11, set()),            # ... never lands: the rank finished first
])
def test_training_after_sigterm_counts_from_where_the_signal_arrived(delivered, arrives_after,
                                                                     last_step, flagged) -> None:
    from pytest_reshard.checkers.liveness import _trained_after_sigterm

    fault = {"rank": 0, "step": 5, "phase": "forward", "kind": "preempt", "id": 0}
    b = Builder(steps=12, world_size=1, faults=[{"kind": "preempt", "target": "all", "step": 5,
                                                 "phase": "forward", "params": {"grace_s": 5}}])
    b.gen(run=range(0, last_step + 1), cause="preempt", planned=True, fault_id=0, fault=fault)
    if delivered:
        b.sup("deliver", gen=0, fault_id=0, kind="preempt", grace_s=5.0)
    if arrives_after is not None:
        ev, step = arrives_after
        at = next(i for i, e in enumerate(b.events) if e["ev"] == ev and e.get("step") == step)
        b.events.insert(at + 1, {"ev": "signal", "signal": "SIGTERM", "gen": 0, "rank": 0,
                                 "t": b.events[at]["t"] + 0.001})
    problems = _trained_after_sigterm(b.history())
    assert [p["steps"] for p in problems] == ([flagged] if flagged else [])


@pytest.mark.parametrize("armed,exit_fields,unknown", [
    (True, {}, False),                          # the probe's flag was on until it exited
    (False, {}, True),                          # never asked run.stop_requested()
    (True, {"sigterm_replaced": True}, True),   # another handler took SIGTERM over
    (True, None, True),                         # no run.close(): it cannot say
])
def test_a_scheduler_sigterm_never_recorded_is_a_pass_only_when_the_probe_would_have_seen_it(
        armed, exit_fields, unknown) -> None:
    """A scheduler was asked to preempt, the rank recorded no SIGTERM and ran to the end: it
    finished before the signal landed, or it ignored it; only the probe's flag tells."""
    fault = {"rank": 0, "step": 5, "phase": "forward", "kind": "preempt", "id": 0}
    b = Builder(steps=12, world_size=1, faults=[{"kind": "preempt", "target": "all", "step": 5,
                                                 "phase": "forward", "params": {"grace_s": 5}}])
    b.gen(run=range(0, 12), cause=None, fault=fault)
    if armed:
        at = next(i for i, e in enumerate(b.events) if e["ev"] == "resumed")
        b.events.insert(at + 1, {"ev": "signal", "signal": "SIGTERM", "armed": True, "gen": 0,
                                 "rank": 0, "t": b.events[at]["t"] + 0.001})
    b.sup("deliver", gen=0, fault_id=0, kind="preempt", grace_s=5.0)
    if exit_fields is not None:
        b.rank(0, 0, "exit", code=0, **exit_fields)
    b.sup("gen_end", gen=0, cause="complete", planned=False, fault_id=0, detail="")
    v = liveness(b.history())
    assert v.status == ("unknown" if unknown else "pass"), v
    if unknown:
        assert "recorded no SIGTERM after the scheduler was asked to preempt" in v.message


def test_loss_continuity_a_resume_across_sizes_may_move_as_a_change_of_size_does() -> None:
    """Dropout drawn per rank: the clean runs at 2 and 3 ranks differ from step 0, before any
    update, so a resume at 3 ranks may land that far off the 2-rank curve: unknown (the docs'
    promise for training that depends on the size), not a jump. A leap beyond it still fails."""
    def flat(s: int) -> float:
        return 1.0 - 0.001 * s

    def resharded(offset: float) -> History:
        b = reshard_run(loss=lambda s: flat(s) + offset)
        for e in b.events:  # generation 0 on the 2-rank curve
            if e.get("gen") == 0 and e["ev"] == "record" and "loss" in e:
                e["loss"] = flat(e["step"])
        return b.history()

    refs = [clean_run(world_size=2, loss=flat), clean_run(world_size=3, loss=lambda s: flat(s) + 0.05)]
    v = loss_continuity(resharded(-0.07), references=refs)
    assert v.status == "unknown", v
    assert v.message.startswith("training depends on the world size: the clean runs at 2 ranks and "
                                "3 ranks differ by 0.05 from step 0 (before any update"), v.message
    v = loss_continuity(resharded(-0.2), references=refs)
    assert v.status == "fail", v
    assert v.message.startswith("loss jumps at resume point step 13 (generation 1, 3 ranks)"), v.message
    assert "0.05 apart at this step across world sizes (0.05 before any update)" in v.message


def test_a_crashed_ranks_message_quotes_its_last_traceback_above_the_exit_noise(tmp_path) -> None:
    """What a process prints at exit (triton's leak report, say) can push the traceback that killed
    it out of the quoted tail: the message names its last frame and exception first."""
    from pytest_reshard.checkers._text import _log_tail

    log = tmp_path / "logs" / "g0-r1.log"
    log.parent.mkdir()
    log.write_text("step 0\nTraceback (most recent call last):\n"
                   '  File "train.py", line 40, in <module>\n    main()\n'
                   '  File "train.py", line 12, in main\n    raise RuntimeError("shard map is stale")\n'
                   "RuntimeError: shard map is stale\n" + "".join(f"leak report line {i}\n" for i in range(30)))
    text = _log_tail(tmp_path, 0, 1)
    assert ('has a traceback: File "train.py", line 12, in main: raise RuntimeError("shard map is '
            'stale") -> RuntimeError: shard map is stale; the log ends:') in text, text
    assert text.endswith("leak report line 29")
    log.write_text("step 0\nRuntimeError: short\n")  # a tail that shows everything: no repeat
    assert "traceback" not in _log_tail(tmp_path, 0, 1)


def test_a_flooded_log_is_read_from_its_end_only(tmp_path) -> None:
    """A rank that printed 64 MiB: the message still quotes its traceback and last line, and the
    harness reads about a MiB of it, not the whole file."""
    import tracemalloc

    from pytest_reshard.checkers._text import LOG_TAIL_BYTES, _log_tail

    log = tmp_path / "logs" / "g0-r1.log"
    log.parent.mkdir()
    with open(log, "w") as f:
        f.write("x" * 100 + "\n" + ("flood " * 1000 + "\n") * (64 * 1024 * 1024 // 6001))
        f.write('Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
                "    boom()\nRuntimeError: boom\n" + "".join(f"exit noise {i}\n" for i in range(20)))
    tracemalloc.start()
    try:
        text = _log_tail(tmp_path, 0, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "RuntimeError: boom" in text and text.endswith("exit noise 19"), text[-300:]
    assert peak < 8 * LOG_TAIL_BYTES, peak


def test_liveness_a_flip_no_generation_read_back_is_unknown_never_a_pass() -> None:
    """A byte flipped at the run's final save lands in a checkpoint nothing resumes from: the
    corruption was never put to the test, so every checker passing says nothing about it."""
    b = Builder(steps=20)
    b.gen(run=range(20))
    b.rank(0, 0, "file", op="flip", path="ckpt/step_19/model.pt", offset=100, at_step=19)
    v = liveness(b.history())
    assert v.status == "unknown", v
    assert "the byte flipped in `ckpt/step_19/model.pt` (generation 0, step 19) was never read back" \
        in v.message, v.message
    b = Builder(steps=20)   # flipped earlier, then a generation resumed after it: judged as usual
    b.gen(run=range(0, 13), cause="failure")
    b.rank(0, 0, "file", op="flip", path="ckpt/step_11/model.pt", offset=100, at_step=11)
    b.gen(resume=12, run=range(12, 20))
    assert "never read back" not in liveness(b.history()).message


def test_state_equivalence_a_load_that_holds_an_older_steps_state_fails() -> None:
    """An asynchronous save whose finalize reads the step late labels step 3's state "step 4": the
    resume claims step 4 and loads, bit for bit, what was saved for step 3. Fail, naming both."""
    d = {2: {"model": "m2", "optimizer": "o2"}, 3: {"model": "m3", "optimizer": "o3"}}
    b = Builder(steps=12)
    b.gen(run=range(0, 6), cause="failure", saves=d)
    b.gen(resume=5, run=range(5, 12), load=(4, d[3]))
    v = state_equivalence(b.history())
    assert v.status == "fail", v
    assert v.message.startswith("the load in generation 1 claims step 4 but holds what was saved for "
                                "step 3 (model, optimizer equal, bit for bit, on rank 0)"), v.message
    # a state that never changes between saves cannot tell two steps apart: unknown, as before
    same = {2: {"rng": "r"}, 3: {"rng": "r"}}
    b = Builder(steps=12)
    b.gen(run=range(0, 6), cause="failure", saves=same)
    b.gen(resume=5, run=range(5, 12), load=(4, same[3]))
    assert state_equivalence(b.history()).status == "unknown"


def test_state_equivalence_names_each_differing_components_own_save() -> None:
    """A replicated model and a per-rank RNG both differ on rank 1: each is named with the save it
    was compared with, in one readable sentence."""
    b = Builder(steps=12)
    b.gen(run=range(0, 6), cause="failure", saves={4: {"model": "m4"}})
    b.rank(0, 1, "ckpt_save", step=4, digest={"rng": "r1"}, per_rank=["rng"])
    b.gen(resume=5, run=range(5, 12), load=(4, {"model": "m4"}))
    for e in b.events:   # rank 1's load digest, taken at the restore
        if e.get("gen") == 1 and e.get("rank") == 1 and e["ev"] == "ckpt_load":
            e.update(digest={"model": "XX", "rng": "YY"}, per_rank=["rng"])
    v = state_equivalence(b.history())
    assert v.status == "fail", v
    assert ("on rank 1: what was saved (model saved in generation 0; rng saved by rank 1 in "
            "generation 0) does not match what was loaded (model: m4 -> XX, rng: r1 -> YY)") in v.message, \
        v.message


def test_state_equivalence_leads_with_the_rank_whose_own_state_differs() -> None:
    """A migration's joiner (rank 1) swapped in a wrong shard: the whole-model digest (rank 0's)
    and rank 1's own shard both differ, and the verdict names rank 1."""
    b = Builder(steps=12)
    b.gen(run=range(0, 6), cause="reshard", saves={4: {"model": "m4"}})
    for r in (0, 1):
        b.rank(0, r, "ckpt_save", step=4, digest={"shard": f"s{r}"}, per_rank=["shard"])
    b.gen(resume=5, run=range(5, 12), load=(4, {"model": "XX"}))
    for e in b.events:
        if e.get("gen") == 1 and e["ev"] == "ckpt_load":
            e.update(digest={**e["digest"], "shard": "bad" if e["rank"] == 1 else "s0"},
                     per_rank=["shard"])
    v = state_equivalence(b.history())
    assert v.status == "fail" and v.rank == 1, v
    assert v.message.startswith("shard state differs after the load of step 4 in generation 1 "
                                "(world size 2 -> 2) on rank 1"), v.message
    assert "(2 mismatching loads in all)" in v.message


def test_state_equivalence_a_rank_killed_at_the_commit_point_is_unknown_not_never_saved() -> None:
    """HF Trainer, ``kill_during_save(rank=1, boundary="commit")``: rank 1 wrote its RNG file, then
    died before the callback recorded the whole save. Whether its file holds its state cannot be
    told from digests: unknown (crash_consistency judges the files), not "never saved"."""
    b = Builder(steps=12)
    b.gen(run=range(0, 5), cause="failure", saves={4: {"model": "m4"}},
          fault={"rank": 1, "step": 4, "phase": "checkpoint_commit", "kind": "kill", "id": 0})
    b.rank(0, 0, "ckpt_save", step=4, digest={"rng": "r0"}, per_rank=["rng"])
    b.gen(resume=5, run=range(5, 12), load=(4, {"model": "m4"}))
    for e in b.events:   # both ranks restore their own RNG at the load
        if e.get("gen") == 1 and e["ev"] == "ckpt_load":
            e["digest"] = {**e["digest"], "rng": f"r{e['rank']}"}
            e["per_rank"] = ["rng"]
    v = state_equivalence(b.history())
    assert v.status == "unknown", v
    assert "rank 1 loaded its rng for step 4 in generation 1, but it was killed inside that save" \
        in v.message, v.message


def _killed_at_commit(rank1_loads: str, *, saving: bool = True, saved: bool = False) -> History:
    """HF's commit-point kill of rank 1 at step 4, which recorded (``saving``) the RNG it was
    writing, "r1", and restores ``rank1_loads`` at the resume. ``saved``: rank 1 was not killed
    but recorded its save, without the RNG (its file never written)."""
    b = Builder(steps=12)
    b.gen(run=range(0, 5), cause="failure", saves={4: {"model": "m4"}},
          fault=None if saved else
          {"rank": 1, "step": 4, "phase": "checkpoint_commit", "kind": "kill", "id": 0})
    b.rank(0, 0, "ckpt_save", step=4, digest={"rng": "r0"}, per_rank=["rng"])
    if saving:
        b.rank(0, 1, Ev.CKPT_SAVING, step=4, digest={"rng": "r1"}, per_rank=["rng"])
    if saved:
        b.rank(0, 1, Ev.CKPT_SAVE, step=4, digest={"model": "m4"}, per_rank=["rng"])
    b.gen(resume=5, run=range(5, 12), load=(4, {"model": "m4"}))
    for e in b.events:
        if e.get("gen") == 1 and e["ev"] == Ev.CKPT_LOAD:
            e.update(digest={**e["digest"], "rng": "r0" if e["rank"] == 0 else rank1_loads},
                     per_rank=["rng"], digest_at="restore")
    return b.history()


def test_state_equivalence_judges_a_rank_killed_inside_its_save_by_what_it_was_writing() -> None:
    """Rank 1 recorded what it was about to write, then died before the save's end: its restore
    of exactly that passes; a restore of anything else (its file never finished, a fresh RNG)
    fails, naming the unfinished save."""
    v = state_equivalence(_killed_at_commit("r1"))
    assert v.status == "pass", v
    v = state_equivalence(_killed_at_commit("fresh"))
    assert v.status == "fail", v
    assert ("what was being saved by rank 1 in generation 0 (a save it never recorded as done) "
            "does not match what was loaded (rng: r1 -> fresh)") in v.message, v.message
    assert state_equivalence(_killed_at_commit("r1", saving=False)).status == "unknown"
    # it finished the save without its RNG file (a Trainer that wrote none): never saved
    v = state_equivalence(_killed_at_commit("fresh", saved=True))
    assert v.status == "fail" and "rank 1 never saved its rng for step 4" in v.message, v


def _shrink(component: str, *, to: int = 2, carried: bool = False) -> History:
    """4 -> ``to`` ranks after step 3: every rank saves its own ``component`` (per-rank) with the
    replicated DIGEST on rank 0, and each survivor loads back exactly its own (``carried``: rank 0
    loads rank 3's instead, as a merge that takes it over verbatim would)."""
    b = Builder(steps=8, world_size=4, faults=[{
        "kind": "shift_shards", "target": "all", "step": 3, "phase": "optimizer",
        "params": {"to_world_size": to, "notice_s": 1}}])
    b.gen(run=range(0, 4), cause="reshard", planned=True, fault_id=0, saves={3: DIGEST})
    for e in b.events:
        if e["ev"] == Ev.CKPT_SAVE:
            e.update(digest={**e["digest"], component: f"p{e['rank']}"}, per_rank=[component])
    b.gen(world_size=to, resume=4, run=range(4, 8), load=(3, DIGEST))
    for e in b.events:
        if e.get("gen") == 1 and e["ev"] == Ev.CKPT_LOAD:
            mine = "p3" if carried and e["rank"] == 0 else f"p{e['rank']}"
            e.update(digest={**e["digest"], component: mine}, per_rank=[component])
    return b.history()


def test_state_equivalence_names_per_rank_state_the_leaving_ranks_took_with_them() -> None:
    """4 -> 2: ranks 2 and 3 saved their own data position, and nobody loaded it. Whether that
    lost samples the digests cannot tell: unknown, naming the component and the ranks (it used
    to pass, silently)."""
    v = state_equivalence(_shrink("data_pos"))
    assert v.status == "unknown", v
    assert ("data_pos (per-rank) saved by ranks 2, 3 in generation 0 for step 3 was loaded by no "
            "rank of generation 1 (world size 4 -> 2): it left with ranks 2, 3 at the shrink") \
        in v.message, v.message
    assert "save it consolidated" in v.message, v.message


def test_state_equivalence_says_a_leaving_ranks_rng_stream_was_dropped_and_passes() -> None:
    """An RNG stream cannot be carried to another world size (HF's rng_state_3.pth at 4 -> 2):
    the verdict says so, and passes on the loads it verified."""
    v = state_equivalence(_shrink("rng"))
    assert v.status == "pass", v
    assert "rng (per-rank) saved by ranks 2, 3 in generation 0 for step 3 was loaded by no rank" \
        in v.message, v.message
    assert len(v.details["dropped"]) == 1


def test_state_equivalence_reports_no_drop_without_a_shrink_or_when_a_survivor_took_it() -> None:
    same = state_equivalence(_shrink("data_pos", to=4))
    assert same.status == "pass" and not same.details["dropped"], same
    # rank 0 loaded rank 3's verbatim: rank 3's is not dropped (rank 2's is), and rank 0's own
    # comparison fails ("ranks read each other's per-rank files")
    took = state_equivalence(_shrink("data_pos", carried=True))
    assert took.status == "fail" and "ranks read each other's" in took.message, took
    assert [d.split(" in generation")[0] for d in took.details["dropped"]] == \
        ["data_pos (per-rank) saved by rank 2"], took.details


def test_a_hint_never_blames_a_save_made_after_the_load() -> None:
    """A wrong model loaded at step 4 goes on to be saved at step 8: that later save holds what
    was loaded, and is no 'other step's checkpoint' the load read."""
    wrong = {**DIGEST, "model": "zzzz"}
    b = Builder(steps=10)
    b.gen(run=range(5), cause="failure", saves={4: DIGEST})
    b.gen(resume=5, run=range(5, 10), load=(4, wrong), saves={8: wrong})
    v = state_equivalence(b.history())
    assert v.status == "fail" and "model" in v.message, v.message
    assert "step 8" not in v.message and "another step's checkpoint" not in v.message, v.message


def test_a_per_rank_rng_hint_speaks_of_file_names_not_zero_shards() -> None:
    b = Builder(steps=8)
    b.gen(run=range(4), cause="failure")
    for r in range(2):   # each rank saves its own RNG stream at step 3
        b.rank(0, r, "ckpt_save", step=3, digest={"rng": f"rng{r}"}, per_rank=["rng"])
    b.gen(resume=4, cause=None)
    for r in range(2):   # and loads one it was seeded with, before its first step
        b.rank(1, r, "ckpt_load", step=3, digest={"rng": "seeded"}, per_rank=["rng"])
    b.sup("gen_end", gen=1, cause="complete", planned=False, fault_id=None, detail="")
    v = state_equivalence(b.history())
    assert v.status == "fail" and "rng" in v.message.lower(), v.message
    assert "ZeRO" not in v.message and "file under another name" in v.message, v.message


def test_only_a_random_streams_state_counts_as_an_rng() -> None:
    from pytest_reshard.checkers.state_equivalence import _is_rng

    assert all(_is_rng(n) for n in ("rng", "cuda_rng_state", "torch_random_state", "generator",
                                    "numpy_random"))
    assert not any(_is_rng(n) for n in ("random_sampler", "data_generator_position", "strongly",
                                        "sampler"))


def test_a_workloads_advice_replaces_the_checkers_generic_one() -> None:
    """An adapter that knows why the resume went wrong says so in its framework's terms
    (``run.advise``): the failing or unknown verdict gives that, not probe-call advice."""
    said = "pass trainer.train(resume_from_checkpoint=get_last_checkpoint(...))"
    b = Builder(steps=10)
    b.gen(run=range(0, 5), cause="failure", max_rewind=2)
    b.gen(resume=0, run=range(0, 10), max_rewind=2)
    b.rank(1, 0, Ev.NOTE, what=ADVICE, check="no_rewind", text=said)
    v = no_rewind(b.history())
    assert v.status == "fail" and v.message.endswith(said) and "max_rewind_steps" not in v.message, v
    b = Builder(steps=4)
    b.gen(run=range(4), samples=lambda *_: None)
    b.rank(0, 0, Ev.NOTE, what=ADVICE, check="exactly_once_samples", text="add a sample_id column")
    v = exactly_once_samples(b.history())
    assert v.status == "unknown" and v.message.endswith("add a sample_id column"), v


def _mixed(idle_fast: float, *, mode: str = "cgroup", record: bool = True):
    """A 2-rank heterogeneous run: rank 0 (h100) idles ``idle_fast`` of each step."""
    b = Builder(steps=4, world_size=2)
    b.sup("devices", gen=0, classes=["h100", "a100"], speeds=[1.0, 0.32], mode=mode, why="")
    b.gen(run=range(4), samples=lambda step, rank, world: None)
    if record:
        for step in range(4):
            for rank, (samples, compute, wait) in enumerate(
                    [(list(range(3)), 1.0 - idle_fast, idle_fast), ([3], 1.0, 0.0)]):
                b.rank(0, rank, "record", step=step, samples=samples, compute_s=compute,
                       wait_s=wait)
    return b.history()


def test_balance_fails_the_idlest_rank_naming_its_class_and_share_and_passes_a_balanced_world():
    from pytest_reshard.checkers import balance

    v = balance(_mixed(0.4))
    assert v.status == "fail" and v.rank == 0 and v.generation == 0, v.message
    assert v.message.startswith("generation 0, steps 1-3: rank 0 (h100, 75% of the samples) idled "
                                "40% of "
                                "its steps waiting at the collectives for rank 1 (a100, 25% "), v
    ok = balance(_mixed(0.05))
    assert ok.status == "pass" and "at most 5% idle" in ok.message, ok.message
    assert balance(_mixed(0.05, mode="stretch")).status == "unknown"
    assert "record, each step" in balance(_mixed(0.05, record=False)).message
    assert "not a heterogeneous world" in balance(clean_run()).message


def test_a_stall_shows_the_stacks_file_with_the_workloads_own_frames(tmp_path) -> None:
    """The stack dump's own file (under node agents the log is the node's), read innermost
    first: where it waits, then the script's frames, the library's between left out."""
    from pytest_reshard.checkers._text import _stack
    from pytest_reshard.contract import RunDir

    lib = "/venv/lib/python3.11/site-packages/torch/distributed"
    RunDir(tmp_path).logs.mkdir(parents=True)
    RunDir(tmp_path).stacks(0, 2).write_text(
        "Thread 0x00007f (most recent call first):\n"
        f'  File "{lib}/distributed_c10d.py", line 4394 in all_gather_single\n'
        f'  File "{lib}/c10d_logger.py", line 83 in wrapper\n'
        '  File "/job/train.py", line 51 in step\n'
        '  File "/job/train.py", line 90 in <module>\n')
    assert _stack(tmp_path, 0, 2) == (
        f'; its main thread was in: File "{lib}/distributed_c10d.py", line 4394 in '
        'all_gather_single <- File "/job/train.py", line 51 in step <- File "/job/train.py", '
        'line 90 in <module> (1 library frame left out)')
    assert _stack(tmp_path, 0, 1) == ""      # no dump, and no log


def test_liveness_fails_a_rank_that_trained_on_without_its_peers() -> None:
    """Rank 1 ended steps 6 and 7 that rank 0 never ended (one step past the last common one is
    a death mid-step, as in a kill): in a fixed world it swallowed a failed collective."""
    b = Builder(steps=10)
    b.gen(run=range(5), partial={5: [1], 6: [1], 7: [1]}, cause="failure")
    b.gen(resume=5, run=range(5, 10))
    v = liveness(b.history())
    assert v.status == "fail", v
    assert v.message.startswith("rank 1 (role trainer) of generation 0 ended steps 6..7 that "
                                "rank 0 never ended (all of them ended up to step 4)"), v.message
    assert (v.rank, v.step, v.generation) == (1, 6, 0)
    assert liveness(killed_run(resume=10).history()).status == "pass"   # one step past: a kill


def test_liveness_names_an_old_owner_that_went_on_after_its_shard_moved() -> None:
    """Rank 1's shard moved to a new process after step 4; its old process ended 6..7 anyway."""
    b = Builder(steps=10)
    b.gen(run=range(5), partial={5: [1], 6: [1], 7: [1]}, cause="reshard")
    b.events[-1]["live"] = True
    b.gen(resume=5, run=range(5, 10))
    start = next(e for e in b.events if e["ev"] == "gen_start" and e["gen"] == 1)
    start.update(by="migration", survivors=[0, None])
    v = liveness(b.history())
    assert v.status == "fail" and (v.rank, v.step, v.generation) == (1, 6, 0), v
    assert v.message.endswith("its shard had moved to a new process (rank 1 of generation 1), "
                              "and the old owner went on beside it"), v.message


def test_liveness_lets_a_producer_run_ahead_through_its_queue() -> None:
    """A pipeline's producer shares no collective with its peers: with a queue of depth 2 it may
    end two steps the dead peer never ended; a third is past any queue, so it swallowed an error."""
    def run(alone: list[int]) -> Builder:
        b = Builder(steps=10)
        b.gen(run=range(5), partial={s: [1] for s in alone}, cause="failure")
        for s in range(5):
            b.rank(0, 1, "record", step=s, queue=2)
        b.gen(resume=5, run=range(5, 10))
        return b

    assert liveness(run([5, 6]).history()).status == "pass"
    v = liveness(run([5, 6, 7]).history())
    assert v.status == "fail" and (v.rank, v.step) == (1, 7), v
