"""downtime on hand-built histories: a migration's stall while the shard moves, its swap's pause,
checkpoint saves that are not stalls, and what it cannot measure."""
from __future__ import annotations

from typing import Mapping

from pytest_reshard.checkers import downtime
from pytest_reshard.contract import Ev
from tests.histories import Builder

STEP = 0.1  # seconds: a steady step


def migration(*, extra: Mapping[int, float] = {}, saves: Mapping[int, float] = {},
              asked: int = 3, swapped: int = 10, steps: int = 16, moved: int | None = 1,
              world: int = 2) -> Builder:
    """Two generations of ``world`` ranks handing over in place after ``swapped``; step ``s``
    ends ``STEP + extra[s]`` after the step before it, and ``saves[s]`` seconds of a save follow
    step ``s``. ``moved``: the rank a migration replaced (None: a live reshard)."""
    b = Builder(steps=steps, world_size=world)
    clock = [1000.0]

    def step(gen: int, s: int) -> None:
        clock[0] += STEP + extra.get(s, 0.0)
        for r in range(world):
            b.rank(gen, r, "begin", step=s)
            b.t = clock[0]
            b.rank(gen, r, "end", step=s)
        if s in saves:
            clock[0] += saves[s]
            for r in range(world):
                b.rank(gen, r, "ckpt_save", step=s, digest={}, seconds=saves[s])

    b.sup("gen_start", gen=0, world_size=world, roles=["trainer"] * world, launcher="fork")
    for r in range(world):
        b.rank(0, r, "start", world_size=world, role="trainer", pid=100 + r)
        b.rank(0, r, "resumed", step=0, source="fresh")
    for s in range(swapped + 1):
        step(0, s)
        if s == asked:
            for r in range(world):
                b.rank(0, r, Ev.LIVE, step=s)
    survivors = [None if r == moved else r for r in range(world)]
    b.sup("gen_end", gen=0, cause="reshard", planned=True, fault_id=0, detail="", live=True)
    b.sup("gen_start", gen=1, world_size=world, roles=["trainer"] * world, launcher="fork",
          by="migration" if moved is not None else "live reshard", survivors=survivors)
    for r in range(world):
        b.rank(1, r, "start", world_size=world, role="trainer", pid=200 + r)
        b.rank(1, r, "resumed", step=swapped + 1, source="live")
    for s in range(swapped + 1, steps):
        step(1, s)
    b.sup("gen_end", gen=1, cause="complete", planned=False, fault_id=None, detail="")
    return b


def test_a_migration_that_moved_the_shard_while_training_went_on_passes() -> None:
    v = downtime(migration(extra={11: 0.3}).history())    # the swap: 4 steps, within 10
    assert v.status == "pass", v
    assert v.message.startswith("the migration of rank 1's shard in generation 0 (asked after "
                                "step 3): swapped after step 10, a pause of 0.400 s (4.0 median "
                                "steps of 0.100 s), no step while it was prepared longer than "
                                "1.0"), v.message


def test_a_step_that_waited_for_the_joiner_fails_naming_the_moved_rank_and_the_step() -> None:
    v = downtime(migration(extra={5: 0.25}).history())    # 3.5 steps while the shard moved
    assert v.status == "fail", v
    assert v.message.startswith("the migration of rank 1's shard in generation 0 (asked after "
                                "step 3): the step ending at step 5 took 0.350 s, 3.5 median "
                                "steps of 0.100 s, while the handover was prepared (at most 2)"), \
        v.message
    assert (v.rank, v.step, v.generation) == (1, 5, 0)
    assert downtime(migration(extra={5: 0.25}).history(), max_stall_steps=4).status == "pass"


def test_a_checkpoint_save_in_the_window_is_not_a_stall_but_an_unrecorded_one_is() -> None:
    assert downtime(migration(saves={4: 0.5}).history()).status == "pass"
    v = downtime(migration(extra={5: 0.5}).history())     # the same time, no save said why
    assert v.status == "fail" and v.step == 5, v


def test_a_swap_that_takes_too_long_fails() -> None:
    v = downtime(migration(extra={11: 1.5}).history())    # 16 steps
    assert v.status == "fail", v
    assert "the swap after step 10 paused training 1.600 s, 16.0 median steps" in v.message
    assert (v.rank, v.step) == (1, 10)


def test_a_swap_under_a_second_is_no_stall_however_short_the_steps() -> None:
    v = downtime(migration(extra={11: 0.8}).history(), max_pause_steps=4)   # 9 steps, 0.9 s
    assert v.status == "pass", v
    assert "at most 4 (or 1 s) for the swap" in v.message, v.message


def test_a_live_reshard_is_judged_on_its_swap_alone() -> None:
    v = downtime(migration(asked=10, moved=None, extra={11: 0.3}).history())
    assert v.status == "pass", v
    assert v.message.startswith("the handover in generation 0 (asked after step 10): swapped "
                                "after step 10, a pause of 0.400 s"), v.message
    assert "while it was prepared" not in v.message.split(";")[0]


def test_downtime_says_unknown_when_it_cannot_measure() -> None:
    assert downtime(Builder().history()).status == "unknown"     # no handover
    v = downtime(migration(asked=1, swapped=1, steps=4).history())
    assert v.status == "unknown" and "steady steps around it" in v.message, v
    b = migration()
    b.events = [e for e in b.events if e["ev"] != Ev.LIVE]
    v = downtime(b.history())
    assert v.status == "unknown" and "without its ranks asking" in v.message, v
