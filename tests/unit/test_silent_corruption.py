"""silent_corruption on hand-built histories: a bit flipped on rank 1 at step 4; rank 0 saves
after steps 2, 5 and 8; the clean run's saves hold ``m<step>``."""
from pytest_reshard.checkers import liveness, silent_corruption
from pytest_reshard.contract import GUARD, Ev
from pytest_reshard.history import SAVE
from tests.histories import Builder

FLIP = {"rank": 1, "step": 4, "phase": "optimizer", "kind": "bitflip", "id": 0,
        "params": {"tensor": "param", "bit": 30}}


def clean_saves():
    b = Builder(steps=10)
    b.gen(run=range(10), saves={s: {"model": f"m{s}"} for s in (2, 5, 8)})
    saves = {c.step: c for c in b.history().checkpoints(SAVE) if c.digest}
    return lambda gen: saves


def test_a_flip_that_reaches_a_save_unnoticed_fails_naming_the_save():
    b = Builder(steps=10)
    b.gen(run=range(10), fault=FLIP, saves={2: {"model": "m2"}, 5: {"model": "x5"},
                                            8: {"model": "x8"}})
    v = silent_corruption(b.history(), clean_saves())
    assert v.status == "fail" and "at step 4 (optimizer, generation 0) reached the checkpoint of " \
        "step 5 unnoticed: its model differ" in v.message, v.message


def test_a_flip_caught_before_any_save_and_resumed_from_the_save_before_passes():
    b = Builder(steps=10)
    b.gen(run=range(5), fault=FLIP, saves={2: {"model": "m2"}}, cause="failure")
    b.rank(0, 0, Ev.NOTE, what=GUARD, kind="sdc", step=4, detail="replicas differ")
    b.detect(0, "died", 0, 4, "end", expected=False)
    b.gen(resume=3, run=range(3, 10), load=(2, {"model": "m2"}),
          saves={5: {"model": "m5"}, 8: {"model": "m8"}})
    h = b.history()
    v = silent_corruption(h, clean_saves())
    assert v.status == "pass" and "rank 0's own check caught the flip at step 4" in v.message, v
    assert liveness(h).status == "pass", liveness(h)   # the death the guard chose is explained


def test_a_resume_from_a_corrupted_save_fails_even_after_the_guard_fired():
    b = Builder(steps=10)
    b.gen(run=range(7), fault=FLIP, saves={5: {"model": "x5"}}, cause="failure")
    b.rank(0, 0, Ev.NOTE, what=GUARD, kind="nan", step=6)
    b.gen(resume=6, run=range(6, 10), load=(5, {"model": "x5"}))
    v = silent_corruption(b.history(), clean_saves())
    assert v.status == "fail" and "reached the checkpoint of step 5 unnoticed" in v.message
    assert "(and 1 more)" in v.message and v.details["problems"][1].startswith(
        "generation 1 resumed from the checkpoint of step 5, which holds the corrupted state")


def test_a_job_that_notices_the_flip_and_saves_anyway_fails():
    """A guard that only warns: run.detected, then training and saving go on. The corrupted
    save is committed as surely as an unnoticed one."""
    b = Builder(steps=10)
    b.gen(run=range(10), fault=FLIP, saves={2: {"model": "m2"}})
    b.rank(0, 0, Ev.NOTE, what=GUARD, kind="sdc", step=4, detail="replicas differ")
    b.rank(0, 0, Ev.CKPT_SAVE, step=5, digest={"model": "x5"})
    v = silent_corruption(b.history(), clean_saves())
    assert v.status == "fail", v.message
    assert "reached the checkpoint of step 5 after rank 0's own check had caught it at step 4 " \
        "(sdc): its model differ from the clean run's; the job noticed and saved the corrupted " \
        "state anyway" in v.message, v.message
