"""Schedules: the faults of a scenario as plain, JSON-serialisable data (a contract).

A schedule is a seed plus a list of faults. Each fault is ``(kind, target, when, params)``:

- ``kind``: what happens (``"kill"``, ``"preempt"``, ``"shift_shards"``, ...): a registered
  ``FaultKind`` (``pytest_reshard.schedule.kinds``), which says what the kind does.
- ``target``: which ranks, as a string: ``"all"``, ``"one"``, ``"minority"``, ``"rank:2"``,
  ``"role:drafter"`` (every drafter), ``"role:drafter:one"`` (one of them). ``"one"``,
  ``"minority"`` and ``":one"`` are drawn from the seed when the generation
  that runs the step starts, so a schedule replays exactly.
- ``when``: a step and a named phase inside it, so "mid-step" is exact and replayable.
- ``params``: kind-specific numbers (``to_world_size``, ``notice_s``, ``grace_s``, ...).

The schedule's hash is stable across processes and Python versions and appears in every report.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

#: Phases the bundled workloads expose; a user's script may name its own.
#: "begin" and "end" are implicit: the probe passes them at the edges of every step.
STANDARD_PHASES = ("begin", "data", "forward", "backward", "optimizer", "checkpoint",
                   "checkpoint_commit", "end")
_SELECTORS = ("all", "one", "minority")


class ScheduleError(ValueError):
    """A schedule or fault is malformed; the message says which field and how to fix it."""


def _check_target(target: str) -> str:
    if target in _SELECTORS:
        return target
    key, _, value = target.partition(":")
    if key == "rank" and value.isdigit():
        return target
    name, _, pick = value.partition(":")
    if key == "role" and name and pick in ("", "one"):
        return target
    raise ScheduleError(
        f"bad fault target {target!r}: use 'all', 'one', 'minority', 'rank:N', 'role:NAME' "
        "(every rank of the role) or 'role:NAME:one' (one of them, drawn from the seed)"
    )


@dataclass(frozen=True)
class Fault:
    """One fault event. Build these with the constructors in ``pytest_reshard.chaos``."""

    kind: str
    target: str
    step: int
    phase: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.kind:
            raise ScheduleError("a fault needs a kind")
        _check_target(self.target)
        if not isinstance(self.step, int) or isinstance(self.step, bool) or self.step < 0:
            raise ScheduleError(f"{self.kind}: at_step must be an int >= 0, got {self.step!r}")
        if not self.phase or not isinstance(self.phase, str):
            raise ScheduleError(f"{self.kind}: phase must be a non-empty string")
        object.__setattr__(self, "params", dict(self.params))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "step": self.step,
                "phase": self.phase, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Fault":
        try:
            return cls(data["kind"], data["target"], data["step"], data["phase"],
                       data.get("params", {}))
        except KeyError as e:
            raise ScheduleError(f"fault {dict(data)!r} lacks field {e.args[0]!r}") from None

    @property
    def terminal(self) -> bool:
        """The targeted ranks do not go on with the generation (its kind's ``Ending``)."""
        from pytest_reshard.schedule import kinds

        return kinds.ending_of(self.kind, self.params).terminal

    def describe(self) -> str:
        extra = "".join(f" {k}={v:g}" if isinstance(v, float) else f" {k}={v}"
                        for k, v in sorted(self.params.items()))
        return f"{self.kind}({self.target}) at step {self.step} {self.phase}{extra}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    faults: tuple[Fault, ...] = ()

    def __init__(self, seed: int = 0, faults: Sequence[Fault] = ()) -> None:
        object.__setattr__(self, "seed", int(seed))
        object.__setattr__(self, "faults", tuple(faults))

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "faults": [f.to_dict() for f in self.faults]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Schedule":
        return cls(data.get("seed", 0), [Fault.from_dict(f) for f in data.get("faults", [])])

    @property
    def hash(self) -> str:
        """Stable 12-hex-digit id of the seed and faults, printed in every report."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def describe(self) -> str:
        return "; ".join(f.describe() for f in self.faults) or "no faults"


def resolve_target(target: str, world_size: int, roles: Sequence[str], seed: int,
                   salt: int) -> list[int]:
    """The concrete ranks a target names in a generation of ``world_size`` ranks.

    ``roles[r]`` is rank r's role. Random selectors draw from ``(seed, salt)`` only, so the
    same schedule picks the same ranks on every replay.
    """
    ranks = list(range(world_size))
    if target == "all":
        return ranks
    rng = random.Random(f"{seed}:{salt}")
    if target == "one":
        return [rng.choice(ranks)]
    if target == "minority":
        return sorted(rng.sample(ranks, max(1, (world_size - 1) // 2)))
    key, _, value = target.partition(":")
    if key == "rank":
        r = int(value)
        if r >= world_size:
            raise ScheduleError(f"target {target} does not exist at world size {world_size}")
        return [r]
    name, _, pick = value.partition(":")
    chosen = [r for r in ranks if roles[r] == name]
    if not chosen:
        raise ScheduleError(f"target {target}: no rank has role {name!r} (roles: {sorted(set(roles))})")
    return [rng.choice(chosen)] if pick == "one" else chosen


def validate(schedule: Schedule, *, world_size: int, steps: int,
             phases: Sequence[str] = (), options: Mapping[str, Any] | None = None) -> None:
    """Reject a schedule that cannot mean what its author wants, before any process starts.

    Checks each fault's kind is registered and what it requires of the scenario's ``options``
    (``launcher``, ``nodes``, ...), the world size in effect at its step (earlier reshards change
    it), the run's length, the known phases (``STANDARD_PHASES`` plus ``phases``), faults that
    would kill every rank, and two terminal faults at one point.
    """
    from pytest_reshard.schedule import kinds

    known = set(STANDARD_PHASES) | set(phases)
    size = world_size
    seen: dict[tuple[int, str], Fault] = {}
    for fault in sorted(schedule.faults, key=lambda f: (f.step, _phase_order(f.phase))):
        where = fault.describe()
        try:
            kind = kinds.get(fault.kind)
        except KeyError as e:
            raise ScheduleError(f"{where}: {e.args[0]}") from None
        needs = kind.requires(dict(options or {})) if kind.requires else None
        if needs:
            raise ScheduleError(f"{where}: {needs}")
        ending = kind.ending_of(fault.params)
        if fault.step >= steps:
            raise ScheduleError(f"{where}: the run has steps 0..{steps - 1}; raise steps or "
                                f"move the fault")
        if fault.phase not in known:
            raise ScheduleError(f"{where}: unknown phase {fault.phase!r}; known phases are "
                                f"{', '.join(sorted(known))} (pass phases=[...] if your script "
                                f"marks its own with s.point())")
        key, _, value = fault.target.partition(":")
        if key == "rank" and int(value) >= size:
            raise ScheduleError(f"{where}: rank {value} does not exist at step {fault.step}, "
                                f"where the world size is {size}")
        if kind.replaces and int(fault.params["rank"]) >= size:
            raise ScheduleError(f"{where}: rank {fault.params['rank']} does not exist at step "
                                f"{fault.step}, where the world size is {size}")
        if ending in (kinds.Ending.DEATH, kinds.Ending.HANG) and fault.target == "all" and size > 1:
            raise ScheduleError(f"{where}: that takes down every rank, so nobody is left to "
                                f"recover; target one rank or 'minority' (or use preempt)")
        if ending.terminal:
            other = seen.get((fault.step, fault.phase))
            if other is not None:
                raise ScheduleError(f"{where} conflicts with {other.describe()}: two faults that "
                                    f"end the generation at one point; move one to another "
                                    f"step or phase")
            seen[(fault.step, fault.phase)] = fault
        after = fault.params.get("to_world_size") or fault.params.get("then_world_size")
        if after:
            size = int(after)


def _phase_order(phase: str) -> int:
    return STANDARD_PHASES.index(phase) if phase in STANDARD_PHASES else len(STANDARD_PHASES)
