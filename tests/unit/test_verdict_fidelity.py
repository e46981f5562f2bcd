"""Verdicts and messages that say what happened: each planted bug (or correct script a checker
used to fail) is run for real (tests/workloads/verdict_train.py, gloo, 2 ranks, 12 steps), or,
where no process is needed, judged on a hand-built history (tests/histories.py)."""
from __future__ import annotations


import pytest

from pytest_reshard import checkers
from pytest_reshard.checkers import exactly_once_samples, liveness, state_equivalence

from ..histories import DIGEST, Builder, clean_run, default_samples
from ..histories import reshard_run as resharded


pytestmark = pytest.mark.reshard(world_size=2, steps=12, timeout=60)


def _saves_and_loads(save: dict, load: dict, *, per_rank=("rng",), world=2) -> Builder:
    """A kill after step 5 (saved), a resume at step 6; ``save``/``load``: rank -> digest."""
    b = Builder(steps=10, world_size=world)
    g0 = b.gen(run=range(6), partial={6: [0]}, cause="failure", max_rewind=3)
    for r, d in save.items():
        b.rank(g0, r, "ckpt_save", step=5, digest=d, per_rank=list(per_rank))
    g1 = b.gen(resume=None, run=(), cause=None, max_rewind=3)
    for r, d in load.items():
        b.rank(g1, r, "ckpt_load", step=5, digest=d)
    for r in range(world):
        b.rank(g1, r, "resumed", step=6, source="checkpoint")
    for s in range(6, 10):
        for r in range(world):
            b.rank(g1, r, "begin", step=s)
            b.rank(g1, r, "record", step=s, loss=1.0, samples=default_samples(s, r, world))
            b.rank(g1, r, "end", step=s)
    b.sup("gen_end", gen=g1, cause="complete", planned=False, fault_id=None, detail="")
    return b


def test_a_per_rank_component_loaded_but_never_saved_by_that_rank_fails() -> None:
    """Rank 1 died before writing its RNG file; its load restored something else."""
    b = _saves_and_loads({0: {**DIGEST, "rng": "r0"}},
                         {0: {**DIGEST, "rng": "r0"}, 1: {"rng": "fresh"}})
    v = state_equivalence(b.history())
    assert v.status == "fail", v
    assert v.message.startswith("rng (per-rank) was loaded by rank 1 in generation 1 for step 5, "
                                "but rank 1 never saved its rng for step 5; rank 0 saved theirs")
    assert (v.step, v.rank, v.generation) == (5, 1, 1)


def test_a_rank_killed_while_writing_its_save_is_unknown_not_a_fail() -> None:
    """Killed at a file event of the save after writing some of its files: its record of the
    save is what is missing, maybe not the RNG file."""
    b = _saves_and_loads({0: {**DIGEST, "rng": "r0"}},
                         {0: {**DIGEST, "rng": "r0"}, 1: {"rng": "r1"}})
    b.rank(0, 1, "fault", step=5, phase="begin", kind="kill_at_file_event", id=0, params={})
    b.rank(0, 1, "file", op="close", path="ckpt/rng_1.pt", at_step=5, size=4, crc=1)
    b.rank(0, 1, "file", op="open", path="ckpt/state.json", at_step=5, killed="before")
    v = state_equivalence(b.history())
    assert v.status == "unknown", v
    assert "rank 1 loaded its rng for step 5 in generation 1, but it was killed inside that " \
           "save, after writing files of it" in v.message
    # killed at the save's first file event: it wrote nothing, so its file is missing: a fail
    b = _saves_and_loads({0: {**DIGEST, "rng": "r0"}},
                         {0: {**DIGEST, "rng": "r0"}, 1: {"rng": "r1"}})
    b.rank(0, 1, "file", op="open", path="ckpt/rng_1.pt", at_step=5, killed="before")
    assert state_equivalence(b.history()).status == "fail"


