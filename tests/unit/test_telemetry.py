"""Unit tests of the device health interface (no processes, no GPU): injected counts, the
classification of changes, NVML through a scripted stand-in, and degrading without it."""
from __future__ import annotations

import json
import pickle
import sys
import types
from pathlib import Path

import pytest

from pytest_reshard import probe, telemetry
from pytest_reshard.telemetry import DeviceHealth, HealthSnapshot, changes


def fake_run(root: Path, generation: int = 0, rank: int = 2, active: bool = True):
    """The parts of probe.Run that inject_ecc reads."""
    return types.SimpleNamespace(active=active, workdir=root / "work", generation=generation,
                                 rank=rank)


def harness_env(root: Path, generation: int = 0, rank: int = 2) -> dict[str, str]:
    return {"RESHARD_DIR": str(root), "RESHARD_GENERATION": str(generation), "RANK": str(rank),
            "LOCAL_RANK": str(rank)}


@pytest.fixture
def no_nvml(monkeypatch):
    """As on a machine without nvidia-ml-py (``import pynvml`` fails)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


class FakeNvml(types.ModuleType):
    """The NVML surface DeviceHealth uses, over one scripted device."""

    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC = 0
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        value = 999

    class NVMLError_LibraryNotFound(NVMLError):
        value = 12

    class NVMLError_NotSupported(NVMLError):
        value = 3

    class NVMLError_Timeout(NVMLError):
        value = 10

    def __init__(self, *, missing_library: bool = False, pages: bool = True) -> None:
        super().__init__("pynvml")
        self.missing_library, self.pages = missing_library, pages
        self.dbe, self.sbe, self.pages_dbe, self.pages_sbe = 0, 0, [], []
        self.rows = (0, 0, 0, 0)
        self.pending_xids: list[int] = []
        self.handles: list[str] = []
        self.shutdowns = 0

    def nvmlInit(self):
        if self.missing_library:
            raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index):
        self.handles.append(f"index:{index}")
        return f"gpu{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handles.append(uuid)
        return uuid

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        assert counter == self.NVML_VOLATILE_ECC
        return self.dbe if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else self.sbe

    def nvmlDeviceGetRetiredPages(self, h, cause):
        if not self.pages:
            raise self.NVMLError_NotSupported("Not Supported")  # A100 and newer remap rows
        return list(self.pages_dbe if cause == 1 else self.pages_sbe)

    def nvmlDeviceGetRemappedRows(self, h):
        return self.rows

    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, h, types_, events):
        assert types_ == self.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait(self, events, timeout_ms):
        assert timeout_ms == 0  # a poll never blocks
        if not self.pending_xids:
            raise self.NVMLError_Timeout("Timeout")
        return types.SimpleNamespace(eventType=self.nvmlEventTypeXidCriticalError,
                                     eventData=self.pending_xids.pop(0))

    def nvmlEventSetFree(self, events):
        pass

    NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
    memory = types.SimpleNamespace(total=80 * 2**30, used=30 * 2**30, free=50 * 2**30)
    busy: int | None = 87

    def nvmlDeviceGetMemoryInfo(self, h):
        return self.memory

    def nvmlDeviceGetUtilizationRates(self, h):
        if self.busy is None:
            raise self.NVMLError_NotSupported("Not Supported")
        return types.SimpleNamespace(gpu=self.busy, memory=40)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return {0: 1755, 1: 1980, 2: 2619}[kind]


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


# -- injected counts -----------------------------------------------------------------------------
def test_inject_then_poll_sees_the_counts(tmp_path, no_nvml):
    health = DeviceHealth.for_this_rank(harness_env(tmp_path))
    assert health.last == HealthSnapshot() and health.last.source == "none"
    telemetry.inject_ecc(fake_run(tmp_path), kind="dbe", xid=48)
    snap = health.poll()
    assert (snap.ecc_dbe_volatile, snap.retired_pages_dbe, snap.ecc_sbe_volatile) == (1, 1, 0)
    assert snap.xid_events == (48,) and snap.source == "injected"
    telemetry.inject_ecc(fake_run(tmp_path), kind="sbe")
    snap = health.poll()
    assert (snap.ecc_dbe_volatile, snap.ecc_sbe_volatile, snap.xid_events) == (1, 1, (48,))
    assert health.last is snap


def test_injected_counts_are_per_rank_and_generation(tmp_path, no_nvml):
    telemetry.inject_ecc(fake_run(tmp_path, generation=0, rank=2), kind="dbe", xid=48)
    for gen, rank in ((0, 1), (1, 2)):   # a drained device does not follow its rank number
        snap = DeviceHealth.for_this_rank(harness_env(tmp_path, gen, rank)).poll()
        assert snap == HealthSnapshot()
    path = telemetry.injected_path(tmp_path, 0, 2)
    assert path == tmp_path / "telemetry" / "g0-r2.json"
    assert json.loads(path.read_text())["injections"][0]["kind"] == "dbe"
    assert [p.name for p in path.parent.iterdir()] == ["g0-r2.json"]  # no temporary file left


def test_the_ecc_executor_injects_at_the_telemetry_layer(tmp_path, no_nvml):
    from pytest_reshard.chaos.ecc_error import execute as ecc_execute

    run = fake_run(tmp_path, rank=1)
    ecc_execute(run, {"params": {"kind": "dbe", "xid": 63, "layer": "telemetry"}})
    snap = DeviceHealth.for_this_rank(harness_env(tmp_path, rank=1)).poll()
    assert snap.ecc_dbe_volatile == 1 and snap.xid_events == (63,)
    with pytest.raises(probe.InjectedFault) as raised:  # the other layer: a CUDA-style error
        ecc_execute(run, {"params": {"kind": "dbe", "xid": 48, "layer": "compute"}})
    assert telemetry.is_ecc_error(raised.value)
    assert not telemetry.is_ecc_error(RuntimeError("Connection closed by peer"))


def test_outside_the_harness_nothing_is_written_and_nothing_read(tmp_path, no_nvml, monkeypatch):
    assert telemetry.inject_ecc(fake_run(tmp_path, active=False)) is None
    assert not (tmp_path / "telemetry").exists()
    monkeypatch.delenv("RESHARD_DIR", raising=False)
    health = DeviceHealth.for_this_rank()
    assert health.injected is None and health.poll() == HealthSnapshot(source="none")
    with pytest.raises(ValueError, match="'dbe' or 'sbe'"):
        telemetry.inject_ecc(fake_run(tmp_path), kind="tbe")


def test_a_torn_or_missing_file_never_loses_or_invents_counts(tmp_path, no_nvml):
    health = DeviceHealth.for_this_rank(harness_env(tmp_path))
    path = telemetry.injected_path(tmp_path, 0, 2)
    path.parent.mkdir(parents=True)
    path.write_text('{"ecc_dbe_volatile": 1, "retired_pa')        # torn, before any good read
    assert health.poll() == HealthSnapshot() and "JSONDecodeError" in health.injected_error
    telemetry.inject_ecc(fake_run(tmp_path), kind="dbe", xid=48)   # rewrites it whole
    good = health.poll()
    assert good.ecc_dbe_volatile == 1 and health.injected_error is None
    path.write_text("[1, 2")                                       # torn after a good read
    assert health.poll() == good and health.injected_error
    path.write_text('{"ecc_dbe_volatile": -3}')                    # nonsense
    assert health.poll() == good
    path.unlink()                                                  # gone: counters never go back
    assert health.poll() == good
    assert changes(good, health.poll()) == []


# -- classification ------------------------------------------------------------------------------
def test_new_errors_classifies_what_is_fatal():
    base = HealthSnapshot(ecc_sbe_volatile=2, source="nvml")
    dbe = changes(base, HealthSnapshot(ecc_dbe_volatile=1, ecc_sbe_volatile=2), device="2")
    assert dbe == ["volatile DBE count 0 -> 1 on device 2"] and dbe[0].fatal
    page = changes(base, HealthSnapshot(ecc_sbe_volatile=2, retired_pages_sbe=1))
    assert len(page) == 1 and page[0].fatal and "retired pages" in page[0]
    for xid in (48, 63, 64):
        (err,) = changes(base, HealthSnapshot(ecc_sbe_volatile=2, xid_events=(xid,)), device="2")
        assert err.fatal and err.startswith(f"Xid {xid} (")
    assert changes(HealthSnapshot(), HealthSnapshot(xid_events=(48,)))[0] == \
        "Xid 48 (double-bit ECC error) on device 0"
    sbe = changes(base, HealthSnapshot(ecc_sbe_volatile=3))
    assert sbe == ["volatile SBE count 2 -> 3 on device 0 (corrected)"] and not sbe[0].fatal
    other = changes(base, HealthSnapshot(ecc_sbe_volatile=2, xid_events=(13,)))
    assert len(other) == 1 and not other[0].fatal and "not an ECC event" in other[0]


def test_fatal_errors_come_first_and_unchanged_or_reset_counters_are_quiet():
    before = HealthSnapshot(ecc_dbe_volatile=4, ecc_sbe_volatile=9, xid_events=(48,))
    assert changes(before, before) == []
    assert changes(before, HealthSnapshot(xid_events=(48,))) == []   # a driver reload reset them
    errors = changes(before, HealthSnapshot(ecc_dbe_volatile=4, ecc_sbe_volatile=10,
                                            xid_events=(48, 48)))
    assert [e.fatal for e in errors] == [True, False] and errors[0].startswith("Xid 48")
    assert telemetry.fatal(errors) == errors[:1]


def test_health_errors_survive_pickling_for_object_collectives():
    (err,) = changes(HealthSnapshot(), HealthSnapshot(ecc_dbe_volatile=1))
    back = pickle.loads(pickle.dumps(err))
    assert back == err and back.fatal is True and isinstance(back, telemetry.HealthError)


# -- NVML ----------------------------------------------------------------------------------------
def test_no_gpu_degrades_and_never_fakes_a_reading(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(missing_library=True))
    health = DeviceHealth.for_this_rank(harness_env(tmp_path))
    assert "NVMLError_LibraryNotFound" in health.nvml_error
    assert health.poll() == HealthSnapshot(source="none")
    telemetry.inject_ecc(fake_run(tmp_path), kind="dbe", xid=48)
    assert health.poll().source == "injected"        # never "nvml": no GPU was read
    assert "NVML not read" in health.describe()


def test_nvml_readings_add_to_injected_ones(tmp_path, nvml):
    health = DeviceHealth.for_this_rank(harness_env(tmp_path))
    assert health.nvml_error is None and health.last.source == "nvml"
    assert nvml.handles == ["index:2"]
    seen = health.last
    nvml.sbe, nvml.pages_sbe = 5, [0x1000]
    nvml.pending_xids = [63]
    telemetry.inject_ecc(fake_run(tmp_path), kind="dbe", xid=48)
    snap = health.poll()
    assert snap.source == "nvml+injected"
    assert (snap.ecc_dbe_volatile, snap.ecc_sbe_volatile) == (1, 5)
    assert (snap.retired_pages_dbe, snap.retired_pages_sbe) == (1, 1)
    assert sorted(snap.xid_events) == [48, 63]
    errors = changes(seen, snap, device="2")
    assert all(e.fatal for e in errors[:-1]) and not errors[-1].fatal  # SBE last, corrected
    assert health.poll().xid_events == snap.xid_events                # events are kept
    health.close()
    assert nvml.shutdowns == 1


def test_remapped_rows_stand_in_for_retired_pages_on_newer_gpus(nvml):
    nvml.pages = False
    health = DeviceHealth(device="0")
    nvml.rows = (2, 1, 0, 0)   # correctable, uncorrectable, pending, failure
    snap = health.poll()
    assert (snap.retired_pages_sbe, snap.retired_pages_dbe) == (2, 1)
    assert "retired pages" in health.unsupported


def test_the_rank_device_is_mapped_through_cuda_visible_devices(nvml):
    env = {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}
    health = DeviceHealth.for_this_rank(env)
    assert nvml.handles == ["GPU-bbb"] and health.label == "1"
    DeviceHealth.for_this_rank({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "3,5"})
    assert nvml.handles[-1] == "index:3"


# -- one sample through one interface ------------------------------------------------------------
def test_a_sample_over_nvml_has_memory_utilisation_clocks_and_health(tmp_path, nvml):
    nvml.dbe, nvml.pending_xids = 1, [48]
    with telemetry.Telemetry.for_this_rank(harness_env(tmp_path, rank=0)) as t:
        s = t.sample()
    assert s.source == "nvml" and s.device == "0" and s.note == ""
    assert (s.memory_used, s.memory_total, s.headroom) == (30 * 2**30, 80 * 2**30, 50 * 2**30)
    assert s.utilization == 87 and s.clocks == {"sm": 1980, "memory": 2619, "graphics": 1755}
    assert s.health.ecc_dbe_volatile == 1 and s.health.xid_events == (48,)
    assert s.memory_peak and s.cpu_time is not None
    assert json.loads(json.dumps(s.as_event()))["xids"] == [48]


def test_a_query_the_gpu_refuses_reads_none_and_says_so(nvml):
    nvml.busy = None
    s = telemetry.sample("0")
    assert s.source == "nvml" and s.utilization is None and s.memory_used == 30 * 2**30
    assert "utilization: Not Supported" in s.note


def test_without_a_gpu_the_same_interface_reads_this_process(no_nvml):
    """The CPU fallback is real: RSS grows by what this process touches."""
    before = telemetry.sample()
    ballast = bytearray(64 * 2**20)
    ballast[::4096] = b"\x01" * len(range(0, len(ballast), 4096))
    after = telemetry.sample()
    assert after.source == "cpu" and "pynvml is not installed" in after.note
    assert after.memory_used - before.memory_used >= 60 * 2**20
    assert after.memory_peak >= after.memory_used and after.memory_total > after.memory_used
    assert after.cpu_time > 0 and after.utilization is None and after.clocks == {}
    assert after.headroom == after.memory_total - after.memory_used
    del ballast


def test_fragmentation_is_one_minus_largest_free_block_over_total_free():
    mb = 2**20
    segments = [
        {"device": 0, "total_size": 64 * mb, "blocks": [
            {"size": 20 * mb, "state": "active_allocated"}, {"size": 20 * mb, "state": "inactive"},
            {"size": 24 * mb, "state": "active_allocated"}]},
        {"device": 0, "total_size": 32 * mb, "blocks": [
            {"size": 10 * mb, "state": "inactive"}, {"size": 12 * mb, "state": "active_pending_free"},
            {"size": 10 * mb, "state": "inactive"}]},
    ]
    f = telemetry.fragmentation_of(segments)
    assert f["fragmentation"] == 0.5 and f["largest_free"] == 20 * mb and f["total_free"] == 40 * mb
    assert f["reserved"] == 96 * mb and f["free_blocks"] == 3
    assert telemetry.fragmentation_of([])["fragmentation"] == 0.0   # nothing free: nothing split


def test_on_cpu_there_is_no_allocator_to_read(tmp_path):
    import torch  # noqa: F401  (imported, yet no CUDA in use)

    run = fake_run(tmp_path)
    run.note = lambda *a, **k: pytest.fail("nothing may be recorded on CPU")
    assert telemetry.allocator_fragmentation() is None
    assert telemetry.record_allocator(run, step=3) is None
