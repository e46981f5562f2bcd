"""What the adapters share: per-rank RNG digests, the stop every rank agrees on, version pins."""
from __future__ import annotations

import random
import re
from typing import Any, Iterable

from pytest_reshard import probe


def attach() -> probe.Run:
    """This rank's probe, with a SIGTERM turned into a flag from here on (in and out of the
    harness): what every adapter starts with."""
    run = probe.attach()
    run.stop_requested()
    return run


def rng_state() -> dict[str, Any]:
    """This process's random state as frameworks save it: Python's, NumPy's, torch's (CPU, and
    every CUDA device when there is one)."""
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.random.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def rng_digest() -> str:
    return probe.digest(rng_state())


def distributed() -> tuple[Any, int]:
    """``(torch.distributed, world size)`` when a process group is up, else ``(None, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist, dist.get_world_size()
    return None, 1


def reduce_step(loss_sum: float, stop: bool, device: Any = None) -> tuple[float, bool]:
    """One collective per step: the mean of every rank's loss, and whether any rank must stop
    (a planned reshard's notice or a SIGTERM reached it), so every rank stops after the same
    step."""
    import torch

    dist, world = distributed()
    if dist is None:
        return loss_sum, stop
    t = torch.tensor([float(loss_sum), 1.0 if stop else 0.0], dtype=torch.float64,
                     device=device if device is not None and dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return float(t[0].item()) / world, bool(t[1].item() > 0)


def any_rank(flag: bool, device: Any = None) -> bool:
    return reduce_step(0.0, flag, device)[1]


def stop_wanted(run: probe.Run) -> bool:
    """This rank has a planned reshard pending or got SIGTERM."""
    return run.reshard_requested() is not None or run.stop_requested()


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def require_version(framework: str, version: str, supported: tuple[str, str], tested: str,
                    private: Iterable[str] = ()) -> None:
    """Refuse a framework version outside ``[low, high)``, naming what the adapter relies on."""
    low, high = supported
    if not version_tuple(low) <= version_tuple(version) < version_tuple(high):
        uses = f" It wraps {', '.join(private)}, which are private and may change." if private else ""
        raise RuntimeError(
            f"pytest_reshard.adapters supports {framework} >={low},<{high} (tested with {tested}); "
            f"this is {framework} {version}.{uses} Install a supported version (pip install "
            f"'{framework}>={low},<{high}') or pin it with the `frameworks` extra.")
