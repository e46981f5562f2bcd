"""Several machines on SLURM: the hub that carries a remote rank's history, and the slurm launcher
against a real cluster (Debian's slurmctld, two slurmd nodes in their own network namespaces).

The hub tests need no cluster: a real rank process reports over TCP to a hub on loopback, with a
run folder it cannot see. The cluster tests run the bundled LM on 2 nodes x 2 ranks.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from pytest_reshard.contract import HUB_PROTOCOL, RunDir, hub_hello, hub_line, read_jsonl
from pytest_reshard.supervisor.hub import Hub


def _until(done, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.01)


@pytest.fixture
def hub(tmp_path):
    run = RunDir(tmp_path / "run")
    run.events.mkdir(parents=True)
    run.plan(0).write_text(json.dumps({"seed": 1234, "world_size": 1, "roles": ["trainer"],
                                       "device_map": None, "faults": [], "files": False}))
    h = Hub(run, "127.0.0.1")
    yield h
    h.close()


def test_slurm_missing_is_a_clear_error_before_anything_starts(monkeypatch, tmp_path):
    from pytest_reshard.supervisor.launch.slurm import SlurmLauncher

    monkeypatch.setenv("PATH", str(tmp_path))  # no srun, no scontrol
    with pytest.raises(RuntimeError, match="needs a SLURM cluster: no SLURM client commands"):
        SlurmLauncher(2)


# -- the LM on a real cluster -----------------------------------------------------------------
def _squeue(*args: str) -> str:
    return subprocess.run(["squeue", "--noheader", *args], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def _node_processes() -> list[str]:
    """Every process in the nodes' namespaces but the slurmd daemons (name and pid)."""
    k = os.environ["RESHARD_SLURM_HEAD"].split(".")[2]
    out = []
    for i in range(1, len(os.environ["RESHARD_SLURM_NODES"].split()) + 1):
        pids = subprocess.run(["ip", "netns", "pids", f"reshard-slurm{k}-n{i}"],
                              capture_output=True, text=True, timeout=30).stdout.split()
        for pid in pids:
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if name != "slurmd":
                out.append(f"{name}[{pid}] on reshard-n{i}")
    return out


@pytest.fixture
def cluster(slurm_cluster):
    """After the test: no job or step of ours in squeue, no process left on any node, no node
    drained."""
    assert not _squeue(), f"the cluster is busy before the test: {_squeue()}"
    yield slurm_cluster
    deadline = time.monotonic() + 30
    while (_squeue() or _node_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _squeue(), f"jobs left: {_squeue()}"
    assert not _node_processes(), f"processes left on the nodes: {_node_processes()}"
    states = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True,
                            text=True, timeout=30).stdout.split()
    assert not [s for s in states if "drain" in s], f"a node was left drained: {states}"


SLURM = dict(launcher="slurm", nodes=2)


def test_a_node_whose_clock_is_off_has_its_event_times_moved_onto_the_harness_clock(hub):
    """A rank's clock 30 s behind: its hello says so, and its events land on the harness's
    clock (a correct rank's events then order with every other node's)."""
    import socket

    host, port = hub.address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        behind = time.time() - 30.0
        buf = hub_hello(s, {"hello": "rank", "protocol": HUB_PROTOCOL, "gen": 0, "rank": 0,
                            "pid": 1, "t": behind}, hub.secret, time.monotonic() + 30)
        assert json.loads(hub_line(s, buf, time.monotonic() + 30, "plan"))["seed"] == 1234
        s.sendall(json.dumps({"ev": "begin", "step": 0, "t": behind, "gen": 0,
                              "rank": 0}).encode() + b"\n\n")
    _until(lambda: (0, 0) in hub.ended, 30, "the hub saw the connection close")
    (_, event), = read_jsonl(hub.dir.rank_events(0, 0))[0]
    assert abs(event["t"] - time.time()) < 5 and abs(hub.offsets[(0, 0)] - 30.0) < 1