def test_per_rank_components_are_compared_rank_by_rank() -> None:
    good = _saves_and_loads({0: {**DIGEST, "rng": "r0"}, 1: {"rng": "r1"}},
                            {0: {**DIGEST, "rng": "r0"}, 1: {"rng": "r1"}})
    assert state_equivalence(good.history()).status == "pass"
    swapped = _saves_and_loads({0: {**DIGEST, "rng": "r0"}, 1: {"rng": "r1"}},
                               {0: {**DIGEST, "rng": "r1"}, 1: {"rng": "r0"}})
    v = state_equivalence(swapped.history())
    assert v.status == "fail" and v.message.startswith("rng state differs after the load of step 5 "
                                                       "in generation 1 (world size 2 -> 2) on "
                                                       "rank 0: what was saved by rank 0")
    assert "is the rng rank 1 saved: ranks read each other's per-rank files" in v.message


def test_a_replicated_component_loaded_but_never_saved_fails() -> None:
    b = _saves_and_loads({0: dict(DIGEST)}, {0: {**DIGEST, "ema": "e"}}, per_rank=())
    v = state_equivalence(b.history())
    assert v.status == "fail"
    assert v.message.startswith("ema was loaded by rank 0 in generation 1 for step 5, but no rank "
                                "saved ema for step 5")


def test_a_load_digest_recorded_after_a_step_began_is_not_failed() -> None:
    b = resharded(load=None)
    b.rank(1, 0, "ckpt_load", step=12, digest=dict(DIGEST, optimizer="moved-on"))  # at the end
    v = state_equivalence(b.history())
    assert v.status == "unknown", v
    assert "recorded after the rank began a step" in v.message


def test_the_earliest_load_digest_of_a_component_counts() -> None:
    b = resharded()                       # rank 0 recorded the right digest at the restore
    b.rank(1, 0, "ckpt_load", step=12, digest=dict(DIGEST, optimizer="moved-on"))
    assert state_equivalence(b.history()).status == "pass"


def _model_mismatch(savers: list[int], world_after: int) -> str:
    b = Builder(steps=10, world_size=2)
    b.gen(run=range(5), cause="reshard", planned=True)
    for r in savers:
        b.rank(0, r, "ckpt_save", step=4, digest={"model": "m"} if r == 0 else {})
    b.gen(world_size=world_after, resume=5, run=range(5, 10), load=(4, {"model": "other"}))
    return state_equivalence(b.history()).message


def test_the_model_hint_names_sharding_only_for_a_sharded_save() -> None:
    alone = _model_mismatch([0], 3)
    assert "rank 0 saved the model alone" in alone and "device mesh" not in alone
    sharded = _model_mismatch([0, 1], 3)
    assert "a sharded save" in sharded and "device mesh" in sharded


def test_a_per_rank_optimizer_shard_gets_a_zero_hint_not_a_dcp_one() -> None:
    b = _saves_and_loads({0: {"optimizer": "o0"}, 1: {"optimizer": "o1"}},
                         {0: {"optimizer": "o0"}, 1: {"optimizer": "bad"}}, per_rank=("optimizer",))
    v = state_equivalence(b.history())
    assert v.status == "fail" and "each rank saved its own optimizer" in v.message
    assert "get_state_dict" not in v.message


def test_an_older_checkpoints_state_is_named() -> None:
    b = Builder(steps=20)
    b.gen(run=range(13), cause="reshard", planned=True, saves={9: dict(DIGEST, model="old"),
                                                               12: DIGEST})
    b.gen(world_size=3, resume=13, run=range(13, 20), load=(12, dict(DIGEST, model="old")))
    v = state_equivalence(b.history())
    assert "is the model saved for step 9" in v.message, v.message


# -- 8: a repeat the clean run shows at the same step is an epoch --------------------------------
def _epochs(samples) -> Builder:
    """20 steps over a dataset of 40 samples (2 epochs of 10 steps), no epoch recorded."""
    b = Builder(steps=20)
    b.gen(run=range(20), samples=samples)
    return b


def _wrap(s, r, w):
    return list(range((s % 10) * 4, (s % 10) * 4 + 4))[r::w]


