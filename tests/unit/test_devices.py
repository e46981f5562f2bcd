"""The device classes' caps: speeds against one reference in every generation, and the CPUs
recorded are the ones the kernel enforces."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_reshard.contract import OWN_GPUS
from pytest_reshard.schedule import kinds
from pytest_reshard.session import scenario_from
from pytest_reshard.supervisor.devices import (PERIOD_US, QUOTA_MIN_US, REFERENCE, Throttle,
                                              class_of, gpu_classes)


def _in(folder: Path, cpus: int) -> Throttle:
    """A cgroup-mode throttle whose groups are plain folders under ``folder`` (v2 layout)."""
    t = Throttle("unit", "stretch")
    t.root, t.v1, t.mode, t.why, t.cpus = folder, False, "cgroup", "", cpus
    return t


def test_a_generation_that_lost_the_fastest_class_stays_as_slow_as_its_class():
    """H100 + A100, then three L40S: relative to each generation's fastest, the L40S ranks ran
    at full speed (1.0); against the one reference they run at 0.37 of it."""
    t = Throttle("unit", "stretch")
    assert REFERENCE == 1.0
    assert t.plan(0, ["h100", "a100"])["speeds"] == [1.0, 0.32]
    assert t.plan(1, ["l40s"] * 3)["speeds"] == [0.37] * 3
    assert t.plan(2, ["a100", "l40s"])["speeds"] == [0.32, 0.37]


def test_the_cpus_recorded_are_the_quotas_written(tmp_path):
    t = _in(tmp_path, cpus=2)
    entry = t.plan(0, ["h100", "a100"])   # 0.5 CPU each at full speed
    assert entry["cpus"] == [0.5, 0.16] and entry["why"] == ""
    written = [Path(g, "cpu.max").read_text() for g in entry["cgroups"]]
    assert written == ["5000 10000", "1600 10000"]


def test_a_cap_under_the_kernels_floor_is_recorded_as_raised_to_it(tmp_path):
    """Four A100-class ranks on 2 CPUs want 0.08 CPUs each; the kernel takes no less than
    1000 us per 10 ms period, so each gets 0.1, and the history says so."""
    t = _in(tmp_path, cpus=2)
    entry = t.plan(0, ["h100", "a100", "a100", "a100"])
    assert entry["cpus"] == [0.25, QUOTA_MIN_US / PERIOD_US, 0.1, 0.1]
    assert [Path(g, "cpu.max").read_text() for g in entry["cgroups"]] == \
        ["2500 10000"] + ["1000 10000"] * 3
    assert entry["why"].startswith("ranks 1, 2, 3 capped at the kernel's smallest quota (0.1 CPUs)")


def test_the_kernel_enforces_the_quota_recorded():
    """Under real cgroups (root): the quota read back from the kernel is the one recorded."""
    try:
        t = Throttle("unit-kernel", "cgroup")
    except RuntimeError as e:
        pytest.skip(str(e))
    try:
        entry = t.plan(0, ["h100"] + ["a100"] * 7)
        for group, cpus in zip(entry["cgroups"], entry["cpus"]):
            if t.v1:
                quota = int(Path(group, "cpu.cfs_quota_us").read_text())
                period = int(Path(group, "cpu.cfs_period_us").read_text())
            else:
                quota, period = map(int, Path(group, "cpu.max").read_text().split())
            assert quota / period == cpus, (group, quota, period, cpus)
        # the run weighs its 8 ranks, not one process, against the machine's other processes
        name, weight = ("cpu.shares", 8 * 1024) if t.v1 else ("cpu.weight", 800)
        assert int(Path(entry["cgroups"][0]).parent.joinpath(name).read_text()) == weight
    finally:
        t.close()


# -- devices="gpu": the classes of the ranks' own GPUs -------------------------------------------
SMI = """#!/bin/sh
echo "0, GPU-aaaa, NVIDIA H100 80GB HBM3"
echo "1, GPU-bbbb, NVIDIA A100-SXM4-80GB"
echo "2, GPU-cccc, NVIDIA L4"
"""


@pytest.fixture
def three_gpus(tmp_path, monkeypatch):
    """A machine whose nvidia-smi lists an H100, an A100 and an L4 (a class we do not know)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_gpu_names_map_to_their_classes_and_an_unknown_one_is_named():
    assert [class_of(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S",
                                  "NVIDIA H200")] == ["h100", "a100", "l40s", "h200"]
    with pytest.raises(ValueError, match="'NVIDIA L4' is of no known class"):
        class_of("NVIDIA L4")


def test_each_rank_takes_the_class_of_the_visible_gpu_it_computes_on(three_gpus):
    assert gpu_classes(1, {})[0] == ["h100"]   # no CUDA_VISIBLE_DEVICES: the machine's GPUs
    classes, why = gpu_classes(3, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb,0"})
    assert classes == ["a100", "h100", "a100"]   # rank 2 wraps around to the first visible GPU
    assert why == ("each rank's own GPU: rank 0 NVIDIA A100-SXM4-80GB, rank 1 NVIDIA H100 80GB "
                   "HBM3, rank 2 NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError, match="'NVIDIA L4' is of no known class"):
        gpu_classes(1, {"CUDA_VISIBLE_DEVICES": "2"})
    with pytest.raises(ValueError, match="lists no GPU 7 of CUDA_VISIBLE_DEVICES"):
        gpu_classes(1, {"CUDA_VISIBLE_DEVICES": "7"})


def test_devices_gpu_without_a_gpu_or_on_gloo_is_an_error_that_says_what_to_do():
    with pytest.raises(ValueError, match=r"CUDA_VISIBLE_DEVICES='' shows none.*devices=\[\.\.\.\]"):
        gpu_classes(2, {"CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(ValueError, match="the backend is 'gloo'.*--reshard-backend=nccl"):
        scenario_from("lm", world_size=2, steps=4, devices="gpu", backend="gloo")
    with pytest.raises(ValueError, match="pass devices='gpu' instead of naming them"):
        scenario_from("lm", world_size=2, steps=4, devices=["h100", "a100"], throttle="gpu")


def test_the_own_gpus_mode_caps_nothing_and_records_the_gpus(three_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    entry = Throttle("t", OWN_GPUS).plan(0, ["h100", "h100"])   # the classes are read, not given
    assert entry == {"classes": ["h100", "a100"], "speeds": [1.0, 0.32], "mode": OWN_GPUS,
                     "why": "each rank's own GPU: rank 0 NVIDIA H100 80GB HBM3, rank 1 NVIDIA "
                            "A100-SXM4-80GB"}


def test_a_change_of_the_mix_is_refused_on_the_ranks_own_gpus():
    requires = kinds.get("change_devices").requires
    assert requires is not None and requires({"devices": ["h100"], "throttle": "cgroup"}) is None
    assert "a GPU keeps its class" in (requires({"devices": ["h100"], "throttle": OWN_GPUS}) or "")
