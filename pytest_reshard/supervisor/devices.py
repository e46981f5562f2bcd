"""A heterogeneous world: each rank a device class of its own speed and memory, made real on CPU.

``Scenario.devices`` names each rank's class (``{"h100": 2, "a100": 1, "l40s": 1}`` or a list).
On CPU a class's speed becomes a cap on the rank's CPU time: its share of this machine's CPUs
(``0.5 * cpus / world_size``: the rest for the harness and the machine's own work, so that a
rank's rate does not swing with them) times the class's speed relative to the fastest known class
(``REFERENCE``, an H100). The reference is the same in every generation and every run: relative
to each generation's own fastest class, a generation after a change of the mix that lost its
fastest class would run at full speed and its slowdown would disappear; relative to the fastest
class the schedule ever brings in, dropping a change of the mix (as shrinking does) would change
the caps of the generations before it. The cap is a cgroup's CPU quota (``cpu.max`` on cgroup
v2, ``cpu.cfs_quota_us`` on v1) where this process may make cgroups (root), which the rank joins
as it attaches; elsewhere the probe *stretches* each step instead, sleeping ``(1 / speed - 1)``
times the step's own time after it, as a host thread waits on a slower device. ``Throttle.mode``
says which, and the history records it with each generation's classes (``Ev.DEVICES``).

On a GPU runner ``devices="gpu"`` takes the real devices instead: each rank's class is read from
the GPU it computes on (``gpu_classes``: rank ``r`` on the ``r``-th visible GPU, wrapped around,
as the bundled workloads pick ``cuda:LOCAL_RANK``), nothing is capped or stretched, and the mode
is ``OWN_GPUS``. A GPU of no known class is an error that names it.

What it models: a rank that computes slower, so its peers wait for it at every collective.
What it does not: memory bandwidth, NVLink or PCIe, a device's own memory size (recorded, not
enforced), and, with the cgroup cap, it slows the rank's communication as much as its compute.
A cap under the kernel's smallest quota (``QUOTA_MIN_US`` per period: many slow ranks on few
CPUs) is raised to it: the ``cpus`` recorded are the caps enforced, and ``why`` names the ranks
that run faster than their class.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_reshard import procfs
from pytest_reshard.contract import DEVICE_CLASSES, OWN_GPUS, visible_gpus

__all__ = ["MODES", "REFERENCE", "Throttle", "class_of", "expand_devices", "gpu_classes",
           "next_devices"]


CGROUP_V2, CGROUP_V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000   # short, so that a short step feels its cap as a slower rate
QUOTA_MIN_US = 1000  # the kernel refuses a smaller CPU quota (cgroup v1 and v2)
#: The speed every class is relative to, in every generation and every run: the fastest known.
REFERENCE = max(c.speed for c in DEVICE_CLASSES.values())


def expand_devices(spec: Sequence[str] | Mapping[str, int], world_size: int) -> list[str]:
    """``{"h100": 2, "a100": 1}`` (counts, in rank order) or a list -> one class per rank."""
    names = [n for n, k in spec.items() for _ in range(int(k))] if isinstance(spec, Mapping) \
        else [str(n) for n in spec]
    unknown = sorted({n for n in names if n not in DEVICE_CLASSES})
    if unknown:
        raise ValueError(f"devices {spec!r}: unknown class {', '.join(unknown)}; known: "
                         f"{', '.join(DEVICE_CLASSES)}")
    if len(names) != world_size:
        raise ValueError(f"devices {spec!r} name {len(names)} ranks but the world size is "
                         f"{world_size}; make the counts add up")
    return names


def class_of(gpu_name: str) -> str:
    """The device class of a GPU by its product name (``NVIDIA H100 80GB HBM3`` -> ``h100``)."""
    squeezed = "".join(c for c in gpu_name.lower() if c.isalnum())
    found = [name for name in DEVICE_CLASSES if name in squeezed]
    if len(found) != 1:
        raise ValueError(f"devices='gpu': the GPU {gpu_name!r} is of no known class (known: "
                         f"{', '.join(DEVICE_CLASSES)}); name each rank's class instead, "
                         "devices=[...], and say so in the test")
    return found[0]


def gpu_classes(world_size: int, env: Mapping[str, str] | None = None) -> tuple[list[str], str]:
    """``devices="gpu"``: the class of the GPU each rank computes on (rank ``r`` on the ``r``-th
    GPU of ``CUDA_VISIBLE_DEVICES``, or of the machine, wrapped around), and a line naming the
    GPUs. No GPU is an error."""
    env = os.environ if env is None else env
    ids = visible_gpus(env)
    if ids == []:
        raise ValueError(f"devices='gpu' reads each rank's class from its GPU, but "
                         f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} shows none: name the classes "
                         "(devices=[...]) to make them on CPU, or mark the test @pytest.mark.gpu")
    listed = _nvidia_smi()
    by_id = {key: name for index, uuid, name in listed for key in (index, uuid)}
    ids = [index for index, _, _ in listed] if ids is None else ids
    if not ids:
        raise ValueError("devices='gpu': nvidia-smi lists no GPU here: name the classes "
                         "(devices=[...]) instead")
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ValueError(f"devices='gpu': nvidia-smi lists no GPU {', '.join(missing)} of "
                         f"CUDA_VISIBLE_DEVICES; it lists {', '.join(sorted(by_id))}")
    per_rank = [by_id[ids[r % len(ids)]] for r in range(world_size)]
    return [class_of(n) for n in per_rank], "each rank's own GPU: " + ", ".join(
        f"rank {r} {n}" for r, n in enumerate(per_rank))


def _nvidia_smi() -> list[tuple[str, str, str]]:
    """Every GPU of this machine as NVML numbers and names it: (index, UUID, product name)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise ValueError("devices='gpu' reads the GPUs' names with nvidia-smi, which is not on "
                         "PATH here: name the classes (devices=[...]) instead")
    out = subprocess.run([smi, "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    rows = [[field.strip() for field in line.split(",", 2)] for line in out.splitlines()]
    return [(row[0], row[1], row[2]) for row in rows if len(row) == 3]


def next_devices(devices: Sequence[str], size: int, *, lost: int | None = None) -> list[str]:
    """The classes of the next generation: the same ranks less the one lost (its device went
    with it), trimmed at the end, or extended with the last class."""
    out = list(devices)
    if lost is not None and size < len(out) and lost < len(out):
        del out[lost]
    return (out + out[-1:] * size)[:size]


MODES = ("auto", "cgroup", "stretch", OWN_GPUS)


class Throttle:
    """Per-rank CPU caps for one run: cgroups where they can be made (``mode="auto"``, or
    ``"cgroup"``: an error where they cannot), else the probe's stretch (``"stretch"``); none
    on the ranks' own GPUs (``OWN_GPUS``, with ``why`` naming them)."""

    def __init__(self, run_id: str, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"throttle={mode!r}: use one of {', '.join(MODES)}")
        self.root, self.v1, self.why = None, False, ""
        if mode == OWN_GPUS:
            self.mode = OWN_GPUS           # nothing to make: plan() reads the GPUs' classes
        elif mode == "stretch":
            self.mode, self.why = "stretch", "stretch asked for"
        else:
            self.root, self.v1, self.why = _cgroup_root(f"{os.getpid()}-{run_id}")
            if mode == "cgroup" and self.root is None:
                raise RuntimeError(f"throttle='cgroup' was asked for, but {self.why}")
            self.mode = "cgroup" if self.root is not None else "stretch"
        self.cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)

    def plan(self, gen: int, devices: Sequence[str]) -> dict[str, Any]:
        """The generation's ``devices`` entry of its plan: each rank's class, speed (relative
        to ``REFERENCE``) and, under cgroups, the CPUs it may use and the group that caps it.
        On the ranks' own GPUs the classes are read from them, for this generation's size."""
        if self.mode == OWN_GPUS:
            devices, self.why = gpu_classes(len(devices))
        speeds = [round(DEVICE_CLASSES[d].speed / REFERENCE, 4) for d in devices]
        entry: dict[str, Any] = {"classes": list(devices), "speeds": speeds, "mode": self.mode,
                                 "why": self.why}
        if self.root is not None:   # half the CPUs left to the harness and the machine
            share = 0.5 * self.cpus / len(devices)
            quotas = [quota_us(speed * share) for speed in speeds]
            self._weigh(len(devices))
            entry["cgroups"] = [str(self._group(gen, r, q)) for r, q in enumerate(quotas)]
            entry["cpus"] = [q / PERIOD_US for q in quotas]
            entry["period_s"] = PERIOD_US / 1e6
            raised = [r for r, speed in enumerate(speeds) if speed * share * PERIOD_US < QUOTA_MIN_US]
            if raised:
                entry["why"] = (f"rank{'s' if len(raised) > 1 else ''} "
                                f"{', '.join(map(str, raised))} capped at the kernel's smallest "
                                f"quota ({QUOTA_MIN_US / PERIOD_US:g} CPUs), faster than "
                                f"{'their class' if len(raised) > 1 else 'its class'}: run fewer "
                                f"ranks or give the run more CPUs")
        return entry

    def _weigh(self, ranks: int) -> None:
        """Weigh the run's groups (and their parent) as ``ranks`` processes of the machine: a
        group weighs one process by default, so under load the ranks would share one process's
        CPU time, below their caps, and the classes' ratios would shrink."""
        assert self.root is not None
        name, weight = ("cpu.shares", 1024 * ranks) if self.v1 else \
            ("cpu.weight", min(10000, 100 * ranks))
        for group in (self.root.parent, self.root):
            with contextlib.suppress(OSError):
                (group / name).write_text(str(weight))

    def _group(self, gen: int, rank: int, quota: int) -> Path:
        assert self.root is not None
        group = self.root / f"g{gen}-r{rank}"
        group.mkdir(exist_ok=True)
        if self.v1:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        return group

    def close(self) -> None:
        """Remove the run's groups; their processes are gone (a group with one left stays, and
        the next run's sweep of its parent takes it)."""
        if self.root is None:
            return
        for group in sorted(self.root.glob("g*-r*")):
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            self.root.rmdir()
        self.root = None


def quota_us(cpus: float) -> int:
    """The CPU quota per ``PERIOD_US`` that caps a rank at ``cpus``, no less than the kernel
    takes."""
    return max(QUOTA_MIN_US, int(cpus * PERIOD_US))


def _cgroup_root(run_id: str) -> tuple[Path | None, bool, str]:
    """The run's own cgroup folder (made now), whether it is cgroup v1, and why none."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None, False, "cgroups need root: each rank's steps are stretched"
    for base, v1 in ((CGROUP_V2, False), (CGROUP_V1, True)):
        if not (base / ("cpu.cfs_quota_us" if v1 else "cgroup.controllers")).exists():
            continue
        if not v1 and "cpu" not in (base / "cgroup.subtree_control").read_text().split():
            continue   # v2 without the cpu controller delegated to children
        parent = base / "pytest-reshard"
        try:
            parent.mkdir(exist_ok=True)
            if not v1:   # delegate the cpu controller to the run's groups
                (parent / "cgroup.subtree_control").write_text("+cpu")
            _sweep(parent)
            root = parent / run_id
            root.mkdir(exist_ok=True)
            return root, v1, ""
        except OSError as e:
            return None, False, f"making a cgroup under {base} failed ({e}): steps are stretched"
    return None, False, "no cgroup cpu controller here: each rank's steps are stretched"


def _sweep(parent: Path) -> None:
    """Remove the groups of runs whose supervisor is gone (killed before its close)."""
    for root in parent.iterdir():
        pid = root.name.split("-")[0]
        if root.is_dir() and not (pid.isdigit() and procfs.alive(int(pid))):
            for group in root.glob("g*-r*"):
                with contextlib.suppress(OSError):
                    group.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()

