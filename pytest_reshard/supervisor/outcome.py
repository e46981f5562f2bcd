"""What one generation's watch produces and holds: its Outcome, the progress Status, the first
Failure, and the PendingEnd a planned fault or the workload's own request put in motion; or the
HarnessError that ends a run the harness could not watch."""
from __future__ import annotations

import errno
import os
import random
from dataclasses import dataclass, field
from typing import Any

from pytest_reshard.contract import Cause, Ev, name_of
from pytest_reshard.schedule import kinds

__all__ = ["Outcome", "Status", "Failure", "PendingEnd", "HarnessError", "REFUSED_WRITE",
           "rebalanced"]

#: What a file system says when it refuses the run folder's writes.
REFUSED_WRITE = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO})


class HarnessError(RuntimeError):
    """The harness could not record the run (its run folder refused a write): the run was
    stopped, every process it started is gone, and there is no verdict on the workload."""

    @classmethod
    def refused(cls, run_dir: Any, code: int, who: str) -> "HarnessError":
        return cls(f"pytest-reshard: not judged: {who} could not write into the run folder "
                   f"{run_dir} ([Errno {code}] {os.strerror(code)}), so the recorded history is "
                   "incomplete; the run was stopped. Free space on that file system (or make it "
                   "writable), or point --reshard-artifacts at another one, and run it again.")


@dataclass
class Outcome:
    """How a generation ended and what comes next."""

    cause: Cause
    planned: bool = False
    fault_id: int | None = None
    detail: str = ""
    next_world_size: int | None = None  # None: the run is over
    lost_rank: int | None = None    # the rank whose unplanned loss ended the generation
    next_roles: Any = None          # roles a planned change asks for (counts or a list)
    device_map: list[int] | None = None  # the next generation's rank -> device map (rebalance)
    next_devices: list[str] | None = None  # the next generation's device classes (change_devices)
    live: bool = False              # the next generation is these processes, re-formed in place
    replaced: int | None = None     # the rank whose process a migration replaces (same world)
    at: float | None = None         # when it ended (time.time()), if not when the watch returned


@dataclass(frozen=True)
class Status:
    """Where a scenario is, for the live progress line (``Supervisor.on_status``)."""

    gen: int
    world_size: int
    step: int | None     # the highest step any rank of the generation began
    steps: int
    faults_fired: int
    faults_total: int
    name: str = ""       # the scenario, set by the runner

    def line(self) -> str:
        step = "starting" if self.step is None else f"step {self.step + 1}/{self.steps}"
        return (f"{self.name}: generation {self.gen} (world size {self.world_size}), {step}, "
                f"faults {self.faults_fired}/{self.faults_total}")


@dataclass(frozen=True)
class Failure:
    """The first unplanned loss of a generation: who, how, when (monotonic), in words."""

    rank: int
    code: int | None
    at: float
    detail: str


@dataclass
class PendingEnd:
    """A planned end under way: a planned fault fired (``kind`` names it) or the workload asked
    to drain (``kind`` is None); the ranks must be gone by ``deadline`` (monotonic; None: no
    deadline is enforced any more)."""

    cause: Cause
    fault_id: int | None
    step: int | None
    phase: str | None
    params: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    deadline: float | None = None
    kind: str | None = None

    @classmethod
    def of_fault(cls, ev: dict[str, Any], declared: kinds.FaultKind,
                 deadline: float) -> "PendingEnd":
        assert declared.cause is not None
        return cls(declared.cause, ev["id"], ev["step"], ev["phase"], ev["params"],
                   deadline=deadline, kind=ev["kind"])

    @classmethod
    def of_request(cls, ev: dict[str, Any], fault_id: int | None, now: float) -> "PendingEnd":
        """The workload drains itself (``run.request_reshard``, e.g. its health monitor saw an
        ECC error): attributed to the last fault that fired in the generation, if any."""
        assert name_of(ev) == Ev.REQUEST
        return cls(Cause.DRAIN, fault_id, ev.get("step"), "request",
                   {"to_world_size": ev["to_world_size"]}, reason=ev.get("reason", ""),
                   deadline=now + float(ev.get("grace_s", 30.0)))

    @property
    def requested(self) -> bool:
        return self.kind is None

    @property
    def declared(self) -> kinds.FaultKind | None:
        return None if self.kind is None else kinds.get(self.kind)

    @property
    def label(self) -> str:
        return self.kind or Cause.DRAIN.value

    def missed(self, alive: list[int], gen: int) -> Outcome:
        """The ranks outlived the deadline (they are killed): an unplanned failure."""
        declared = self.declared
        period = "notice" if declared and declared.deadline_param == "notice_s" else "grace period"
        return Outcome(Cause.FAILURE, fault_id=self.fault_id,
                       detail=f"{self.label} at step {self.step} {self.phase}: ranks {alive} were "
                              f"still running when the {period} ran out (generation {gen}); "
                              "killed them")

    def outcome(self, world_size: int, seed: int, sigtermed: set[int]) -> Outcome:
        """How this end closes the generation, and what the next one is."""
        declared = self.declared
        params = self.params
        after = params.get("to_world_size") or params.get("then_world_size") or world_size
        detail = (f"the workload asked to drain to {after} ranks: {self.reason}"
                  if self.requested else f"{self.kind} at step {self.step} {self.phase}")
        device_map = None
        if declared is not None and declared.relocates:
            device_map = rebalanced(world_size, params["fraction"], f"{seed}:{self.fault_id}")
            detail += f": rank r now on device {device_map}[r]"
        replaced = int(params["rank"]) if declared is not None and declared.replaces else None
        if replaced is not None:
            detail += f": rank {replaced}'s shard moves to a new process"
        if params.get("roles"):
            detail += f"; roles now {dict(params['roles'])}"
        if params.get("devices"):
            detail += f"; devices now {', '.join(params['devices'])}"
        if sigtermed:
            detail += (f"; rank{'s' if len(sigtermed) > 1 else ''} "
                       f"{', '.join(map(str, sorted(sigtermed)))} died of its SIGTERM: "
                       "the workload does not handle SIGTERM (ask run.stop_requested() and "
                       "save when it is true), so a preemption costs all since its last "
                       "checkpoint")
        return Outcome(self.cause, planned=True, fault_id=self.fault_id, detail=detail,
                       next_world_size=int(after), device_map=device_map,
                       next_roles=params.get("roles"), next_devices=params.get("devices"),
                       replaced=replaced)


def rebalanced(world_size: int, fraction: float, seed: str) -> list[int]:
    """A rank -> device map that moves ``fraction`` of the ranks (at least two) to other devices:
    the chosen ones rotate one place among themselves, drawn from ``seed`` for replays."""
    moved = sorted(random.Random(seed).sample(range(world_size),
                                               min(world_size, max(2, round(fraction * world_size)))))
    device_map = list(range(world_size))
    for i, shard in enumerate(moved):
        device_map[shard] = moved[(i + 1) % len(moved)]
    return device_map
