"""Chaos injectors: each returns a :class:`~pytest_reshard.schedule.Fault` for a schedule.

Every injector fires inside the targeted ranks at an exact fault point (``at_step``, ``phase``),
so "mid-step" is replayable; whatever must come from outside (a deadline, SIGKILL after a grace
period, relaunching at a new world size) the supervisor enforces. Each docstring says which layer
the fault really exercises and what it does not prove.

Targets: ``rank=N``, ``role="drafter"``, or ``target="all" | "one" | "minority"`` (drawn from the
schedule's seed, so replays pick the same ranks). ``role=`` means one rank of the role for the
faults that hit one victim by default (``kill``, ``crash_silently``, ``hang``, ``slow_rank``,
``ecc_error``, ``memory_pressure``) and every rank of it for the others (``preempt``); say
``target="role:drafter"`` for all of them, ``target="role:drafter:one"`` for one.
"""
from __future__ import annotations

from collections.abc import Mapping

from pytest_reshard.schedule import Fault, ScheduleError

__all__ = ["crash_silently", "drain", "ecc_error", "hang", "kill", "kill_during_save",
           "kill_node", "memory_pressure", "preempt", "rebalance", "shift_shards", "slow_rank", "Fault"]


def _target(rank: int | None, role: str | None, target: str | None, default: str) -> str:
    given = [x for x in (rank, role, target) if x is not None]
    if len(given) > 1:
        raise ScheduleError("name the target once: rank=, role= or target=")
    if rank is not None:
        return f"rank:{int(rank)}"
    if role is not None:  # a fault that picks one victim picks one rank of the role
        return f"role:{role}:one" if default == "one" else f"role:{role}"
    return target or default


def _positive(name: str, value: float) -> float:
    if not value > 0:
        raise ScheduleError(f"{name} must be > 0, got {value!r}")
    return float(value)


def kill(*, at_step: int, phase: str = "backward", rank: int | None = None,
         role: str | None = None, target: str | None = None,
         then_world_size: int | None = None) -> Fault:
    """SIGKILL the target at the fault point: an unplanned loss (a node dies, an ECC drain).

    Layer: a real SIGKILL, raised by the rank itself at the point so the timing is exact; peers
    see the dead connection exactly as in production. The next generation starts at
    ``then_world_size`` (default: the same size, a replacement node). Proves that the workload
    resumes within its declared rewind budget; it does not exercise a network partition or a
    half-written file system (the kernel still flushes what the rank wrote).
    """
    params = {} if then_world_size is None else {"then_world_size": int(then_world_size)}
    return Fault("kill", _target(rank, role, target, "one"), at_step, phase, params)


def kill_node(*, rank: int, at_step: int, phase: str = "backward") -> Fault:
    """The node that hosts ``rank`` dies at the fault point: its torchrun agent and every rank
    on it, at once (needs ``launcher="elastic"`` with ``nodes >= 2``).

    Layer: real SIGKILLs of the agent and its workers, raised by the rank itself so the timing is
    exact. The surviving agents see their workers fail, meet again at the c10d rendezvous without
    the dead node and restart the workers at the smaller world size, all torch's own elastic
    machinery; the workload must reshard on load within its rewind budget. Does not prove a
    silent partition (packets dropped, no connection reset) or a node rejoining.
    """
    return Fault("kill_node", _target(rank, None, None, "one"), at_step, phase, {})


def preempt(*, at_step: int, phase: str = "forward", rank: int | None = None,
            role: str | None = None, target: str | None = None, grace_s: float = 10.0,
            then_world_size: int | None = None) -> Fault:
    """Spot preemption: SIGTERM at the fault point, SIGKILL if still alive after ``grace_s``.

    Layer: a real SIGTERM delivered to the rank's process (the probe turns it into
    ``run.stop_requested()``); the supervisor enforces the grace period from outside. Must cost
    zero committed steps. Does not prove anything about a cloud provider's metadata-endpoint
    warning or a node that vanishes without SIGTERM (that is ``kill``).
    """
    params: dict = {"grace_s": _positive("grace_s", grace_s)}
    if then_world_size is not None:
        params["then_world_size"] = int(then_world_size)
    return Fault("preempt", _target(rank, role, target, "all"), at_step, phase, params)


