"""Sharing one machine between pytest-xdist workers, and one suite between machines.

Under ``pytest -n N`` every worker runs scenarios of its own at the same time, so what a scenario
takes from the machine must not collide:

- **ports**: the rendezvous store binds port 0 (the kernel picks a free one, race-free), but a
  port that we pick and hand to another process (torchrun's ``--rdzv-endpoint``) is free only
  when picked. Each worker picks from its own range (``RESHARD_PORT_RANGE``), below the kernel's
  ephemeral range (or its share of a ``RESHARD_PORT_RANGE=LO-HI`` given for the run), so neither
  another worker nor a kernel-assigned port can take it meanwhile;
- **GPUs**: each worker sees a disjoint share of the machine's GPUs (NVML's inventory, or
  ``nvidia-smi``'s) through ``CUDA_VISIBLE_DEVICES``, so no two scenarios share a device;
- **artifacts**: each worker writes under ``<artifacts>/<worker id>/`` (its reference runs too).

``shard`` splits a suite between machines: ``--reshard-shard=I/N`` keeps every N-th test.
No torch import here: this runs in ``pytest_configure``, before anything touches CUDA.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from pytest_reshard.contract import visible_gpus
from pytest_reshard.supervisor.launch import parse_port_range

PORT_BASE = 20000          # worker ranges start here ...
PORT_SPAN = 500            # ... and are this wide (narrower when many workers must fit)
EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"


@dataclass(frozen=True)
class Layout:
    """What this xdist worker may use."""

    worker: str                   # "gw0"
    index: int
    count: int
    ports: tuple[int, int]        # [lo, hi)
    gpus: tuple[str, ...] | None  # None: no GPU inventory here (a CPU machine)
    gpu_total: int
    gpu_note: str                 # where the inventory came from, or why there is none


def ephemeral_low(path: str = EPHEMERAL) -> int:
    """The lowest port the kernel hands out for port 0 (32768 when it cannot be read)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range(index: int, count: int, *, low_ephemeral: int | None = None,
               pool: tuple[int, int] | None = None) -> tuple[int, int]:
    """Worker ``index`` of ``count``'s own ports [lo, hi): disjoint from every other worker's.
    Carved from ``pool`` when given (a ``RESHARD_PORT_RANGE`` set for the whole run), else from
    the ports between PORT_BASE and the kernel's ephemeral range."""
    if pool is None:
        top = ephemeral_low() if low_ephemeral is None else low_ephemeral
        pool = (PORT_BASE, top)
    span = min(PORT_SPAN, (pool[1] - pool[0]) // max(count, 1))
    if span < 8:
        raise RuntimeError(f"{count} xdist workers cannot each get a port range of 8 or more in "
                           f"{pool[0]}-{pool[1]}; use fewer workers or a wider "
                           "RESHARD_PORT_RANGE=LO-HI")
    lo = pool[0] + index * span
    return lo, lo + span


def gpu_inventory(env: Mapping[str, str] | None = None) -> tuple[list[str] | None, str]:
    """The GPUs this process may hand out (ids as ``CUDA_VISIBLE_DEVICES`` takes them), and where
    that came from. An already set ``CUDA_VISIBLE_DEVICES`` is the inventory; else NVML, else
    ``nvidia-smi``; None with the reason when there is no GPU inventory (a CPU machine)."""
    env = os.environ if env is None else env
    ids = visible_gpus(env)
    if ids is not None:
        return ids, "CUDA_VISIBLE_DEVICES"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())], "NVML"
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        why = "pynvml is not installed (the gpu extra)"
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound and friends: no driver
        why = f"NVML: {e}"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            return [line.strip() for line in out.splitlines() if line.strip()], "nvidia-smi"
        except (subprocess.SubprocessError, OSError) as e:
            why += f"; nvidia-smi: {e}"
    return None, (why if smi else f"no GPU inventory ({why}; no nvidia-smi)")


def gpu_share(gpus: Sequence[str], index: int, count: int) -> list[str]:
    """Worker ``index`` of ``count``'s disjoint, contiguous share (empty when GPUs < workers)."""
    n = len(gpus)
    return list(gpus[index * n // count:(index + 1) * n // count])


def configure(wid: str, count: int, environ: MutableMapping[str, str] | None = None) -> Layout:
    """For xdist worker ``wid`` of ``count``: claim its ports and GPUs in the environment (the
    scenarios' processes inherit it) and return the layout."""
    env = os.environ if environ is None else environ
    digits = "".join(c for c in wid if c.isdigit())
    index = int(digits) if digits else 0
    pool = parse_port_range(env["RESHARD_PORT_RANGE"]) if env.get("RESHARD_PORT_RANGE") else None
    ports = port_range(index, count, pool=pool)  # a range given for the run is split too
    env["RESHARD_PORT_RANGE"] = f"{ports[0]}-{ports[1]}"
    inventory, note = gpu_inventory(env)
    share: list[str] | None = None
    if inventory is not None:
        share = gpu_share(inventory, index, count)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(share)  # "" hides every GPU from this worker
    return Layout(wid, index, count, ports, None if share is None else tuple(share),
                  len(inventory or ()), note)


def shard(nodeids: Sequence[str], spec: str) -> set[str]:
    """The node ids shard ``I/N`` keeps: every N-th of the sorted ids, from the I-th (1-based).
    Every machine must collect the same tests (same checkout, same options); together the N
    shards then run each test exactly once, and each gets the same number, give or take one."""
    i, n = parse_shard(spec)
    return {nid for k, nid in enumerate(sorted(set(nodeids))) if k % n == i - 1}


def parse_shard(spec: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--reshard-shard={spec!r}: expected I/N, e.g. 1/4") from None
    if not 1 <= i <= n:
        raise ValueError(f"--reshard-shard={spec!r}: need 1 <= I <= N")
    return i, n
