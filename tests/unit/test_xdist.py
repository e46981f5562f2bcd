"""pytest-xdist: workers share one machine without collisions, and one summary comes back.

The pure parts (port ranges, GPU shares, shards) are unit-tested; one pytester run with ``-n 2``
proves the whole path: two real scenarios on two workers, disjoint port ranges and GPU sets,
artifacts per worker, one table and one Markdown summary on the controller."""
import socket

import pytest

from pytest_reshard import parallel as workers
from pytest_reshard.supervisor.launch import free_port



def test_port_ranges_are_disjoint_and_below_the_kernels_ephemeral_ports():
    for count in (1, 2, 3, 8, 24):
        ranges = [workers.port_range(i, count, low_ephemeral=32768) for i in range(count)]
        ports = [set(range(lo, hi)) for lo, hi in ranges]
        assert all(a.isdisjoint(b) for i, a in enumerate(ports) for b in ports[i + 1:])
        assert all(1024 <= lo < hi <= 32768 for lo, hi in ranges)
    with pytest.raises(RuntimeError, match="cannot each get a port range"):
        workers.port_range(0, 5000, low_ephemeral=32768)
    given = [workers.port_range(i, 3, pool=(40000, 40030)) for i in range(3)]
    assert given == [(40000, 40010), (40010, 40020), (40020, 40030)]  # a run's range is split


def test_free_port_stays_in_the_workers_range_and_skips_ports_in_use(monkeypatch):
    lo, _ = workers.port_range(7, 8, low_ephemeral=32768)  # not a port the kernel hands out
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", lo))
        busy.listen()
        monkeypatch.setenv("RESHARD_PORT_RANGE", f"{lo}-{lo + 2}")
        assert {free_port() for _ in range(4)} == {lo + 1}
    monkeypatch.setenv("RESHARD_PORT_RANGE", "20000")
    with pytest.raises(ValueError, match="expected LO-HI"):
        free_port()


def test_gpu_shares_are_disjoint_and_cover_the_inventory():
    gpus = [str(i) for i in range(8)]
    for count in (1, 2, 3, 8):
        shares = [workers.gpu_share(gpus, i, count) for i in range(count)]
        assert sorted(g for s in shares for g in s) == sorted(gpus)
        assert all(len(s) in (8 // count, -(-8 // count)) for s in shares)
    assert [workers.gpu_share(["0"], i, 2) for i in range(2)] == [[], ["0"]]


def test_inventory_honours_a_visible_device_list_and_says_where_it_came_from():
    assert workers.gpu_inventory({"CUDA_VISIBLE_DEVICES": "2,3,GPU-abc"}) == (
        ["2", "3", "GPU-abc"], "CUDA_VISIBLE_DEVICES")
    assert workers.gpu_inventory({"CUDA_VISIBLE_DEVICES": ""}) == ([], "CUDA_VISIBLE_DEVICES")
    gpus, source = workers.gpu_inventory({})
    assert (gpus is None and "no GPU inventory" in source) or source in ("NVML", "nvidia-smi")


def test_configure_claims_ports_and_gpus_in_the_environment():
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    layout = workers.configure("gw1", 2, env)
    assert (layout.gpus, layout.gpu_total, env["CUDA_VISIBLE_DEVICES"]) == (("2", "3"), 4, "2,3")
    assert env["RESHARD_PORT_RANGE"] == f"{layout.ports[0]}-{layout.ports[1]}"
    given = {"RESHARD_PORT_RANGE": "30000-30100", "CUDA_VISIBLE_DEVICES": ""}
    assert workers.configure("gw1", 2, given).ports == (30050, 30100)
    assert given["CUDA_VISIBLE_DEVICES"] == ""  # no GPU to share: every worker sees none
    cpu: dict[str, str] = {}
    if workers.gpu_inventory(cpu)[0] is None:  # a CPU machine: no GPU set, nothing hidden
        assert workers.configure("gw0", 2, cpu).gpus is None and "CUDA_VISIBLE_DEVICES" not in cpu


def test_shards_partition_the_suite_evenly():
    ids = [f"t.py::test_{i}" for i in range(11)]
    shards = [workers.shard(ids, f"{i}/3") for i in (1, 2, 3)]
    assert set().union(*shards) == set(ids) and sum(map(len, shards)) == 11
    assert sorted(map(len, shards)) == [3, 4, 4]
    for bad in ("0/3", "4/3", "1", "a/b"):
        with pytest.raises(ValueError, match="--reshard-shard"):
            workers.parse_shard(bad)


def test_shard_option_deselects_the_other_shards(pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.parametrize('i', range(5))\ndef test_x(i): pass")
    one = pytester.runpytest("--reshard-shard=1/2", "-q")
    two = pytester.runpytest("--reshard-shard=2/2", "-q")
    one.assert_outcomes(passed=3, deselected=2)
    two.assert_outcomes(passed=2, deselected=3)
    bad = pytester.runpytest("--reshard-shard=3/2")
    bad.stderr.fnmatch_lines(["*--reshard-shard='3/2': need 1 <= I <= N*"])
