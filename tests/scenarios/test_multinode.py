"""Several nodes on one machine: torchrun elastic agents, network namespaces, node loss.

The LM scenario runs two real torchrun agents (c10d rendezvous, ``--nnodes=1:2``), each a node in
its own network namespace with its own address when this machine allows it (root + iproute2),
else both on loopback with a note. Killing one node must scale the world down through torch's
own rendezvous, and the LM must reshard on load and pass every checker.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from pytest_reshard import chaos
from pytest_reshard.supervisor.launch import netns

NETNS_MISSING = netns.netns_unavailable()


# -- namespaces (root) ------------------------------------------------------------------------
def _links_and_namespaces() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout + \
        subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.skipif(NETNS_MISSING is not None, reason=str(NETNS_MISSING))
def test_nodes_are_separate_hosts_that_reach_each_other_and_vanish_on_close():
    net = netns.create(2, mode="netns")
    made = [*net.namespaces, *net._links]
    try:
        assert net.mode == "netns" and len(set(net.hosts)) == 2
        server = subprocess.Popen(
            [sys.executable, "-c", "import socket, sys\n"
             f"s = socket.create_server(({net.hosts[1]!r}, 0)); print(s.getsockname()[1], "
             "flush=True)\nc, peer = s.accept(); c.sendall(peer[0].encode())"],
            stdout=subprocess.PIPE, text=True, preexec_fn=net.preexec(1))
        port = int(server.stdout.readline())
        assert net.pids(1) == [server.pid]
        with pytest.raises(OSError), socket.socket() as s:  # not an address of this host
            s.bind((net.hosts[1], 0))
        client = subprocess.run(
            [sys.executable, "-c", "import socket\n"
             f"print(socket.create_connection(({net.hosts[1]!r}, {port}), timeout=10).recv(64)"
             ".decode())"], capture_output=True, text=True, timeout=30,
            preexec_fn=net.preexec(0))
        assert client.stdout.strip() == net.hosts[0]  # the server saw node 0's own address
        server.wait(timeout=10)
    finally:
        net.close()
    left = _links_and_namespaces()
    assert not any(name in left for name in made), left  # (a SLURM cluster's may be there)


@pytest.mark.skipif(NETNS_MISSING is not None, reason=str(NETNS_MISSING))
def test_a_creator_killed_before_close_leaves_nothing_for_long(tmp_path):
    """SIGKILL the process that made a network: its reaper removes it; and where the reaper was
    killed too, the next create() sweeps it away."""
    made = ("from pytest_reshard.supervisor.launch import netns; import os, signal; "
            "n = netns.create(1, mode='netns'); print(n.namespaces[0], flush=True); ")
    name = subprocess.run([sys.executable, "-c", made + "os._exit(0)"], capture_output=True,
                          text=True, timeout=60).stdout.strip()
    deadline = time.monotonic() + 30
    while name in _links_and_namespaces():
        assert time.monotonic() < deadline, f"the reaper did not remove {name} within 30 s"
        time.sleep(0.05)
    name = subprocess.run([sys.executable, "-c", made + "os.kill(n._reaper.pid, signal.SIGKILL); "
                           "n._reaper.wait(); os._exit(0)"], capture_output=True, text=True,
                          timeout=60).stdout.strip()
    assert name and name in _links_and_namespaces()
    assert name in netns.sweep_stale()
    assert name not in _links_and_namespaces()


# -- the LM under elastic agents, losing a node -------------------------------------------------
# nightly, for the CI budget: agents re-forming the world on the node left run in CI after a
# partition (test_network_faults.py)
@pytest.mark.nightly
@pytest.mark.reshard(world_size=4, steps=10, timeout=240)
@pytest.mark.parametrize("network", ["auto", "loopback"])
def test_losing_a_node_scales_down_through_torchs_rendezvous_and_the_lm_passes(reshard_run,
                                                                            network):
    """CI runs the namespaced nodes where it can (root), else loopback; the nightly run also
    runs loopback where namespaces exist."""
    result = reshard_run("lm", launcher="elastic", nodes=2, network=network,
                         faults=[chaos.kill_node(rank=2, at_step=6, phase="backward")])
    result.assert_ok()
    gens = result.history.generations
    assert [g.world_size for g in gens.values()] == [4, 2]
    # the survivors resharded the 4-rank checkpoint of step 4 on load (the LM saves every 5)
    loads = result.history.checkpoints("load")
    assert loads and {(c.gen, c.step) for c in loads} == {(1, 4)}
    events = [json.loads(line) for line in
              (result.run_dir / "events" / "supervisor.jsonl").read_text().splitlines()]
    nodes = [e for e in events if e["ev"] == "nodes"]
    assert len(nodes) == 1, "the agents were launched once; torch restarted the survivors"
    print(f"nodes: {nodes[0]['mode']} {nodes[0]['hosts']} rendezvous {nodes[0]['endpoint']}"
          + (f" ({nodes[0]['note']})" if nodes[0]["note"] else ""))
    if network == "auto" and NETNS_MISSING is None:
        assert nodes[0]["mode"] == "netns" and len(set(nodes[0]["hosts"])) == 2
    else:
        assert nodes[0]["mode"] == "loopback" and nodes[0]["note"]
    # The harness launched the agents once; generation 1's ranks are the survivors' restart
    # (their generation is torch's restart count), not a launch of ours.
    starts = [e for e in events if e["ev"] == "gen_start"]
    assert [e.get("by") for e in starts] == [None, "elastic agents"]
    assert {e["gen"] for e in result.history.events if e["ev"] == "start"} == {0, 1}
    left = _links_and_namespaces() if NETNS_MISSING is None else ""
    assert not any(n and n in left for n in nodes[0]["namespaces"])
