"""Checkers: decide whether training survived, from the recorded history (a contract).

Each checker is a pure function ``History -> Verdict`` in its own module, reading only the
history (plus keyword-only inputs such as a reference run), so it is tested on hand-built
histories without starting a process. A checker that cannot decide says ``unknown`` and what the
workload must record to let it decide; it never guesses a pass.

Each module ends with the checker's one registration (``registry.register``): when it applies to
a scenario, how it gets its clean reference runs, its verdict-table column and its ``Result``
assertion. ``Session.check`` runs the registry, ``Result.assert_*`` and the verdict tables read
it, and a user's own checker joins them the same way::

    from pytest_reshard import checkers
    from pytest_reshard.verdict import Verdict

    @checkers.register("eval_metric", column="eval")
    def eval_metric(ctx: checkers.CheckContext) -> Verdict:
        ...

The built-in checkers, in registration order (the verdict table's columns):

- ``no_rewind`` (``no_rewind.py``): no committed step runs again beyond the budget.
- ``loss_continuity``: the loss matches a clean run within the measured noise floor.
- ``exactly_once_samples``: every sample consumed once, none of the clean run's lost.
- ``state_equivalence``: each load equals what was saved, component by component.
- ``liveness``: the run finished, and every death, stop or stall was scheduled.
- ``poisoned_commit``: no step committed after a fatal ECC error before its update.
- ``sample_ledger`` (target + drafter pipelines): consumers took what producers made.
- ``throughput`` (runs that record tokens): no idle rank; no rate below ``min_throughput``.
- ``memory_headroom`` (with a memory budget): every peak clear of the budget.
- ``allocator_fragmentation`` (nccl, or recorded allocator statistics): under 30%.
- ``crash_consistency`` (scenarios that record file events): each resume loads the newest
  checkpoint complete on disk, never an incomplete one.
- ``one_step_checkpoint`` (runs that record their live state after each step): every saved or
  loaded checkpoint holds the state of one step, the step it was saved at.
- ``silent_corruption`` (a scheduled ``bitflip``): no flipped bit reaches a checkpoint, noticed by
  the workload's own check or not, and no resume loads a corrupted save.
- ``balance`` (a heterogeneous world, ``devices=``): no rank idles more than 10% of its steps
  waiting for a slower one.
- ``downtime`` (a handover in the running processes: a live reshard, a migration): no step while
  it is prepared longer than 2 median steps, and a swap of at most 10 (or 1 s).
"""
from __future__ import annotations

from pytest_reshard.checkers.context import CheckContext, CleanRuns, ReferenceRuns, noise_floor_roles
from pytest_reshard.checkers.registry import (RESERVED_ASSERTIONS, Checker, CheckFn,
                                              RegistrationError, add, by_assertion, columns, get,
                                              register, registered, run_all, unregister)

# Import order is registration order: the built-ins' columns and verdicts keep this order.
from pytest_reshard.checkers.no_rewind import no_rewind
from pytest_reshard.checkers.loss_continuity import (ROUNDING_FLOOR, SPREAD_FACTOR, loss_continuity,
                                                     measure_spread)
from pytest_reshard.checkers.exactly_once_samples import exactly_once_samples
from pytest_reshard.checkers.state_equivalence import state_equivalence
from pytest_reshard.checkers.liveness import liveness
from pytest_reshard.checkers.poisoned_commit import PRE_UPDATE, poisoned_commit
from pytest_reshard.checkers.sample_ledger import PIPELINE_ROLES, has_roles, sample_ledger
from pytest_reshard.checkers.throughput import RoleRate, role_rate, role_work, throughput
from pytest_reshard.checkers.memory_headroom import MEMORY_MARGIN, memory_headroom
from pytest_reshard.checkers.allocator_fragmentation import (FRAGMENTATION_ALERT,
                                                             FRAGMENTATION_MIN_FREE,
                                                             allocator_fragmentation)
from pytest_reshard.checkers.crash_consistency import crash_consistency
from pytest_reshard.checkers.one_step_checkpoint import one_step_checkpoint
from pytest_reshard.checkers.silent_corruption import silent_corruption
from pytest_reshard.checkers.balance import MAX_IDLE, balance
from pytest_reshard.checkers.downtime import MAX_PAUSE_STEPS, MAX_STALL_STEPS, downtime

__all__ = [
    # the checkers, as pure functions
    "no_rewind", "loss_continuity", "measure_spread", "exactly_once_samples", "state_equivalence",
    "liveness", "poisoned_commit", "sample_ledger", "has_roles", "throughput", "role_rate",
    "role_work", "RoleRate", "memory_headroom", "allocator_fragmentation", "crash_consistency",
    "one_step_checkpoint", "silent_corruption", "balance", "downtime",
    # their constants
    "SPREAD_FACTOR", "ROUNDING_FLOOR", "PRE_UPDATE", "PIPELINE_ROLES", "MEMORY_MARGIN",
    "FRAGMENTATION_ALERT", "FRAGMENTATION_MIN_FREE", "MAX_IDLE",
    "MAX_PAUSE_STEPS", "MAX_STALL_STEPS",
    # the registry
    "Checker", "CheckFn", "CheckContext", "CleanRuns", "ReferenceRuns", "RegistrationError",
    "RESERVED_ASSERTIONS", "register", "add", "unregister", "registered", "get", "by_assertion",
    "run_all", "columns", "noise_floor_roles",
]
