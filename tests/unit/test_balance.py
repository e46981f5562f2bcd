"""balance on hand-built histories: a rank without timings is never taken for a balanced one."""
from __future__ import annotations

from typing import Mapping, Sequence

from pytest_reshard.checkers.balance import balance
from pytest_reshard.contract import Ev
from pytest_reshard.verdict import FAIL, PASS, UNKNOWN
from tests.histories import Builder

MIX = ["h100", "a100"]


def _gen(b: Builder, steps: range, idle: Mapping[int, float], *, classes: Sequence[str] = MIX,
         untimed: Mapping[int, Sequence[int]] | None = None, resume: int = 0,
         transfer: float = 0.0, period_s: float | None = None, step_s: float = 1.0) -> int:
    """A generation of ``classes`` running ``steps``: rank r idles ``idle[r]`` of each step, then
    every rank waits ``transfer`` more for the collective itself; rank r records no timings in
    the steps ``untimed[r]`` (every step when it is ``steps``). A step lasts ``step_s``; with
    ``period_s`` the ranks are capped by cgroups of that quota period."""
    gen = b.next_gen
    b.sup(Ev.DEVICES, gen=gen, classes=list(classes), speeds=[1.0] * len(classes),
          mode="cgroup", why="", **({"period_s": period_s} if period_s else {}))
    b.gen(world_size=len(classes), run=steps, resume=resume, samples=lambda *_: None)
    for step in steps:
        for rank in range(len(classes)):
            timings = {} if step in (untimed or {}).get(rank, ()) else \
                {"compute_s": step_s * (1.0 - idle[rank]), "wait_s": step_s * (idle[rank] + transfer)}
            b.rank(gen, rank, Ev.RECORD, step=step, samples=[rank], **timings)
    return gen


def test_every_rank_timed_and_balanced_passes():
    b = Builder(steps=4)
    _gen(b, range(4), {0: 0.05, 1: 0.0})
    v = balance(b.history())
    assert v.status == PASS and v.message.startswith("generation 0, steps 1-3: at most 5% idle"), v.message


def test_an_unbalanced_world_fails_naming_the_idlest_rank():
    b = Builder(steps=4)
    _gen(b, range(4), {0: 0.4, 1: 0.0})
    v = balance(b.history())
    assert v.status == FAIL and (v.rank, v.generation) == (0, 0), v.message
    assert v.message.startswith("generation 0, steps 1-3: rank 0 (h100, 50% of the samples) idled 40%"), v


def test_the_collectives_own_transfer_is_no_idle_time():
    """Every rank waits 0.5 s each step for the transfer: the last to arrive waits that alone."""
    b = Builder(steps=4)
    _gen(b, range(4), {0: 0.0, 1: 0.0}, transfer=0.5)
    v = balance(b.history())
    assert v.status == PASS and v.message.startswith("generation 0, steps 1-3: at most 0% idle"), v.message
    b = Builder(steps=4)
    _gen(b, range(4), {0: 0.4, 1: 0.0}, transfer=0.5)
    v = balance(b.history())   # 0.4 s of rank 0's 1.5 s step
    assert v.status == FAIL and v.rank == 0 and "idled 27%" in v.message, v.message


def test_steps_too_short_for_the_cgroup_cap_are_unknown_not_judged():
    """5 ms steps under a 10 ms quota period: an even split looks balanced, the cap never bit."""
    b = Builder(steps=4)
    _gen(b, range(4), {0: 0.0, 1: 0.0}, period_s=0.01, step_s=0.005)
    v = balance(b.history())
    assert v.status == UNKNOWN and v.generation == 0, v.message
    assert v.message.startswith("generation 0: rank 0 (h100) computed a median 5.0 ms a step, "
                                "rank 1 (a100) computed a median 5.0 ms a step: under 3 quota "
                                "periods of a cgroup cap (10 ms each)"), v.message
    b = Builder(steps=4)
    _gen(b, range(4), {0: 0.0, 1: 0.0}, period_s=0.01, step_s=0.031)
    assert balance(b.history()).status == PASS


def test_a_rank_without_timings_makes_the_verdict_unknown_not_a_pass():
    """Rank 1 (the fast one here) idles 90% but records no timings: judging rank 0 alone passed."""
    b = Builder(steps=4)
    _gen(b, range(4), {0: 0.0, 1: 0.9}, untimed={1: range(4)})
    v = balance(b.history())
    assert v.status == UNKNOWN and v.generation == 0, v.message
    assert v.message.startswith("generation 0: rank 1 (a100) recorded no compute_s= and wait_s= "
                                "in 3 of the 3 steps judged (steps 1-3"), v.message
    assert "record, each step, on every rank" in v.message


def test_a_rank_timed_in_only_some_steps_is_unknown():
    b = Builder(steps=6)
    _gen(b, range(6), {0: 0.0, 1: 0.0}, untimed={0: [3, 4]})
    v = balance(b.history())
    assert v.status == UNKNOWN and "rank 0 (h100) recorded no compute_s= and wait_s= in 2 of the " \
        "5 steps judged" in v.message, v.message


