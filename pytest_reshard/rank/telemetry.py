"""Device telemetry for a rank: one sample of memory, utilisation, clocks and health, on GPU or CPU;
and device health for a workload's health monitor: ECC counters, retired pages, Xid events.

    from pytest_reshard import telemetry

    s = telemetry.sample()          # this rank's device: NVML on a GPU, this process on CPU
    s.source                        # "nvml" or "cpu" (and s.note says why not NVML)
    s.memory_used, s.memory_total   # bytes: the GPU's memory, or this process's RSS and the host's RAM
    s.headroom                      # memory_total - memory_used
    s.utilization, s.clocks         # GPU busy %, {"sm": MHz, "memory": MHz, "graphics": MHz}; None/{} on CPU
    s.cpu_time, s.memory_peak       # this process's CPU seconds and peak RSS (both sources)
    s.health                        # a HealthSnapshot (ECC counters, retired pages, Xids)

A field a source cannot read is None, never a 0 standing in for "unknown". On CUDA,
``allocator_fragmentation()`` reads the caching allocator (1 - largest free block / total free)
and ``record_allocator(run)`` puts it in the history for the ``allocator_fragmentation`` checker;
on CPU there is no caching allocator and both return None. Fragmentation is measured because a
shard migration needs large contiguous blocks: past about 30% of free memory it fails although
enough memory is free in total.

    from pytest_reshard import telemetry

    health = telemetry.DeviceHealth.for_this_rank()   # NVML for LOCAL_RANK's GPU, if any
    seen = health.poll()
    for step in ...:
        ...                                            # forward, backward
        errors = health.new_errors(seen)               # before the optimizer update
        seen = health.last
        if any(e.fatal for e in errors):
            ...                                        # do not apply the update; drain the rank

What a monitor reads (``HealthSnapshot``): the volatile double-bit (uncorrectable) and
single-bit (corrected) ECC counts, the retired pages by cause, and the Xid events seen since the
monitor started. ``new_errors`` says what changed, in words, and whether it is fatal: any new
DBE, any new retired page (or remapped row), and Xid 48 (DBE), 63 (retirement / row remapping
recorded), 64 (retirement / remapping failed), 94 and 95 (contained / uncontained ECC error, how
A100 and newer report an uncorrectable error) and 79 (fallen off the bus). A new SBE alone was
corrected by the hardware: reported, not fatal.

Two sources, added together (``source`` names those that were read):

- **NVML** (``nvidia-ml-py``, optional, the ``gpu`` extra): ``nvmlDeviceGetTotalEccErrors``
  (volatile counters), ``nvmlDeviceGetRetiredPages`` by cause, or on A100 and newer, which remap
  rows instead of retiring pages, ``nvmlDeviceGetRemappedRows`` (uncorrectable rows count as
  ``retired_pages_dbe``, correctable as ``retired_pages_sbe``), and Xid critical-error events
  registered at start. Without a GPU ``nvmlInit`` raises ``NVMLError_LibraryNotFound`` (value
  12): the monitor degrades to the other source and says why (``DeviceHealth.nvml_error``); it
  never makes up a GPU reading. A query the device does not support (ECC off, a consumer GPU)
  reads 0 and is listed in ``DeviceHealth.unsupported``.
- **injected** counts, written by the chaos harness (``chaos.ecc_error(layer="telemetry")``
  calls ``inject_ecc`` inside the targeted rank at the fault point) to
  ``RESHARD_DIR/telemetry/g{generation}-r{rank}.json``, one file per rank and generation
  (a drained device does not follow its rank number into the next generation). Written
  atomically (temporary file, then ``os.replace``); a missing file is zeros, an unreadable one
  keeps the last good reading, so counters never go backwards.

Outside the harness and without NVML every reading is zeros with ``source="none"``.

Fidelity: what this layer proves and what it does not
-----------------------------------------------------
It exercises the layer a job's own logic reads: the counters and events a health monitor polls,
and the workload's reaction to them (agree across ranks, do not commit the poisoned step, save,
drain). It does **not** flip a bit, corrupt a tensor, make a CUDA call fail, write an Xid to the
kernel log (``dmesg``), make the driver retire a page or remap a row, or reset a GPU; an NVML
reading on a GPU runner stays the device's real one, the injected counts are added on top. The
CUDA-error side (a kernel that returns "uncorrectable ECC error encountered") is the other layer,
``chaos.ecc_error(layer="compute")``. On GPU runners with DCGM, field injection
(``dcgmi test --inject --gpuid 0 -f 311 -v 1``: field 311 is ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``,
230 ``DCGM_FI_DEV_XID_ERRORS``) is the higher-fidelity option: it reaches the DCGM telemetry a
production monitor reads (DCGM health watches, dcgm-exporter alerts, node problem detectors),
but not NVML's own counters, which this module reads, and it is still not a memory fault.

No torch import; ``pynvml`` is imported only when a ``DeviceHealth`` is created.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_reshard import procfs
from pytest_reshard.contract import Env, write_json

__all__ = [
    "HealthSnapshot", "HealthError", "DeviceHealth", "inject_ecc", "injected_path", "changes",
    "fatal", "is_ecc_error", "XID", "FATAL_XIDS", "ECC_ERROR_TEXT", "Sample", "Telemetry",
    "sample", "allocator_fragmentation", "record_allocator",
]

TELEMETRY_DIR = "telemetry"

#: What the Xids a health monitor acts on mean (NVIDIA's Xid catalog).
XID = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
}
#: Xids after which the device's memory (or the device) can no longer be trusted.
FATAL_XIDS = frozenset(XID)
#: The text of the CUDA error a kernel returns after an uncorrectable ECC error
#: (``cudaErrorECCUncorrectable``, 214), as torch raises it.
ECC_ERROR_TEXT = "uncorrectable ECC error"
_COUNTERS = ("ecc_dbe_volatile", "ecc_sbe_volatile", "retired_pages_dbe", "retired_pages_sbe")


@dataclass(frozen=True)
class HealthSnapshot:
    """One reading of a device's health counters (NVML plus injected, see ``source``)."""

    ecc_dbe_volatile: int = 0
    ecc_sbe_volatile: int = 0
    retired_pages_dbe: int = 0
    retired_pages_sbe: int = 0
    xid_events: tuple[int, ...] = ()
    source: str = "none"   # "nvml" | "injected" | "nvml+injected" | "none"

    def __add__(self, other: "HealthSnapshot") -> "HealthSnapshot":
        sources = [s for s in (self.source, other.source) if s != "none"]
        counts = {c: getattr(self, c) + getattr(other, c) for c in _COUNTERS}
        return HealthSnapshot(
            **counts, xid_events=self.xid_events + other.xid_events,
            source="+".join(sources) if sources else "none")


