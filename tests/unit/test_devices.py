"""The device classes' caps: speeds against one reference in every generation, and the CPUs
recorded are the ones the kernel enforces."""
from __future__ import annotations

from pathlib import Path

import pytest

from pytest_reshard.supervisor.devices import PERIOD_US, QUOTA_MIN_US, REFERENCE, Throttle


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