def shift_shards(*, to_world_size: int | None = None, at_step: int, phase: str = "optimizer",
                 notice_s: float = 10.0, roles: Mapping[str, int] | None = None) -> Fault:
    """A planned reshard to ``to_world_size`` with ``notice_s`` of advance notice.

    ``roles`` (e.g. ``{"target": 3, "drafter": 1}``) also moves ranks between roles: a planned
    topology change such as seed 001's 5 targets + 3 drafters -> 6 + 2 (the world size then
    defaults to the sum). Without it the ranks keep their roles, trimmed at the end.

    Layer: the scheduler's notice reaches every rank at the fault point
    (``run.reshard_requested()``); the workload must checkpoint and exit before the deadline,
    after which the supervisor kills it; the next generation runs at the new world size (and
    roles: ``run.roles``) and the workload's own load path reshards. Must cost zero committed
    steps. Does not move live tensors between running processes (no in-place resharding), and
    does not model the scheduler's own failures.
    """
    params: dict = {"notice_s": _positive("notice_s", notice_s)}
    if roles is not None:
        counts = {str(k): int(v) for k, v in dict(roles).items()}
        if not counts or any(v < 0 for v in counts.values()) or sum(counts.values()) < 1:
            raise ScheduleError(f"roles must map role names to rank counts (>= 0, at least one "
                                f"rank in all), got {roles!r}")
        total = sum(counts.values())
        if to_world_size is not None and int(to_world_size) != total:
            raise ScheduleError(f"roles {counts} name {total} ranks but to_world_size is "
                                f"{to_world_size}; make them agree (or leave to_world_size out)")
        params["roles"] = {k: v for k, v in counts.items() if v}
        to_world_size = total
    if to_world_size is None:
        raise ScheduleError("shift_shards needs to_world_size= (or roles=)")
    if int(to_world_size) < 1:
        raise ScheduleError(f"to_world_size must be >= 1, got {to_world_size}")
    params["to_world_size"] = int(to_world_size)
    return Fault("shift_shards", "all", at_step, phase, params)


def rebalance(*, fraction: float = 0.2, at_step: int, phase: str = "optimizer",
              notice_s: float = 10.0) -> Fault:
    """A new shard placement at the same world size (seed 000's 20% rebalance), with notice.

    Layer: like ``shift_shards`` (notice, checkpoint, exit, relaunch), but the next generation
    keeps its size and ``fraction`` of the ranks (at least two) run on other devices:
    ``LOCAL_RANK`` and ``run.device_map`` say which. On a GPU runner every moved shard really
    lands on another GPU; on CPU only the processes change. Does not move live tensors.
    """
    if not 0 < fraction <= 1:
        raise ScheduleError(f"rebalance fraction must be in (0, 1], got {fraction}")
    return Fault("rebalance", "all", at_step, phase,
                 {"fraction": float(fraction), "notice_s": _positive("notice_s", notice_s)})


def hang(*, at_step: int, phase: str = "backward", rank: int | None = None,
         role: str | None = None, target: str | None = None, mode: str = "sigstop",
         then_world_size: int | None = None) -> Fault:
    """A rank that neither dies nor works, from the fault point on.

    - ``mode="sigstop"``: a real SIGSTOP. Its heartbeat stops and the kernel reports it stopped,
      so the supervisor names it within ``hang_s`` (default 1 s) instead of waiting for gloo's
      30-minute timeout.
    - ``mode="block"``: the rank's main thread blocks inside the phase while the process and its
      heartbeat stay alive, as a rank wedged in a collective kernel does; its peers block in their
      next collective. Nothing beats the clock here: the supervisor sees a *stall* after
      ``stall_s`` (default 10 s) without progress from any rank.

    Either way the supervisor then SIGKILLs the hung rank only, as a scheduler's health check
    would; its peers fail their next collective and get ``failure_grace_s`` to save what they
    hold before the generation ends, and the next starts at ``then_world_size`` (default the
    same size). Does not reproduce a GPU kernel spinning on the device.
    """
    if mode not in ("sigstop", "block"):
        raise ScheduleError(f"hang mode must be 'sigstop' or 'block', got {mode!r}")
    params: dict = {"mode": mode}
    if then_world_size is not None:
        params["then_world_size"] = int(then_world_size)
    return Fault("hang", _target(rank, role, target, "one"), at_step, phase, params)


def crash_silently(*, at_step: int, phase: str = "backward", rank: int | None = None,
                   role: str | None = None, target: str | None = None,
                   then_world_size: int | None = None) -> Fault:
    """The target vanishes with exit code 0 and no traceback (seed 001's silent drafter death).

    Layer: ``os._exit(0)`` at the point, so no exception handler, atexit hook or probe ``exit``
    event runs. The supervisor must notice a rank that left early without a planned event.
    Does not reproduce a CUDA driver killing the process from outside.
    """
    params = {} if then_world_size is None else {"then_world_size": int(then_world_size)}
    return Fault("crash_silently", _target(rank, role, target, "one"), at_step, phase, params)


def kill_during_save(*, at_step: int, boundary: str = "commit", rank: int | None = None,
                     target: str | None = None) -> Fault:
    """SIGKILL a rank inside a checkpoint save: at its start (``boundary="start"``, phase
    ``checkpoint``) or after the shards are written but before the save is committed
    (``boundary="commit"``, phase ``checkpoint_commit``). ``at_step`` must be a step that saves.

    Layer: a real SIGKILL while the files of a save exist half-way; proves the resume takes the
    newest *complete* checkpoint. Needs a workload that marks those phases (the bundled LM does).
    Does not tear a single file at the byte level (the kernel keeps what was written).
    """
    phases = {"start": "checkpoint", "commit": "checkpoint_commit"}
    if boundary not in phases:
        raise ScheduleError(f"kill_during_save boundary must be 'start' or 'commit', got {boundary!r}")
    return Fault("kill", _target(rank, None, target, "one"), at_step, phases[boundary], {})