class HealthError(str):
    """One change between two snapshots, in words; ``fatal``: the device's memory can no longer
    be trusted (the step that saw it must not be committed)."""

    fatal: bool

    def __new__(cls, text: str, *, fatal: bool) -> "HealthError":
        obj = super().__new__(cls, text)
        obj.fatal = fatal
        return obj

    def __reduce__(self) -> Any:  # picklable (all_gather_object), keeping ``fatal``
        return (_health_error, (str(self), self.fatal))


def _health_error(text: str, fatal: bool) -> HealthError:
    return HealthError(text, fatal=fatal)


def changes(before: HealthSnapshot, after: HealthSnapshot, device: str = "0") -> list[HealthError]:
    """What changed from ``before`` to ``after``: fatal first, then correctable, in words.

    Counters that went down (a driver reload resets the volatile ones) are not errors. Xids are
    compared as multisets, so the same Xid seen twice more is two events.
    """
    hard: list[HealthError] = []
    soft: list[HealthError] = []
    on = f"on device {device}"
    if after.ecc_dbe_volatile > before.ecc_dbe_volatile:
        hard.append(HealthError(f"volatile DBE count {before.ecc_dbe_volatile} -> "
                                 f"{after.ecc_dbe_volatile} {on}", fatal=True))
    if after.retired_pages_dbe > before.retired_pages_dbe:
        hard.append(HealthError(f"retired pages (double-bit ECC) {before.retired_pages_dbe} -> "
                                 f"{after.retired_pages_dbe} {on}", fatal=True))
    if after.retired_pages_sbe > before.retired_pages_sbe:
        hard.append(HealthError(f"retired pages (repeated single-bit ECC) "
                                 f"{before.retired_pages_sbe} -> {after.retired_pages_sbe} {on}",
                                 fatal=True))
    new_xids = Counter(after.xid_events) - Counter(before.xid_events)
    for xid in sorted(new_xids.elements()):
        what = XID.get(xid, "not an ECC event")
        fatal_xid = xid in FATAL_XIDS
        (hard if fatal_xid else soft).append(HealthError(f"Xid {xid} ({what}) {on}",
                                                          fatal=fatal_xid))
    if after.ecc_sbe_volatile > before.ecc_sbe_volatile:
        soft.append(HealthError(f"volatile SBE count {before.ecc_sbe_volatile} -> "
                                f"{after.ecc_sbe_volatile} {on} (corrected)", fatal=False))
    return hard + soft


