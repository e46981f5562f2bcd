"""Chaos injectors: each returns a :class:`~pytest_reshard.schedule.Fault` for a schedule.

Every injector fires inside the targeted ranks at an exact fault point (``at_step``, ``phase``),
so "mid-step" is replayable; whatever must come from outside (a deadline, SIGKILL after a grace
period, relaunching at a new world size) the supervisor enforces. Each docstring says which layer
the fault really exercises and what it does not prove.

Targets: ``rank=N``, ``role="drafter"``, or ``target="all" | "one" | "minority"`` (drawn from the
schedule's seed, so replays pick the same ranks).
"""
from __future__ import annotations

from pytest_reshard.schedule import Fault, ScheduleError

__all__ = ["ecc_error", "hang", "kill", "preempt", "shift_shards", "Fault"]


def _target(rank: int | None, role: str | None, target: str | None, default: str) -> str:
    given = [x for x in (rank, role, target) if x is not None]
    if len(given) > 1:
        raise ScheduleError("name the target once: rank=, role= or target=")
    if rank is not None:
        return f"rank:{int(rank)}"
    if role is not None:
        return f"role:{role}"
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


def shift_shards(*, to_world_size: int, at_step: int, phase: str = "optimizer",
                 notice_s: float = 10.0) -> Fault:
    """A planned reshard to ``to_world_size`` with ``notice_s`` of advance notice.

    Layer: the scheduler's notice reaches every rank at the fault point
    (``run.reshard_requested()``); the workload must checkpoint and exit before the deadline,
    after which the supervisor kills it; the next generation runs at the new world size and the
    workload's own load path reshards. Must cost zero committed steps. Does not move live
    tensors between running processes (no in-place resharding), and does not model the
    scheduler's own failures.
    """
    if int(to_world_size) < 1:
        raise ScheduleError(f"to_world_size must be >= 1, got {to_world_size}")
    return Fault("shift_shards", "all", at_step, phase,
                 {"to_world_size": int(to_world_size), "notice_s": _positive("notice_s", notice_s)})


def hang(*, at_step: int, phase: str = "backward", rank: int | None = None,
         role: str | None = None, target: str | None = None,
         then_world_size: int | None = None) -> Fault:
    """Stop the target (SIGSTOP) at the fault point: a wedged rank that neither dies nor works.

    Layer: a real SIGSTOP; the rank's heartbeat stops, so the supervisor names it within
    ``hang_s`` (default 1 s) instead of waiting for gloo's 30-minute timeout, kills the
    generation and starts the next at ``then_world_size`` (default the same size). Its peers
    block in their next collective, as in production. Does not reproduce a hang *inside* a
    collective kernel with a live heartbeat (that shows up as a stall, after ``stall_s``).
    """
    params = {} if then_world_size is None else {"then_world_size": int(then_world_size)}
    return Fault("hang", _target(rank, role, target, "one"), at_step, phase, params)


def ecc_error(*, at_step: int, phase: str = "forward", rank: int | None = None,
              role: str | None = None, target: str | None = None, kind: str = "dbe",
              xid: int = 48, layer: str = "telemetry") -> Fault:
    """An ECC error on the target's device, at one of two layers (choose with ``layer``).

    - ``layer="telemetry"``: the counters a health monitor polls change at the fault point:
      volatile DBE/SBE count, retired pages, an Xid event (48 double-bit, 63 page retirement
      recorded, 64 retirement failed), served through ``pytest_reshard.telemetry`` (NVML readings
      plus injected counts on a GPU; injected counts alone on CPU). Proves the workload's health
      monitor notices and drains the rank without committing the poisoned step.
    - ``layer="compute"``: the rank raises the CUDA error text ("CUDA error: uncorrectable ECC
      error encountered") at the point, as a kernel launch would. Proves the workload's error path.

    Neither breaks memory: no bit flips, no real Xid in the kernel log, no driver reset. On a GPU
    runner with DCGM, ``dcgmi test --inject`` can inject at the field level instead.
    """
    if kind not in ("dbe", "sbe"):
        raise ScheduleError(f"ecc_error kind must be 'dbe' or 'sbe', got {kind!r}")
    if xid not in (48, 63, 64):
        raise ScheduleError(f"ecc_error xid must be 48, 63 or 64, got {xid!r}")
    if layer not in ("telemetry", "compute"):
        raise ScheduleError(f"ecc_error layer must be 'telemetry' or 'compute', got {layer!r}")
    return Fault("ecc_error", _target(rank, role, target, "one"), at_step, phase,
                 {"kind": kind, "xid": int(xid), "layer": layer})
