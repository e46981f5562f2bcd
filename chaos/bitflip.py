"""``bitflip``: silent data corruption: one bit of one tensor of one rank, at a step and phase."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of
from pytest_reshard.contract import FLIPPED, Ev
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run

TENSORS = ("param", "grad", "optimizer")


def bitflip(*, rank: int | None = None, at_step: int, phase: str = "optimizer",
            tensor: str = "param", name: str | None = None, index: int = 0, bit: int = 30,
            target: str | None = None) -> Fault:
    """Flip bit ``bit`` (0 the lowest of the element's bytes, as a little-endian integer) of
    element ``index`` of one tensor on one rank at the fault point: a parameter (``param``), its
    gradient (``grad``: at ``phase="optimizer"``, after backward, before the update), or an
    optimizer moment (``optimizer``: the first tensor of that parameter's optimizer state, such
    as Adam's ``exp_avg``). ``name`` is the parameter's name in ``model.named_parameters()``
    (default: the first). The workload names its model and optimizer once with
    ``run.expose(model=..., optimizer=...)``. Bit 30 of a float32 is the top of its exponent (a
    value near 1 becomes about 1e38); a low bit makes a change no loss shows.

    Judged by ``silent_corruption`` (no corrupted state reaches a committed checkpoint unnoticed;
    the workload says it noticed with ``run.detected``) and by ``loss_continuity`` against the
    clean run.

    Layer: the tensor's bytes in the rank's memory, changed in place, as a bit flip in device
    memory without ECC (or in a path ECC does not cover) would change them. Does not model where
    real flips land (they are not uniform over tensors), a flip inside a kernel's registers or a
    collective's buffer, or flips in activations; on a GPU it flips the device tensor through
    torch, not DRAM cells.
    """
    if tensor not in TENSORS:
        raise ScheduleError(f"bitflip tensor must be one of {TENSORS}, got {tensor!r}")
    if int(index) < 0 or not 0 <= int(bit) < 64:
        raise ScheduleError(f"bitflip needs index >= 0 and 0 <= bit < 64, got {index!r}, {bit!r}")
    params: dict[str, Any] = {"tensor": tensor, "index": int(index), "bit": int(bit)}
    if name is not None:
        params["name"] = str(name)
    return Fault("bitflip", target_of(rank, None, target, "one"), at_step, phase, params)


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    import torch

    from pytest_reshard.rank.probe import FaultNotInjected

    p = fault["params"]
    model, optimizer = run.exposed().get("model"), run.exposed().get("optimizer")
    if model is None:
        raise FaultNotInjected("bitflip needs the model: call run.expose(model=..., optimizer=...) "
                               "before the first step")
    named = dict(model.named_parameters())
    name = p.get("name") or next(iter(named))
    if name not in named:
        raise FaultNotInjected(f"bitflip: the model has no parameter {name!r}; it has "
                               f"{', '.join(list(named)[:8])}")
    param = named[name]
    if p["tensor"] == "param":
        t = param.data
    elif p["tensor"] == "grad":
        t = param.grad
    else:
        state = optimizer.state.get(param, {}) if optimizer is not None else {}
        t = next((v for v in state.values() if torch.is_tensor(v) and v.numel() > 1), None)
    if t is None:
        raise FaultNotInjected(f"bitflip: {name} has no {p['tensor']} tensor at step "
                               f"{fault['step']}, phase {fault['phase']} (a gradient exists after "
                               "backward; an optimizer moment after the first update)")
    if hasattr(t, "to_local"):   # a DTensor (FSDP2): this rank's shard, same storage
        t = t.to_local()
    flat = t.detach().view(-1)
    index, bit = p["index"] % flat.numel(), p["bit"] % (8 * flat.element_size())
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    before = flat[index].item()
    raw = flat.view(ints)
    raw[index] = raw[index] ^ (torch.ones((), dtype=ints) << bit)
    run.emit(Ev.NOTE, what=FLIPPED, step=fault["step"], tensor=p["tensor"], name=name,
             index=index, bit=bit, before=before, after=flat[index].item())


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    """A tensor that exists at the point: a gradient at ``optimizer``, a moment after the
    first update; any bit, so a flip may be loud or invisible."""
    from hypothesis import strategies as st

    tensors = ["param", *(["grad"] if ctx.phase == "optimizer" else []),
               *(["optimizer"] if ctx.step > 0 else [])]
    return bitflip(rank=draw(st.integers(0, ctx.world_size - 1)), at_step=ctx.step,
                   phase=ctx.phase, tensor=draw(st.sampled_from(tensors)),
                   index=draw(st.integers(0, 4095)), bit=draw(st.integers(0, 31)))


register(FaultKind("bitflip", execute=execute, ending=Ending.NONE, label="bit flip", draw=_draw,
                   doc=bitflip.__doc__ or ""))
