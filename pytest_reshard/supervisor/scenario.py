"""A scenario: everything that defines a run, as JSON-serialisable data (saved, and replayed by
``pytest-reshard replay``), and the roles of its ranks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pytest_reshard.schedule import Schedule

__all__ = ["Scenario", "default_roles", "expand_roles", "next_roles"]


@dataclass
class Scenario:
    """Everything that defines a run; JSON-serialisable so it can be saved and replayed."""

    workload: str                  # a bundled workload name ("lm") or a path to a script
    world_size: int
    steps: int
    schedule: Schedule = field(default_factory=Schedule)
    args: list[str] = field(default_factory=list)
    timeout_s: float = 120.0
    backend: str = "gloo"
    launcher: str = "fork"         # a registered launcher (supervisor.launch.registered())
    roles: list[str] | None = None  # role of each rank; default: default_roles(workload, ...)
    hang_s: float = 1.0            # heartbeat silence of a stopped rank (10x if the kernel disagrees)
    stall_s: float = 10.0          # no progress from any rank this long means a stall
    startup_s: float = 60.0        # first event of a generation must come within this
    # after an unplanned death, survivors get this long to exit. Measured under load (2 cores,
    # load 10-18, the bundled suites): a survivor still training was gone within 0.58 s (n=257,
    # 8x), one already exiting within 2.45 s (n=6, 2x; killing it loses nothing)
    failure_grace_s: float = 5.0
    memory_budget_bytes: int | None = None  # per-rank peak RSS budget (CPU); None: unlimited
    min_throughput: float | None = None  # fail a generation below this share of a clean run's tokens/s
    phases: list[str] | None = None  # fault points the workload marks beyond STANDARD_PHASES
    max_generations: int = 12
    nodes: int = 1                 # elastic: torchrun agents, one per node (world_size / nodes ranks each)
    min_nodes: int = 1             # elastic: the rendezvous goes on down to this many nodes
    network: str = "auto"          # elastic: netns (a namespace and address per node), loopback, auto
    files: bool = False            # record every file event of the ranks, and the work folder at each generation's end
    replica_groups: int | None = None  # membership mode: a death restarts only its replica group (world_size / G ranks)
    member_restarts: int = 3       # membership mode: restarts allowed per replica group and generation
    member_restart_delay_s: float = 0.0  # membership mode: a dead group comes back this much later
    lighthouse: dict[str, Any] | None = None  # membership mode: host torchft's Lighthouse with these settings
    devices: list[str] | None = None  # each rank's device class (supervisor/devices.py): a heterogeneous world
    throttle: str = "auto"         # devices: "cgroup" (CPU quota), "stretch" (sleep after each step), auto, "gpu"
    max_idle: float = 0.10         # devices: the most of its steps a rank may idle at collectives (balance)
    settle_steps: int = 1          # devices: steps of each generation balance leaves out (warm-up, measuring shares)
    max_stall_steps: float = 2.0   # the longest step while a live handover is prepared, in median steps (downtime)
    max_pause_steps: float = 10.0  # the longest a live handover's swap may take, in median steps (downtime)

    def initial_roles(self) -> list[str]:
        """Each rank's role in the first generation: as given, else the workload's default."""
        return expand_roles(self.roles, self.world_size) if self.roles else \
            default_roles(self.workload, self.world_size)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["schedule"] = self.schedule.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Scenario":
        d = dict(d)
        d["schedule"] = Schedule.from_dict(d.get("schedule", {}))
        return cls(**d)


def default_roles(workload: str, world_size: int) -> list[str]:
    """Each rank's role when the scenario names none, as the workload's spec says."""
    from pytest_reshard.workloads import get

    spec = get(workload)
    return spec.roles(world_size) if spec is not None else ["trainer"] * world_size


def expand_roles(spec: Sequence[str] | Mapping[str, int], world_size: int | None = None) -> list[str]:
    """``{"target": 3, "drafter": 1}`` (counts, in order) or an explicit list -> one role per rank."""
    if isinstance(spec, Mapping):
        roles = [role for role, n in spec.items() for _ in range(int(n))]
    else:
        roles = [str(r) for r in spec]
    if not roles or any(not r for r in roles):
        raise ValueError(f"roles {spec!r}: name at least one rank's role, none empty")
    if world_size is not None and len(roles) != world_size:
        raise ValueError(f"roles {spec!r} name {len(roles)} ranks but the world size is "
                         f"{world_size}; make the counts add up")
    return roles


def next_roles(roles: Sequence[str], size: int, *, lost: int | None = None,
               wanted: Sequence[str] | Mapping[str, int] | None = None) -> list[str]:
    """The roles of the next generation: as a planned change says (``wanted``), else the same
    ranks less the one that was lost, else trimmed (or extended) at the end."""
    if wanted:
        return expand_roles(wanted, size)
    out = list(roles)
    if lost is not None and size < len(out) and lost < len(out):
        del out[lost]
    while len(out) > size:  # trim from the end, but never a role's last rank
        spare = [i for i, r in enumerate(out) if out.count(r) > 1]
        del out[spare[-1] if spare else -1]
    out.extend(out[-1:] * (size - len(out)) if out else ["trainer"] * size)
    return out