def test_an_untimed_generation_after_a_change_of_the_mix_is_unknown():
    """Generation 0 timed and balanced; generation 1 (a new mix) recorded no timings at all."""
    b = Builder(steps=8, world_size=2)
    _gen(b, range(4), {0: 0.0, 1: 0.0})
    _gen(b, range(4, 8), {0: 0.5, 1: 0.5, 2: 0.5}, classes=["l40s"] * 3, resume=4,
         untimed={r: range(4, 8) for r in range(3)})
    v = balance(b.history())
    assert v.status == UNKNOWN and v.generation == 1, v.message
    assert v.message.count("recorded no compute_s=") == 3, v.message


def test_a_failing_generation_fails_even_beside_an_untimed_one():
    b = Builder(steps=8)
    _gen(b, range(4), {0: 0.0, 1: 0.0}, untimed={1: range(4)})
    _gen(b, range(4, 8), {0: 0.5, 1: 0.0}, resume=4)
    v = balance(b.history())
    assert v.status == FAIL and v.generation == 1, v.message


def test_a_generation_without_a_step_after_its_first_is_not_judged():
    b = Builder(steps=8)
    _gen(b, range(0, 1), {0: 0.9, 1: 0.0})      # ended after its first step: nothing to judge
    only = balance(b.history())
    assert only.status == UNKNOWN and "nothing to judge" in only.message, only.message
    _gen(b, range(1, 8), {0: 0.02, 1: 0.0}, resume=1)
    v = balance(b.history())
    assert v.status == PASS and "generation 0: no step after its first that every rank ended, " \
        "not judged" in v.message, v.message


def test_a_rank_that_could_not_join_its_cgroup_makes_the_verdict_unknown():
    """It stretched its steps instead (a note): its compute time no longer shows its class."""
    from pytest_reshard.contract import STRETCHED

    b = Builder(steps=4)
    _gen(b, range(4), {0: 0.05, 1: 0.0})
    b.rank(0, 1, Ev.NOTE, what=STRETCHED, why="joining /sys/fs/cgroup/cpu/x failed")
    v = balance(b.history())
    assert v.status == UNKNOWN and "could not join its cgroup" in v.message, v.message


def test_a_pipeline_is_judged_role_by_role_and_an_untimed_role_is_left_out_by_name():
    """Targets (ranks 0, 1) record no timings: they share no collective. The drafters (2, 3)
    are judged on their own: balanced passes, a drafter idling 40% fails naming its role."""
    def pipeline(idle: float) -> Builder:
        b = Builder(steps=4)
        classes = ["h100", "h100", "h100", "a100"]
        _gen(b, range(4), {0: 0, 1: 0, 2: idle, 3: 0.0}, classes=classes,
             untimed={0: range(4), 1: range(4)})
        start = next(e for e in b.events if e["ev"] == "gen_start")
        start["roles"] = ["target", "target", "drafter", "drafter"]
        for e in b.events:
            if e["ev"] == "start":
                e["role"] = start["roles"][e["rank"]]
        return b

    v = balance(pipeline(0.05).history())
    assert v.status == PASS, v
    assert v.message.startswith("generation 0 (drafter), steps 1-3: at most 5% idle (rank 2 (h100, 50% of "
                                "the samples)"), v.message
    assert "generation 0's target ranks recorded no compute_s, not judged" in v.message
    v = balance(pipeline(0.4).history())
    assert v.status == FAIL and v.rank == 2, v
    assert v.message.startswith("generation 0 (drafter), steps 1-3: rank 2 (h100, 50% of the samples) "
                                "idled "
                                "40% of its steps"), v.message


def test_settle_steps_leave_out_a_generations_start_and_the_verdict_names_the_steps_judged():
    """A workload that feeds its step times back into its shares idles while it settles: with
    settle_steps=3 its first 3 steps are left out; a rank idling every step still fails."""
    b = Builder(steps=6)
    gen = _gen(b, range(6), {0: 0.0, 1: 0.0})
    for e in b.events:   # rank 0 idles 40% in steps 0-2, while the shares settle
        if e.get("rank") == 0 and e.get("step", 9) < 3 and "wait_s" in e:
            e.update(compute_s=0.6, wait_s=0.4)
    assert balance(b.history()).status == FAIL
    v = balance(b.history(), settle_steps=3)
    assert v.status == PASS and v.message.startswith(f"generation {gen}, steps 3-5: at most 0%"), v
    b = Builder(steps=6)
    _gen(b, range(6), {0: 0.4, 1: 0.0})
    v = balance(b.history(), settle_steps=3)
    assert v.status == FAIL and v.message.startswith("generation 0, steps 3-5: rank 0"), v.message
    b = Builder(steps=3)
    _gen(b, range(3), {0: 0.0, 1: 0.0})
    v = balance(b.history(), settle_steps=3)
    assert v.status == UNKNOWN and "a step after its first 3 that every rank ended" in v.message, v