def is_ecc_error(error: BaseException) -> bool:
    """True for the CUDA error an uncorrectable ECC error raises (``cudaErrorECCUncorrectable``)."""
    return ECC_ERROR_TEXT in str(error)


# -- the injected source -------------------------------------------------------------------------
def injected_path(root: str | os.PathLike[str], generation: int, rank: int) -> Path:
    """Where the harness keeps the injected counts of ``rank`` in ``generation``."""
    return Path(root) / TELEMETRY_DIR / f"g{int(generation)}-r{int(rank)}.json"


def _parse(data: Mapping[str, Any]) -> HealthSnapshot:
    counts = {c: int(data.get(c, 0)) for c in _COUNTERS}
    if any(v < 0 for v in counts.values()):
        raise ValueError(f"negative counter in {dict(data)!r}")
    xids = tuple(int(x) for x in data.get("xid_events", ()))
    return HealthSnapshot(**counts, xid_events=xids, source="injected")


def _read_injected(path: Path) -> HealthSnapshot | None:
    """The injected counts, or None when there is no file; raises ValueError on a bad one."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return _parse(data)


def inject_ecc(run: Any, kind: str = "dbe", xid: int | None = None) -> HealthSnapshot | None:
    """Add one ECC event to this rank's injected counts (the harness's ``ecc_error`` executor).

    ``kind="dbe"``: volatile DBE +1 and one retired page (double-bit cause); ``kind="sbe"``:
    volatile SBE +1. ``xid`` (if given) is appended to the Xid events. ``run`` is the probe's
    ``Run`` (``active``, ``workdir``, ``generation``, ``rank``); a no-op outside the harness.
    Returns the new injected reading.
    """
    if kind not in ("dbe", "sbe"):
        raise ValueError(f"ECC error kind must be 'dbe' or 'sbe', got {kind!r}")
    if not getattr(run, "active", False) or run.workdir is None:
        return None
    path = injected_path(Path(run.workdir).parent, run.generation, run.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        old = json.loads(path.read_text())
        if not isinstance(old, dict):
            old = {}
    except (OSError, ValueError):
        old = {}
    data: dict[str, Any] = {c: int(old.get(c, 0)) for c in _COUNTERS} | {
        "xid_events": [int(x) for x in old.get("xid_events", [])],
        "injections": list(old.get("injections", []))}
    if kind == "dbe":
        data["ecc_dbe_volatile"] += 1
        data["retired_pages_dbe"] += 1
    else:
        data["ecc_sbe_volatile"] += 1
    if xid is not None:
        data["xid_events"].append(int(xid))
    data["injections"].append({"t": time.time(), "kind": kind, "xid": xid})
    write_json(path, data)
    return _parse(data)


# -- the NVML source -----------------------------------------------------------------------------
class _Nvml:
    """One device through pynvml; every query that the device refuses reads 0."""

    def __init__(self, pynvml: Any, device: str) -> None:
        self.nv = pynvml
        pynvml.nvmlInit()
        try:
            if device.startswith(("GPU-", "MIG-")):
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(device)
            else:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(int(device))
        except Exception:
            pynvml.nvmlShutdown()
            raise
        self.unsupported: dict[str, str] = {}  # query -> why the device refused it
        self.xids: list[int] = []
        self.events = None
        try:
            self.events = pynvml.nvmlEventSetCreate()
            pynvml.nvmlDeviceRegisterEvents(self.handle, pynvml.nvmlEventTypeXidCriticalError,
                                            self.events)
        except pynvml.NVMLError as e:
            self.unsupported["Xid events"] = str(e)
            self.events = None

    def _query(self, name: str, fn: Any, *args: Any) -> Any:
        if name in self.unsupported:
            return None
        try:
            return fn(self.handle, *args)
        except self.nv.NVMLError as e:
            self.unsupported[name] = str(e)
            return None

    def usage(self) -> tuple[int | None, int | None, float | None, dict[str, int]]:
        """(memory used, memory total, GPU utilisation %, clocks in MHz); None where refused."""
        nv = self.nv
        mem = self._query("memory info", nv.nvmlDeviceGetMemoryInfo)
        util = self._query("utilization", nv.nvmlDeviceGetUtilizationRates)
        clocks = {}
        for name, kind in (("sm", "NVML_CLOCK_SM"), ("memory", "NVML_CLOCK_MEM"),
                           ("graphics", "NVML_CLOCK_GRAPHICS")):
            mhz = self._query(f"{name} clock", nv.nvmlDeviceGetClockInfo, getattr(nv, kind))
            if mhz is not None:
                clocks[name] = int(mhz)
        return (int(mem.used) if mem is not None else None,
                int(mem.total) if mem is not None else None,
                float(util.gpu) if util is not None else None, clocks)

    def read(self) -> HealthSnapshot:
        nv = self.nv
        dbe = self._query("volatile DBE", nv.nvmlDeviceGetTotalEccErrors,
                          nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC) or 0
        sbe = self._query("volatile SBE", nv.nvmlDeviceGetTotalEccErrors,
                          nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC) or 0
        pages_dbe = self._query("retired pages", nv.nvmlDeviceGetRetiredPages,
                                nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pages_sbe = self._query("retired pages", nv.nvmlDeviceGetRetiredPages,
                                nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        if pages_dbe is None and pages_sbe is None:
            rows = self._query("remapped rows", nv.nvmlDeviceGetRemappedRows)  # A100 and newer
            corrected, uncorrected = (int(rows[0]), int(rows[1])) if rows else (0, 0)
        else:
            corrected, uncorrected = len(list(pages_sbe or ())), len(list(pages_dbe or ()))
        if self.events is not None:
            while True:
                try:
                    data = nv.nvmlEventSetWait(self.events, 0)
                except nv.NVMLError_Timeout:
                    break
                except nv.NVMLError as e:
                    self.unsupported["Xid events"] = str(e)
                    self.events = None
                    break
                if data.eventType & nv.nvmlEventTypeXidCriticalError:
                    self.xids.append(int(data.eventData))
        return HealthSnapshot(int(dbe), int(sbe), uncorrected, corrected, tuple(self.xids), "nvml")

    def close(self) -> None:
        try:
            if self.events is not None:
                self.nv.nvmlEventSetFree(self.events)
            self.nv.nvmlShutdown()
        except Exception:
            pass


def _nvml_device(env: Mapping[str, str], local_rank: int) -> str:
    """NVML's name for the rank's GPU: NVML ignores CUDA_VISIBLE_DEVICES, so map through it.

    A UUID entry is exact; an index entry is NVML's index, which matches CUDA's only with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (prefer UUIDs in CUDA_VISIBLE_DEVICES on mixed nodes).
    """
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if "CUDA_VISIBLE_DEVICES" in env and local_rank < len(visible):
        return visible[local_rank]
    return str(local_rank)


class DeviceHealth:
    """The health counters of one device: NVML (when it works) plus the harness's injected counts.

    ``poll()`` reads both; ``last`` is the latest reading; ``new_errors(since)`` polls and says
    what changed since ``since``. ``nvml_error`` says why NVML is not read (None when it is).
    """

    def __init__(self, *, device: str = "0", injected: Path | None = None,
                 use_nvml: bool = True, label: str | None = None) -> None:
        self.device = device
        self.label = label if label is not None else device
        self.injected = injected
        self.nvml_error: str | None = "not requested"
        self._nvml: _Nvml | None = None
        self._injected_last: HealthSnapshot | None = None
        self.injected_error: str | None = None
        if use_nvml:
            self._nvml, self.nvml_error = self._open_nvml(device)
        self.last = self.poll()

    @staticmethod
    def _open_nvml(device: str) -> tuple[_Nvml | None, str | None]:
        try:
            import pynvml
        except ImportError as e:
            return None, f"pynvml is not installed ({e}); install nvidia-ml-py"
        try:
            return _Nvml(pynvml, device), None
        except Exception as e:  # NVMLError_LibraryNotFound (12) without a GPU, or a bad device
            return None, f"{type(e).__name__}: {e}"

    @classmethod
    def for_this_rank(cls, env: Mapping[str, str] | None = None, *,
                      use_nvml: bool = True) -> "DeviceHealth":
        """The device of this rank (``LOCAL_RANK``), plus its injected file under the harness."""
        env = os.environ if env is None else env
        local_rank = int(env.get("LOCAL_RANK", 0))
        injected = None
        if env.get(Env.DIR):
            injected = injected_path(env[Env.DIR], int(env.get(Env.GENERATION, 0)),
                                     int(env.get("RANK", 0)))
        return cls(device=_nvml_device(env, local_rank), injected=injected, use_nvml=use_nvml,
                   label=str(local_rank))

    @property
    def unsupported(self) -> dict[str, str]:
        """NVML queries this device refused (they read 0), with NVML's reason."""
        return dict(self._nvml.unsupported) if self._nvml is not None else {}

    def _read_injected(self) -> HealthSnapshot | None:
        if self.injected is None:
            return None
        try:
            reading = _read_injected(self.injected)
        except (OSError, ValueError, TypeError) as e:
            self.injected_error = f"{self.injected}: {type(e).__name__}: {e}"
            return self._injected_last      # torn or edited: keep the last good reading
        if reading is None:
            return self._injected_last      # gone after a reading: counters never go back
        self.injected_error = None
        self._injected_last = reading
        return reading

    def poll(self) -> HealthSnapshot:
        """Read the counters now (NVML + injected)."""
        snap = HealthSnapshot()
        if self._nvml is not None:
            try:
                snap = snap + self._nvml.read()
            except Exception as e:   # the library went away mid-run: say so, do not invent
                self.nvml_error = f"{type(e).__name__}: {e}"
                self._nvml.close()
                self._nvml = None
        injected = self._read_injected()
        if injected is not None:
            snap = snap + injected
        self.last = snap
        return snap

    def new_errors(self, since: HealthSnapshot) -> list[HealthError]:
        """Poll, then what changed since ``since`` (fatal first; see ``changes``)."""
        return changes(since, self.poll(), self.label)

    def describe(self) -> str:
        """Where the readings come from, for a log line."""
        parts = [f"device {self.label}: NVML " + ("read" if self._nvml is not None
                                                  else f"not read ({self.nvml_error})")]
        if self.injected is not None:
            parts.append(f"injected counts from {self.injected}")
        return "; ".join(parts)

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None


