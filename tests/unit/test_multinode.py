"""Several nodes on one machine: torchrun elastic agents, network namespaces, node loss.

The LM scenario runs two real torchrun agents (c10d rendezvous, ``--nnodes=1:2``), each a node in
its own network namespace with its own address when this machine allows it (root + iproute2),
else both on loopback with a note. Killing one node must scale the world down through torch's
own rendezvous, and the LM must reshard on load and pass every checker.
"""
from __future__ import annotations

import os

import pytest

from pytest_reshard import chaos
from pytest_reshard.supervisor.launch import netns
from pytest_reshard.probe import generation_of
from pytest_reshard.session import scenario_from


# -- pure parts -------------------------------------------------------------------------------
def test_elastic_ranks_count_generations_from_torchs_restarts():
    env = {"RESHARD_GENERATION": "3", "TORCHELASTIC_RESTART_COUNT": "2"}
    assert generation_of(env) == 3  # not elastic: the launcher's generation alone
    assert generation_of({**env, "RESHARD_ELASTIC": "1"}) == 5


@pytest.mark.parametrize("options,match", [
    ({"launcher": "fork"}, "kill_node needs launcher='elastic'"),
    ({"launcher": "elastic", "nodes": 1}, "nodes >= 2"),
    ({"launcher": "elastic", "nodes": 3}, "must split evenly"),
])
def test_impossible_multinode_scenarios_are_rejected_before_anything_starts(options, match):
    with pytest.raises(ValueError, match=match):
        scenario_from("lm", world_size=4, steps=6, faults=[chaos.kill_node(rank=2, at_step=2)],
                      **options)


class _Nodes:
    """A user's launcher that spans nodes and can restart a replica group (its facts only)."""

    name = "nodes"
    multi_node = True
    restarts_groups = True


def test_a_registered_launcher_is_judged_by_its_declared_facts(monkeypatch):
    from pytest_reshard.supervisor import launch
    from pytest_reshard.supervisor.policies.membership import check_scenario

    monkeypatch.setattr(launch, "_LAUNCHERS", dict(launch._LAUNCHERS))
    launch.register("nodes", f"{__name__}:_Nodes")
    assert launch.facts("nodes")["multi_node"] and not launch.facts("nodes")["keeps_processes"]
    assert launch.facts("elastic")["multi_node"] and not launch.facts("fork")["multi_node"]
    scenario = scenario_from("lm", world_size=4, steps=6, launcher="nodes", nodes=2,
                             faults=[chaos.kill_node(rank=2, at_step=2)])
    assert scenario.launcher == "nodes"
    with pytest.raises(ValueError, match="must split evenly"):
        scenario_from("lm", world_size=4, steps=6, launcher="nodes", nodes=3)
    check_scenario(scenario_from("lm", world_size=4, steps=6, launcher="nodes", replica_groups=2))
    with pytest.raises(ValueError, match="replica_groups needs launcher='fork' or 'local'"):
        check_scenario(scenario_from("lm", world_size=4, steps=6, launcher="torchrun",
                                     replica_groups=2))


def test_without_namespaces_every_node_is_loopback_and_the_note_says_why(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    net = netns.create(3)
    assert (net.mode, net.hosts, net.head, net.ifname) == ("loopback", ["127.0.0.1"] * 3,
                                                           "127.0.0.1", "lo")
    assert "need root" in net.note
    with pytest.raises(RuntimeError, match="need root"):
        netns.create(2, mode="netns")


