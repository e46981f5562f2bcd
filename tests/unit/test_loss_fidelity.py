"""loss_continuity on real training code (tests/workloads/fidelity_train.py, 4 ranks, gloo).

The training choices that make a clean run's loss depend on the world size (the linear LR
scaling rule, dropout drawn per rank, float16 gradients with a loss scaler, a fixed per-device
batch), each with the restore bug that the old rule (10x the largest gap between two clean runs,
applied to every step) passed. Each bug is failed, or called unknown where nothing can tell; each
correct version passes a kill, a kill inside a save and a preemption at one size, and a reshard
where its loss does not depend on the size. Then properties over hand-built histories.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from pytest_reshard.checkers import (ROUNDING_FLOOR, SPREAD_FACTOR, loss_continuity)
from pytest_reshard.checkers.loss_continuity import SAME_SIZE_FLOOR
from pytest_reshard.session import Session, scenario_from

from ..histories import DIGEST, Builder, clean_run, default_loss

SCRIPT = str(Path(__file__).parent.parent / "workloads" / "fidelity_train.py")
WORLD, STEPS = 4, 24

LR = ["--lr", "0.01", "--lr-scaled"]
KILL = {"kind": "kill", "target": "rank:1", "step": 0, "phase": "backward", "params": {}}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with Session(tmp_path_factory.mktemp("fidelity")) as s:
        yield s


def run(session, args, faults, tag):
    scenario = scenario_from(SCRIPT, world_size=WORLD, steps=STEPS, faults=faults, args=args,
                             timeout_s=90)
    return scenario, session.run(scenario, tag)


def test_loss_continuity_asks_for_one_clean_run_per_topology_it_judges():
    """At one size it needs the clean run at that size only (the old rule always asked for a
    second one, half the ranks, to measure its floor); a drain 4 -> 3 -> 2 needs all three."""
    from pytest_reshard import checkers
    from pytest_reshard.checkers import registry

    def asked(history):
        calls = []

        def reference(roles):
            calls.append(len(roles))
            return clean_run(steps=20, world_size=len(roles))

        ctx = checkers.CheckContext(history, reference_runs=reference)
        v = registry.run_all(ctx, [registry.get("loss_continuity")])["loss_continuity"]
        return calls, v

    b = Builder(steps=20, world_size=4, faults=[dict(KILL, step=14)])
    b.gen(run=range(14), partial={14: [0]}, cause="failure", fault_id=0, saves={9: DIGEST},
          fault={"rank": 1, "step": 14, "phase": "backward", "kind": "kill", "id": 0})
    b.gen(resume=10, run=range(10, 20), load=(9, DIGEST))
    calls, v = asked(b.history())
    assert calls == [4] and v.status == "pass", v.message
    drain = Builder(steps=20, world_size=4)
    drain.gen(run=range(7), cause="reshard", planned=True, saves={6: DIGEST})
    drain.gen(world_size=3, resume=7, run=range(7, 13), cause="reshard", planned=True,
              load=(6, DIGEST), saves={12: DIGEST})
    drain.gen(world_size=2, resume=13, run=range(13, 20), load=(12, DIGEST))
    calls, v = asked(drain.history())
    assert calls == [4, 3, 2] and v.status == "pass", v.message


# -- properties over hand-built histories ----------------------------------------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

@st.composite
def same_size_resumes(draw):
    """A kill at ``world`` ranks, back at the same size from an earlier checkpoint; generation 0
    may be nondeterministic (it differs from the clean run before the kill by up to ``noise``);
    the resumed generation deviates at ``bad`` by ``dev`` beyond its floor."""
    world = draw(st.integers(1, 4))
    steps = draw(st.integers(6, 16))
    kill_at = draw(st.integers(2, steps - 2))
    resume = draw(st.integers(1, kill_at))
    noise = draw(st.sampled_from([0.0, 0.0, 1e-6, 3e-4]))
    bad = draw(st.integers(resume, steps - 1))
    ratio = draw(st.floats(1.01, 1e6))
    sign = draw(st.sampled_from([-1.0, 1.0]))
    return world, steps, kill_at, resume, noise, bad, ratio, sign


@settings(max_examples=150, deadline=None)
@given(same_size_resumes())
def test_a_resume_off_its_same_size_reference_beyond_its_floor_never_passes(case):
    world, steps, kill_at, resume, noise, bad, ratio, sign = case

    def gen0(s):
        return default_loss(s) + (noise if s % 2 else 0.0)

    ref = default_loss(bad)
    # the floor at one size: ten float32 roundings when generation 0 repeated the clean run
    # exactly, else SPREAD_FACTOR x the largest difference it showed before the kill
    window = [s for s in range(min(resume, kill_at)) if s % 2]
    measured = noise if window else 0.0
    floor = max(SAME_SIZE_FLOOR * abs(ref), SPREAD_FACTOR * measured)

    def gen1(s):  # the clean run's computation, except at ``bad``: off its reference beyond
        return ref + sign * ratio * floor if s == bad else gen0(s)

    fault = dict(KILL, step=kill_at)
    b = Builder(steps=steps, world_size=world, faults=[fault])
    b.gen(run=range(kill_at), partial={kill_at: [0]}, cause="failure", fault_id=0, loss=gen0,
          saves={resume - 1: DIGEST},
          fault={"rank": 0, "step": kill_at, "phase": "backward", "kind": "kill", "id": 0})
    b.gen(resume=resume, run=range(resume, steps), load=(resume - 1, DIGEST), loss=gen1)
    v = loss_continuity(b.history(), references=[clean_run(steps=steps, world_size=world),
                                                 clean_run(steps=steps, world_size=world + 1)])
    assert v.status != "pass", (case, v.message)


@st.composite
def reshards(draw):
    """A reshard 2 -> 3 ranks after ``at``; the clean runs at 2 and 3 ranks differ by rounding
    noise ``eps(s)``; the resumed generation tracks its own clean run up to ``wobble`` of the
    floor, except at ``bad`` (if any), where it deviates beyond it."""
    steps = draw(st.integers(6, 16))
    at = draw(st.integers(0, steps - 3))
    eps = draw(st.lists(st.sampled_from([0.0, 1e-7, 5e-7, 2e-6]), min_size=steps, max_size=steps))
    eps[0] = min(eps[0], 1e-7)  # before any update the loss differs by rounding only
    wobble = draw(st.floats(0.0, 0.9))
    bad = draw(st.one_of(st.none(), st.integers(at + 1, steps - 1)))
    ratio = draw(st.floats(1.01, 1e5))
    return steps, at, eps, wobble, bad, ratio


@settings(max_examples=150, deadline=None)
@given(reshards())
def test_across_sizes_the_per_step_floor_decides(case):
    """While the clean runs agree: a deviation beyond SPREAD_FACTOR x their running spread is
    never a pass, and a run within it (no jump) always passes."""
    steps, at, eps, wobble, bad, ratio = case

    def floor(s):
        return max(max(eps[: s + 1]), ROUNDING_FLOOR * abs(default_loss(s) + eps[s]))

    def gen1(s):
        own = default_loss(s) + eps[s]
        extra = ratio if s == bad else wobble
        return own + extra * SPREAD_FACTOR * floor(s) * (-1) ** s

    b = Builder(steps=steps, faults=[{"kind": "shift_shards", "target": "all", "step": at,
                                      "phase": "optimizer", "params": {"to_world_size": 3}}])
    b.gen(run=range(at + 1), cause="reshard", planned=True, fault_id=0, saves={at: DIGEST},
          fault={"rank": 0, "step": at, "phase": "optimizer", "kind": "shift_shards", "id": 0})
    b.gen(world_size=3, resume=at + 1, run=range(at + 1, steps), load=(at, DIGEST), loss=gen1)
    refs = [clean_run(steps=steps, world_size=2),
            clean_run(steps=steps, world_size=3, loss=lambda s: default_loss(s) + eps[s])]
    v = loss_continuity(b.history(), references=refs)
    if bad is None:
        assert v.status == "pass", (case, v.message)
    else:
        assert v.status == "fail", (case, v.message)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_loss_that_is_not_a_number_fails_at_any_tolerance(bad):
    """NaN compares false with every bound, so a NaN loss once read as "within tolerance" (a
    flipped exponent bit in a run without a guard)."""
    b = Builder(steps=10, world_size=2)
    b.gen(run=range(10), loss=lambda s: bad if s >= 8 else default_loss(s))
    v = loss_continuity(b.history(), references=[clean_run(steps=10, world_size=2)])
    assert v.status == "fail" and v.step == 8, v.message
    assert f"loss departs from the reference at step 8 (generation 0): {bad} where the clean " \
        "run at 2 ranks has" in v.message and "not a finite number" in v.message, v.message


def test_in_a_device_mix_generation_0_is_no_free_repeat_of_the_clean_run():
    """The clean run of a device mix ran at even shares, so generation 0's difference from it
    before the first fault is not the workload's nondeterminism: a mix's own bug (gradients
    averaged unweighted) fails from its first step; rounding alone passes."""
    from pytest_reshard.contract import Ev

    def mixed(off: float) -> Builder:
        b = Builder(steps=6, world_size=2)
        b.sup(Ev.DEVICES, gen=0, classes=["h100", "a100"], speeds=[1.0, 0.32], mode="cgroup",
              why="")
        b.gen(run=range(6), loss=lambda s: default_loss(s) * (1 + (off if s else 0.0)))
        return b

    refs = [clean_run(steps=6, world_size=2)]
    v = loss_continuity(mixed(6e-4).history(), references=refs)
    assert v.status == "fail" and (v.step, v.generation) == (1, 0), v.message
    assert loss_continuity(mixed(2e-7).history(), references=refs).status == "pass"
    # the same difference without a device mix: taken for nondeterminism, never a pass or fail
    plain = Builder(steps=6, world_size=2)
    plain.gen(run=range(6), loss=lambda s: default_loss(s) * (1 + (6e-4 if s else 0.0)))
    assert loss_continuity(plain.history(), references=refs).status != "fail"