def fatal(errors: Sequence[HealthError]) -> list[HealthError]:
    """The fatal ones of ``errors``."""
    return [e for e in errors if getattr(e, "fatal", False)]



# -- one sample of a rank's device: NVML on a GPU, this process on CPU ---------------------------
@dataclass(frozen=True)
class Sample:
    """One reading of a rank's device. ``source`` is "nvml" (the GPU) or "cpu" (this process and
    the host: RSS, CPU time); a field the source cannot read is None."""

    source: str
    device: str
    memory_used: int | None       # bytes: GPU memory used | this process's RSS
    memory_total: int | None      # bytes: GPU memory | the host's physical memory
    memory_peak: int | None       # bytes: this process's peak RSS (VmHWM), both sources
    cpu_time: float | None        # seconds of CPU this process used (user + system)
    utilization: float | None     # GPU busy %, NVML only
    clocks: Mapping[str, int]     # MHz by clock (sm, memory, graphics), NVML only
    health: HealthSnapshot        # ECC counters, retired pages, Xid events (NVML + injected)
    note: str = ""                # why the source is not NVML, or the queries the GPU refused

    @property
    def headroom(self) -> int | None:
        """Bytes left before the device (or the host) is full."""
        if self.memory_used is None or self.memory_total is None:
            return None
        return self.memory_total - self.memory_used

    def as_event(self) -> dict[str, Any]:
        """Flat, JSON-ready fields for ``run.note("telemetry", **sample.as_event())``."""
        return {"source": self.source, "device": self.device, "memory_used": self.memory_used,
                "memory_total": self.memory_total, "memory_peak": self.memory_peak,
                "cpu_time": self.cpu_time, "utilization": self.utilization,
                "clocks": dict(self.clocks), "ecc_dbe": self.health.ecc_dbe_volatile,
                "ecc_sbe": self.health.ecc_sbe_volatile,
                "retired_pages": self.health.retired_pages_dbe + self.health.retired_pages_sbe,
                "xids": list(self.health.xid_events), "note": self.note}


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class Telemetry:
    """Samples of one rank's device through one interface (see ``Sample``). Close it."""

    def __init__(self, health: DeviceHealth) -> None:
        self.health = health

    @classmethod
    def for_this_rank(cls, env: Mapping[str, str] | None = None, *,
                      use_nvml: bool = True) -> "Telemetry":
        return cls(DeviceHealth.for_this_rank(env, use_nvml=use_nvml))

    def sample(self) -> Sample:
        snap = self.health.poll()
        times = os.times()
        device, peak = self.health.label, procfs.status_bytes("self", "VmHWM")
        cpu_time = round(times.user + times.system, 3)
        nvml = self.health._nvml
        if nvml is not None:
            used, total, util, clocks = nvml.usage()
            refused = "; ".join(f"{q}: {why}" for q, why in sorted(nvml.unsupported.items()))
            return Sample("nvml", device, memory_used=used, memory_total=total, memory_peak=peak,
                          cpu_time=cpu_time, utilization=util, clocks=clocks, health=snap,
                          note=f"refused: {refused}" if refused else "")
        return Sample("cpu", device, memory_used=procfs.status_bytes("self", "VmRSS"),
                      memory_total=_host_memory(), memory_peak=peak, cpu_time=cpu_time,
                      utilization=None, clocks={}, health=snap,
                      note=f"no GPU reading: {self.health.nvml_error}")

    def close(self) -> None:
        self.health.close()

    def __enter__(self) -> "Telemetry":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sample(device: str | None = None, *, use_nvml: bool = True) -> Sample:
    """One sample of ``device`` (an NVML index or UUID; default: this rank's, via LOCAL_RANK)."""
    health = DeviceHealth.for_this_rank(use_nvml=use_nvml) if device is None else \
        DeviceHealth(device=device, use_nvml=use_nvml)
    with Telemetry(health) as t:
        return t.sample()


