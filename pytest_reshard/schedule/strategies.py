"""Hypothesis strategies for fault schedules, and the ``ci`` / ``nightly`` suite profiles.

Every schedule drawn here is valid by construction for the workload it is drawn for (it passes
:func:`pytest_reshard.schedule.validate`):

- the world size in effect at each step is tracked (``shift_shards`` changes it; never below
  ``min_world_size``, never outside ``world_sizes``), and every ``rank:N`` target exists there;
- steps lie in ``0..steps-1``, phases are the ones the workload marks;
- faults come in (step, phase) order, and terminal faults (``Fault.terminal``) sit at
  distinct *steps* (stricter than validate's one per point: a generation then ends at most once
  per step, so a correct workload never sees a planned and an unplanned end in one step);
- no fault takes down every rank (unplanned deaths target one rank, and only at world size >= 2).

Shrinking goes toward fewer faults, earlier steps, the first phase, rank 0, the first kind and
the first world size, so a minimal failing schedule reads naturally.

Hypothesis is imported lazily, in the functions, so the plugin can import this module (to set
the active profile) without importing hypothesis or torch.

    from hypothesis import given
    from pytest_reshard.schedule import strategies

    @strategies.profile()                 # the profile chosen with --reshard-profile (ci default)
    @given(strategies.schedules(world_size=4, steps=12, world_sizes=(2, 3, 4)))
    def test_survives(schedule): ...
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from pytest_reshard.schedule import STANDARD_PHASES, Fault, Schedule, _phase_order
from pytest_reshard.schedule import kinds as _kinds

if TYPE_CHECKING:  # pragma: no cover
    from hypothesis import settings as Settings
    from hypothesis.strategies import SearchStrategy

PROFILES = ("ci", "nightly")
#: The profile in use when ``profile()`` is called without a name; the plugin sets it from
#: ``--reshard-profile`` / ``RESHARD_PROFILE`` / ini ``reshard_profile``.
ACTIVE_PROFILE = os.environ.get("RESHARD_PROFILE", "ci")
NOTICE_S = 20.0  # notice and grace periods: generous, so a loaded machine never misses one

_registered = False


def register_profiles() -> None:
    """Register ``reshard-ci`` and ``reshard-nightly`` with hypothesis (idempotent)."""
    global _registered
    if _registered:
        return
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    slow = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    # ci: few examples, the same ones on every run (derandomize), no database, no deadline
    # (a scenario takes seconds), and no "explain" phase (it would rerun scenarios).
    settings.register_profile(
        "reshard-ci", max_examples=10, derandomize=True, deadline=None, database=None,
        suppress_health_check=slow, print_blob=True,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))
    # nightly: more examples, fresh ones each night, failures remembered in the database.
    settings.register_profile(
        "reshard-nightly", max_examples=50, derandomize=False, deadline=None,
        database=DirectoryBasedExampleDatabase(".hypothesis/reshard"),
        suppress_health_check=slow, print_blob=True,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))
    _registered = True


def profile(name: str | None = None) -> "Settings":
    """The hypothesis settings of a suite profile (default: the active one); use as a decorator."""
    name = name or ACTIVE_PROFILE
    if name not in PROFILES:
        raise ValueError(f"unknown reshard profile {name!r}: choose one of {', '.join(PROFILES)}")
    register_profiles()
    from hypothesis import settings

    return settings.get_profile(f"reshard-{name}")


def _sizes(world_size: int, min_world_size: int, world_sizes: Sequence[int] | None) -> list[int]:
    sizes = sorted(set(world_sizes)) if world_sizes else list(range(min_world_size, world_size + 1))
    sizes = [s for s in sizes if s >= max(1, min_world_size)]
    if not sizes:
        raise ValueError(f"no world size >= min_world_size={min_world_size} in {world_sizes}")
    return sizes


def drawable() -> list[str]:
    """The registered kinds Hypothesis can draw (their declaration has ``draw``)."""
    return [k for k in _kinds.registered() if _kinds.get(k).draw is not None]


def _check(world_size: int, steps: int, kinds: Sequence[str], phases: Sequence[str]) -> list[str]:
    if world_size < 1 or steps < 1:
        raise ValueError(f"world_size and steps must be >= 1, got {world_size}, {steps}")
    known = drawable()
    unknown = [k for k in kinds if k not in known]
    if unknown or not kinds:
        raise ValueError(f"kinds {unknown or kinds!r}: choose from {', '.join(known)}")
    if not phases:
        raise ValueError("phases must name at least one phase the workload marks")
    # (step, phase) points are linearised in validate's order, so "after" means the same there.
    return sorted(dict.fromkeys(phases), key=_phase_order)


def _draw_fault(draw: Any, kind: str, step: int, phase: str, size: int,
                sizes: list[int]) -> Fault:
    """One fault of ``kind``, drawn as its declaration says."""
    declared = _kinds.get(kind)
    assert declared.draw is not None
    return declared.draw(draw, _kinds.DrawContext(step, phase, size, sizes, NOTICE_S))


def _allowed(kind: str, size: int) -> bool:
    """Drawn only where it leaves a survivor (a death at world size 1 would end the run)."""
    return size >= _kinds.get(kind).min_world_size


def faults(world_size: int, steps: int, *, kinds: Sequence[str] = ("kill", "shift_shards", "preempt"),
           phases: Sequence[str] = STANDARD_PHASES, min_world_size: int = 1,
           world_sizes: Sequence[int] | None = None) -> "SearchStrategy[Fault]":
    """One fault, valid on its own at ``world_size`` (a one-fault schedule passes validate)."""
    return schedules(world_size, steps, kinds=kinds, phases=phases, min_faults=1, max_faults=1,
                     min_world_size=min_world_size,
                     world_sizes=world_sizes).map(lambda s: s.faults[0])


def schedules(world_size: int, steps: int, *,
              kinds: Sequence[str] = ("kill", "shift_shards", "preempt"),
              max_faults: int = 3, min_faults: int = 0, min_world_size: int = 1,
              world_sizes: Sequence[int] | None = None,
              phases: Sequence[str] = STANDARD_PHASES, seed: int = 0) -> "SearchStrategy[Schedule]":
    """Whole schedules for a run of ``steps`` steps starting at ``world_size`` ranks.

    ``world_sizes``: the sizes a reshard may go to (default ``min_world_size..world_size``);
    give the ones the workload supports (the toy needs divisors of its global batch).
    ``phases``: the points the workload really passes (a fault at a phase the workload never
    marks never fires, and liveness fails). ``seed`` is the schedule seed (fixed by default, so
    a session's cached reference runs are reused).
    """
    from hypothesis import strategies as st

    ordered = _check(world_size, steps, kinds, phases)
    sizes = _sizes(world_size, min_world_size, world_sizes)
    if world_size < max(1, min_world_size):
        raise ValueError(f"world_size {world_size} is below min_world_size {min_world_size}")
    if not 0 <= min_faults <= max_faults:
        raise ValueError(f"need 0 <= min_faults <= max_faults, got {min_faults}, {max_faults}")
    n_phases = len(ordered)
    last = steps * n_phases  # positions 0..last-1: (step, phase) in validate's order

    @st.composite
    def build(draw: Any) -> Schedule:
        size, pos, out = world_size, 0, []
        n = draw(st.integers(min_faults, max_faults))
        for _ in range(n):
            allowed = [k for k in kinds if _allowed(k, size)]
            if not allowed or pos >= last:
                break
            kind = draw(st.sampled_from(allowed))
            pos += draw(st.integers(0, last - 1 - pos))  # a gap: shrinks toward adjacent faults
            step, phase = divmod(pos, n_phases)
            out.append(_draw_fault(draw, kind, step, ordered[phase], size, sizes))
            if out[-1].terminal:
                pos = (step + 1) * n_phases  # the next terminal fault goes to a later step
            size = int(out[-1].params.get("to_world_size") or size)
        if len(out) < min_faults:  # ran out of room: only when steps are too few for min_faults
            from hypothesis import reject

            reject()
        return Schedule(seed, out)

    return build()


def schedule_machine(run: Any, world_size: int, steps: int, *,
                     world_sizes: Sequence[int] | None = None, phase: str = "forward",
                     seed: int = 0) -> type:
    """A Hypothesis ``RuleBasedStateMachine`` whose rules build a schedule step by step:
    ``train(n)`` moves the clock, ``kill``, ``shift_shards`` and ``preempt`` add a fault at the
    clock. At teardown ``run(schedule)`` executes it and must return a Result; every checker is
    an invariant (``assert_ok``). The run happens once, at teardown: real training cannot pause
    between rules, so the machine composes the schedule and the processes then play it.

        TestChaos = strategies.schedule_machine(lambda s: session.run(...), 4, 12).TestCase
    """
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

    sizes = _sizes(world_size, 1, world_sizes)

    class ScheduleMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock, self.size = 0, world_size
            self.faults: list[Fault] = []

        def _add(self, fault: Fault) -> None:
            self.faults.append(fault)
            self.clock += 1  # one terminal fault per step

        @rule(n=st.integers(1, 3))
        def train(self, n: int) -> None:
            self.clock += n

        @precondition(lambda self: self.clock < steps and self.size >= 2)
        @rule(data=st.data())
        def kill(self, data: Any) -> None:
            rank = data.draw(st.integers(0, self.size - 1), label="rank")
            self._add(Fault("kill", f"rank:{rank}", self.clock, phase, {}))

        @precondition(lambda self: self.clock < steps)
        @rule(data=st.data())
        def shift_shards(self, data: Any) -> None:
            to = data.draw(st.sampled_from(sizes), label="to_world_size")
            self._add(Fault("shift_shards", "all", self.clock, phase,
                            {"to_world_size": to, "notice_s": NOTICE_S}))
            self.size = to

        @precondition(lambda self: self.clock < steps)
        @rule()
        def preempt(self) -> None:
            self._add(Fault("preempt", "all", self.clock, phase, {"grace_s": NOTICE_S}))

        def teardown(self) -> None:
            if self.faults:
                run(Schedule(seed, self.faults)).assert_ok()

    return ScheduleMachine
