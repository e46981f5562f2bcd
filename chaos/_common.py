"""What the constructors of the bundled fault kinds share: naming a target, checking numbers."""
from __future__ import annotations

from pytest_reshard.schedule import ScheduleError


def target_of(rank: int | None, role: str | None, target: str | None, default: str) -> str:
    """One target string from the ``rank=`` / ``role=`` / ``target=`` a constructor accepts."""
    given = [x for x in (rank, role, target) if x is not None]
    if len(given) > 1:
        raise ScheduleError("name the target once: rank=, role= or target=")
    if rank is not None:
        return f"rank:{int(rank)}"
    if role is not None:  # a fault that picks one victim picks one rank of the role
        return f"role:{role}:one" if default == "one" else f"role:{role}"
    return target or default


def positive(name: str, value: float) -> float:
    if not value > 0:
        raise ScheduleError(f"{name} must be > 0, got {value!r}")
    return float(value)


def then(then_world_size: int | None) -> dict:
    """The ``then_world_size`` param of an unplanned loss, if given."""
    return {} if then_world_size is None else {"then_world_size": int(then_world_size)}
