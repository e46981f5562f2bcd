"""``ecc_error``: an ECC error on the target's device, at the telemetry or the compute layer."""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of, then
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run

CUDA_ECC_ERROR = "CUDA error: uncorrectable ECC error encountered"


class EccLayer(str, enum.Enum):
    """Where the injected ECC error shows (``ecc_error(layer=...)`` takes the value or member)."""

    TELEMETRY = "telemetry"   # the counters a health monitor polls change
    COMPUTE = "compute"       # the CUDA error text is raised at the point


def ecc_error(*, at_step: int, phase: str = "forward", rank: int | None = None,
              role: str | None = None, target: str | None = None, kind: str = "dbe",
              xid: int | None = None, layer: str = EccLayer.TELEMETRY,
              then_world_size: int | None = None) -> Fault:
    """An ECC error on the target's device, at one of two layers (choose with ``layer``).

    - ``layer="telemetry"``: the counters a health monitor polls change at the fault point:
      volatile DBE/SBE count, retired pages, an Xid event (48 double-bit, 63 page retirement
      recorded, 64 retirement failed, 94/95 contained/uncontained on A100 and newer; none for a
      correctable ``sbe`` unless given), served through ``pytest_reshard.telemetry`` (NVML readings
      plus injected counts on a GPU; injected counts alone on CPU). Proves the workload's health
      monitor notices and drains the rank without committing the poisoned step.
    - ``layer="compute"``: the rank raises the CUDA error text ("CUDA error: uncorrectable ECC
      error encountered") at the point, as a kernel launch would. Proves the workload's error
      path; the rank's death is then an unplanned loss.

    Neither breaks memory: no bit flips, no real Xid in the kernel log, no driver reset. On a GPU
    runner with DCGM, ``dcgmi test --inject`` can inject at the field level instead.
    """
    if kind not in ("dbe", "sbe"):
        raise ScheduleError(f"ecc_error kind must be 'dbe' or 'sbe', got {kind!r}")
    if xid is None:
        xid = 48 if kind == "dbe" else None  # a correctable error raises no Xid
    if xid not in (None, 48, 63, 64, 94, 95):
        raise ScheduleError(f"ecc_error xid must be 48, 63, 64, 94 or 95, got {xid!r}")
    try:
        layer = EccLayer(layer)
    except ValueError:
        raise ScheduleError(f"ecc_error layer must be 'telemetry' or 'compute', got {layer!r}") from None
    return Fault("ecc_error", target_of(rank, role, target, "one"), at_step, phase,
                 {"kind": kind, "xid": xid, "layer": layer.value, **then(then_world_size)})


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    params = fault["params"]
    if params.get("layer", EccLayer.TELEMETRY) == EccLayer.COMPUTE:
        from pytest_reshard.rank.probe import InjectedFault

        raise InjectedFault(f"{CUDA_ECC_ERROR} (injected: {params.get('kind', 'dbe')}, "
                            f"Xid {params.get('xid') or 48})")
    from pytest_reshard.rank import telemetry

    telemetry.inject_ecc(run, kind=params.get("kind", "dbe"), xid=params.get("xid"))


def _ending(params: Mapping[str, Any]) -> Ending:
    """Only a raised CUDA error kills the rank; a counter the workload reads does not."""
    return Ending.DEATH if params.get("layer") == EccLayer.COMPUTE else Ending.NONE


register(FaultKind("ecc_error", execute=execute, ending=_ending, doc=ecc_error.__doc__ or ""))
