"""``change_devices``: the device mix of a heterogeneous world changes, with notice."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from pytest_reshard.chaos._common import positive
from pytest_reshard.chaos.shift_shards import execute
from pytest_reshard.contract import DEVICE_CLASSES, OWN_GPUS, Cause
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register


def change_devices(*, devices: Sequence[str] | Mapping[str, int], at_step: int,
                   phase: str = "optimizer", notice_s: float = 10.0) -> Fault:
    """The job moves to a new device mix at the fault point, with ``notice_s`` of notice:
    ``devices`` as ``Scenario.devices`` takes it (counts in rank order, or one class per rank),
    and the world size becomes the number of devices (needs ``devices=`` on the scenario).

    Layer: that of ``shift_shards`` (notice, checkpoint, exit, relaunch), and the next
    generation's ranks run as their new classes (CPU caps or stretch,
    ``pytest_reshard.supervisor.devices``). A workload that sizes its shares by its ranks'
    speeds must size them again: ``balance`` judges each generation. Does not move shards
    between live processes, nor model a scheduler's own protocol for it.
    """
    names = [n for n, k in devices.items() for _ in range(int(k))] \
        if isinstance(devices, Mapping) else [str(n) for n in devices]
    unknown = sorted({n for n in names if n not in DEVICE_CLASSES})
    if not names or unknown:
        raise ScheduleError(f"change_devices needs one known class per rank, got {devices!r}"
                            f" (known: {', '.join(DEVICE_CLASSES)})")
    return Fault("change_devices", "all", at_step, phase,
                 {"devices": names, "to_world_size": len(names),
                  "notice_s": positive("notice_s", notice_s)})


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    size = draw(st.sampled_from(list(ctx.world_sizes)))
    names = draw(st.lists(st.sampled_from(list(DEVICE_CLASSES)), min_size=size, max_size=size))
    return change_devices(devices=names, at_step=ctx.step, phase=ctx.phase,
                          notice_s=ctx.notice_s)


def _requires(options: Mapping[str, Any]) -> str | None:
    if not options.get("devices"):
        return "change_devices changes a heterogeneous world's mix: give the scenario devices="
    if options.get("throttle") == OWN_GPUS:
        return ("change_devices changes a mix made on CPU, and a GPU keeps its class: name the "
                "classes (devices=[...]) instead of devices='gpu'")
    return None


register(FaultKind("change_devices", execute=execute, ending=Ending.PLANNED,
                   cause=Cause.REBALANCE, deadline_param="notice_s", default_target="all",
                   draw=_draw, requires=_requires, label="device change",
                   doc=change_devices.__doc__ or ""))
