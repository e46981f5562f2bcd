"""Chaos injectors: each returns a :class:`~pytest_reshard.schedule.Fault` for a schedule.

Every injector fires inside the targeted ranks at an exact fault point (``at_step``, ``phase``),
so "mid-step" is replayable; whatever must come from outside (a deadline, SIGKILL after a grace
period, relaunching at a new world size) the supervisor enforces. Each docstring says which layer
the fault really exercises and what it does not prove.

Each fault kind is one module here: its constructor, how the rank executes it, how Hypothesis
draws it, and its one ``FaultKind`` declaration (``pytest_reshard.schedule.kinds``). A kind of
your own needs only the declaration; ``fault()`` builds faults of any kind.

Targets: ``rank=N``, ``role="drafter"``, or ``target="all" | "one" | "minority"`` (drawn from the
schedule's seed, so replays pick the same ranks). ``role=`` means one rank of the role for the
kinds that hit one victim by default (``kill``, ``crash_silently``, ``hang``, ``slow_rank``,
``ecc_error``, ``memory_pressure``) and every rank of it for the others (``preempt``); say
``target="role:drafter"`` for all of them, ``target="role:drafter:one"`` for one.
"""
from __future__ import annotations

from typing import Any

from pytest_reshard.chaos._common import target_of as _target
from pytest_reshard.chaos.abort_comms import abort_comms
from pytest_reshard.chaos.bitflip import bitflip
from pytest_reshard.chaos.change_devices import change_devices
from pytest_reshard.chaos.crash_silently import crash_silently
from pytest_reshard.chaos.ecc_error import ecc_error
from pytest_reshard.chaos.file_event import kill_at_file_event
from pytest_reshard.chaos.hang import hang
from pytest_reshard.chaos.kill import kill, kill_during_save
from pytest_reshard.chaos.kill_node import kill_node
from pytest_reshard.chaos.memory_pressure import memory_pressure
from pytest_reshard.chaos.migrate import migrate
from pytest_reshard.chaos.partition import partition
from pytest_reshard.chaos.power_loss import power_loss
from pytest_reshard.chaos.preempt import preempt
from pytest_reshard.chaos.rebalance import rebalance
from pytest_reshard.chaos.shift_shards import drain, shift_shards
from pytest_reshard.chaos.slow_link import slow_link
from pytest_reshard.chaos.slow_rank import slow_rank
from pytest_reshard.schedule import Fault
from pytest_reshard.schedule import kinds as _kinds

__all__ = ["abort_comms", "bitflip", "change_devices", "crash_silently", "drain", "ecc_error", "fault", "hang", "kill",
           "kill_at_file_event", "kill_during_save", "kill_node", "memory_pressure", "migrate", "partition",
           "power_loss", "preempt", "rebalance", "shift_shards", "slow_link", "slow_rank", "Fault"]


def fault(kind: str, *, at_step: int, phase: str, rank: int | None = None,
          role: str | None = None, target: str | None = None, **params: Any) -> Fault:
    """A fault of any registered kind (yours included), hitting the kind's default target
    unless ``rank=``, ``role=`` or ``target=`` says otherwise; ``params`` reach its executor."""
    declared = _kinds.get(kind)
    return Fault(kind, _target(rank, role, target, declared.default_target), at_step, phase,
                 params)