# -- the CUDA caching allocator ------------------------------------------------------------------
#: Above this, a large allocation (a shard migration's) may fail although enough memory is free.
FRAGMENTATION_ALERT = 0.30


def fragmentation_of(segments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """1 - largest free block / total free, over the blocks of ``torch.cuda.memory_snapshot()``
    segments (a block whose ``state`` is ``inactive`` is free inside memory the allocator holds)."""
    free = [int(b["size"]) for seg in segments for b in seg.get("blocks", ())
            if b.get("state") == "inactive"]
    total, largest = sum(free), max(free, default=0)
    reserved = sum(int(seg.get("total_size", 0)) for seg in segments)
    return {"fragmentation": round(1 - largest / total, 4) if total else 0.0,
            "largest_free": largest, "total_free": total, "reserved": reserved,
            "free_blocks": len(free)}


def allocator_fragmentation(device: Any = None) -> dict[str, Any] | None:
    """The CUDA caching allocator's fragmentation on ``device``; None without CUDA in use."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    index = torch.cuda.current_device() if device is None else torch.device(device).index
    segments = [seg for seg in torch.cuda.memory_snapshot() if seg.get("device") == index]
    return {"device": index, **fragmentation_of(segments)}


def record_allocator(run: Any, step: int | None = None, device: Any = None) -> dict[str, Any] | None:
    """Record the allocator's fragmentation in the history (``run.note("allocator", ...)``) for
    the ``allocator_fragmentation`` checker; nothing on CPU, where there is no such allocator."""
    stats = allocator_fragmentation(device)
    if stats is not None and getattr(run, "active", False):
        run.note("allocator", step=step, **stats)
    return stats