def test_exactly_once_tells_an_unrecorded_epoch_from_a_duplicate() -> None:
    reference = _epochs(_wrap).history()
    v = exactly_once_samples(_epochs(_wrap).history(), reference=reference)
    assert v.status == "pass", v
    assert v.message.startswith("40 sample ids consumed over 20 kept steps (steps 0..19), each as "
                                "often as in the clean run and at the same steps (80 "
                                "consumptions"), v.message
    assert exactly_once_samples(clean_run(), reference=clean_run()).message.startswith(
        "80 samples consumed exactly once over 20 kept steps (steps 0..19), none of the "
        "reference's lost")
    # a reshard at step 12 that restarts the data loader: step 13 re-reads step 0's batch
    restarted = Builder(steps=20)
    restarted.gen(run=range(13), cause="reshard", planned=True, samples=_wrap)
    restarted.gen(resume=13, run=range(13, 20), samples=lambda s, r, w: _wrap(s - 13, r, w))
    v = exactly_once_samples(restarted.history(), reference=reference)
    assert v.status == "fail", v
    assert v.message.startswith("sample 0 (epoch 0) consumed 3 times (the clean reference run "
                                "consumed it 2 times by step 19): at step 10 (generation 0, rank "
                                "0) and again at step 13 (generation 1, rank 0)"), v.message


def test_a_sample_lost_in_one_epoch_is_lost_though_its_id_comes_back() -> None:
    """Without epoch=, counting (role, epoch, sample) as a set would see rank 1's share of step
    13 at step 3 and call it consumed; the clean run consumed it twice by step 19."""
    reference = _epochs(_wrap).history()
    dropped = Builder(steps=20)
    dropped.gen(run=range(13), cause="reshard", planned=True, samples=_wrap)
    dropped.gen(resume=13, run=range(13, 20),   # rank 1 drops its share of step 13
                samples=lambda s, r, w: None if (s, r) == (13, 1) else _wrap(s, r, w))
    v = exactly_once_samples(dropped.history(), reference=reference)
    assert v.status == "fail", v
    assert v.message.startswith("2 samples the reference consumed by step 19 were consumed fewer "
                                "times than in the reference (1 of 2 for the first"), v.message
    assert "first sample 13 (epoch 0), reference step 13" in v.message


def test_a_run_that_began_but_kept_no_step_is_not_told_to_record_samples() -> None:
    """A timeout in step 0 on a script that records both: nothing to check, not nothing recorded."""
    b = Builder(steps=10)
    b.gen(run=(), partial={0: []}, cause="timeout", samples=lambda s, r, w: None)
    v = exactly_once_samples(b.history())
    assert v.status == "unknown" and "s.record" not in v.message
    assert v.message.startswith("no step completed on every rank")


def test_no_reference_is_run_for_a_run_that_never_started() -> None:
    b = Builder(steps=10)
    b.gen(run=(), resume=None, cause="timeout")
    asked: list = []
    ctx = checkers.CheckContext(b.history(), reference_runs=lambda roles: asked.append(roles))
    verdicts = checkers.run_all(ctx)
    assert asked == []
    for name in ("loss_continuity", "exactly_once_samples"):
        assert verdicts[name].status == "unknown"
        assert "the run never started" in verdicts[name].message
        assert "no clean reference run was started" in verdicts[name].message


def test_a_fault_whose_victim_was_gone_does_not_blame_the_fault_point() -> None:
    """Rank 1 was killed from outside at step 3; the kill planned at step 6 never fired. Before:
    "does it call s.point('backward')?" of a script that marks backward in every step."""
    fault = {"kind": "kill", "target": "rank:1", "step": 6, "phase": "backward", "params": {}}
    b = Builder(steps=10, faults=[fault])
    b.gen(run=range(3), partial={3: [0]}, cause="failure")
    for e in [e for e in b.events if e["ev"] == "begin"]:
        b.rank(e["gen"], e["rank"], "point", step=e["step"], phase="backward")
    b.detect(0, "died", 1, 3, "forward", expected=False, exit_code=-9)
    b.sup("unfired", fault_id=0, detail="")
    v = liveness(b.history())
    unfired = next(p for p in v.details["problems"] if "never fired" in p)
    assert "s.point" not in unfired
    assert "its target was gone before it got there: rank 1 died (killed by signal 9) at step 3, " \
           "phase forward (generation 0)" in unfired