def slow_rank(*, at_step: int, delay_ms: float, steps: int = 1, phase: str = "forward",
              rank: int | None = None, role: str | None = None,
              target: str | None = None) -> Fault:
    """A straggler: the target sleeps ``delay_ms`` at the point, for ``steps`` consecutive steps.

    Layer: wall-clock delay in the rank's own thread, so its peers wait in the next collective
    and the per-rank timings in the history show who was slow. Does not model a slow link or
    thermal throttling (the delay is not in the collective itself).
    """
    if int(steps) < 1:
        raise ScheduleError(f"slow_rank steps must be >= 1, got {steps}")
    return Fault("slow_rank", _target(rank, role, target, "one"), at_step, phase,
                 {"delay_ms": _positive("delay_ms", delay_ms), "steps": int(steps)})


def memory_pressure(*, at_step: int, bytes: int, phase: str = "begin", rank: int | None = None,
                    role: str | None = None, target: str | None = None) -> Fault:
    """Hold ``bytes`` more on the target from the point on (seed 001: +200 MB per GPU after a
    torch upgrade). CUDA memory when the rank uses a GPU, else resident host memory.

    With ``memory_budget_bytes`` set on the scenario, the supervisor ends a rank whose peak RSS
    passes the budget (as the OOM killer would) and the verdict names the rank and phase; the
    ``memory_headroom`` check flags ranks that come within a margin of it. On CPU it proves the
    accounting and the loud failure, not CUDA allocator fragmentation.
    """
    if int(bytes) <= 0:
        raise ScheduleError(f"memory_pressure bytes must be > 0, got {bytes}")
    return Fault("memory_pressure", _target(rank, role, target, "one"), at_step, phase,
                 {"bytes": int(bytes)})


def drain(*, world_size: int, at_step: int, fraction: float = 0.5, waves: int = 2,
          every: int = 2, notice_s: float = 30.0) -> list[Fault]:
    """A maintenance window (seed 000): drain ``fraction`` of ``world_size`` ranks in ``waves``
    planned reshards, ``every`` steps apart, each with ``notice_s`` of notice.

    Returns several faults; pass them in ``faults=`` as they are (nested lists are flattened).
    Layer: that of ``shift_shards``, repeated: each wave is a full save, exit and resharded load.
    """
    if not 0 < fraction < 1:
        raise ScheduleError(f"drain fraction must be between 0 and 1, got {fraction}")
    drained = max(1, round(world_size * fraction))
    if int(waves) < 1 or waves > drained:
        raise ScheduleError(f"drain waves must be between 1 and {drained} (ranks drained)")
    sizes, left = [], world_size
    for wave in range(waves):
        left -= drained // waves + (1 if wave < drained % waves else 0)
        sizes.append(left)
    return [shift_shards(to_world_size=size, at_step=at_step + i * every, notice_s=notice_s)
            for i, size in enumerate(sizes)]


def ecc_error(*, at_step: int, phase: str = "forward", rank: int | None = None,
              role: str | None = None, target: str | None = None, kind: str = "dbe",
              xid: int | None = None, layer: str = "telemetry",
              then_world_size: int | None = None) -> Fault:
    """An ECC error on the target's device, at one of two layers (choose with ``layer``).

    - ``layer="telemetry"``: the counters a health monitor polls change at the fault point:
      volatile DBE/SBE count, retired pages, an Xid event (48 double-bit, 63 page retirement
      recorded, 64 retirement failed, 94/95 contained/uncontained on A100 and newer; none for a
      correctable ``sbe`` unless given), served through ``pytest_reshard.telemetry`` (NVML readings
      plus injected counts on a GPU; injected counts alone on CPU). Proves the workload's health
      monitor notices and drains the rank without committing the poisoned step.
    - ``layer="compute"``: the rank raises the CUDA error text ("CUDA error: uncorrectable ECC
      error encountered") at the point, as a kernel launch would. Proves the workload's error path.

    Neither breaks memory: no bit flips, no real Xid in the kernel log, no driver reset. On a GPU
    runner with DCGM, ``dcgmi test --inject`` can inject at the field level instead.
    """
    if kind not in ("dbe", "sbe"):
        raise ScheduleError(f"ecc_error kind must be 'dbe' or 'sbe', got {kind!r}")
    if xid is None:
        xid = 48 if kind == "dbe" else None  # a correctable error raises no Xid
    if xid not in (None, 48, 63, 64, 94, 95):
        raise ScheduleError(f"ecc_error xid must be 48, 63, 64, 94 or 95, got {xid!r}")
    if layer not in ("telemetry", "compute"):
        raise ScheduleError(f"ecc_error layer must be 'telemetry' or 'compute', got {layer!r}")
    params: dict = {"kind": kind, "xid": xid, "layer": layer}
    if then_world_size is not None:  # after a compute-layer death
        params["then_world_size"] = int(then_world_size)
    return Fault("ecc_error", _target(rank, role, target, "one"), at_step, phase, params)
