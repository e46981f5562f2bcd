"""The catalog suite: one scenario per injector against the bundled LM (tiny, CPU); every one
must pass every checker. Run it with ``pytest-reshard catalog``.

Budgets: the plain LM may lose up to its checkpoint interval (``--ckpt-every``, 5) on an
unplanned failure; with ``--replicas 2`` (HSDP, emergency snapshots) it must lose nothing.
"""
import pytest

from pytest_reshard import chaos
from pytest_reshard.supervisor.launch import netns

pytestmark = pytest.mark.chaos

REPLICATED = ["--replicas", "2"]
#: Two namespaced nodes (root); the LM's collectives time out after 5 s, well inside stall_s
NODES = dict(launcher="elastic", nodes=2, network="netns", args=["--pg-timeout-s", "5"])
SCENARIOS = {
    "shift_shards": dict(faults=[chaos.shift_shards(to_world_size=3, at_step=4)]),
    "rebalance": dict(faults=[chaos.rebalance(fraction=0.5, at_step=4)]),
    "drain": dict(faults=chaos.drain(world_size=4, fraction=0.5, waves=2, at_step=2, every=3)),
    "kill": dict(faults=[chaos.kill(rank=2, at_step=6, phase="backward")]),
    "kill-replicated": dict(args=REPLICATED, faults=[chaos.kill(rank=1, at_step=6, phase="forward")]),
    "power-loss": dict(faults=[chaos.power_loss(rank=0, at_step=9, event=1)]),
    "abort-comms": dict(faults=[chaos.abort_comms(rank=1, at_step=6, phase="backward")]),
    "bitflip": dict(faults=[chaos.bitflip(rank=1, at_step=6, phase="optimizer", bit=30)]),
    "partition": dict(NODES, faults=[chaos.partition(rank=2, at_step=6)]),
    "slow-link": dict(NODES, faults=[chaos.slow_link(rank=2, at_step=5, rate_mbit=16)]),
    "kill-during-save": dict(args=["--ckpt-every", "3"],
                             faults=[chaos.kill_during_save(rank=0, at_step=5, boundary="commit")]),
    "crash-silently": dict(args=REPLICATED,
                           faults=[chaos.crash_silently(rank=3, at_step=5, phase="backward")]),
    "preempt-all": dict(faults=[chaos.preempt(at_step=5, phase="forward")]),
    "preempt-one": dict(faults=[chaos.preempt(rank=2, at_step=5, phase="backward")]),
    "hang-sigstop": dict(faults=[chaos.hang(rank=1, at_step=6, phase="backward")]),
    # stall_s: the LM's longest silence of all ranks was 2.3 s under load (2 cores, load 10-18): 4x, rounded up
    "hang-block": dict(stall_s=10, faults=[chaos.hang(rank=2, at_step=6, mode="block")]),
    "ecc-telemetry": dict(faults=[chaos.ecc_error(rank=2, at_step=4, phase="forward")]),
    "ecc-compute-replicated": dict(args=REPLICATED, faults=[
        chaos.ecc_error(rank=1, at_step=4, phase="backward", layer="compute")]),
    "slow-rank": dict(faults=[chaos.slow_rank(rank=0, at_step=3, steps=3, delay_ms=100)]),
    "memory-pressure": dict(memory_budget_bytes=4 * 2**30,
                            faults=[chaos.memory_pressure(rank=1, at_step=3, bytes=200 * 2**20)]),
}


@pytest.mark.reshard(world_size=4, steps=10, timeout=180)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_lm_survives(reshard_run, name):
    survives(reshard_run, name)


def survives(reshard_run, name: str) -> None:
    """Entry ``name`` passes every checker; one that needs namespaced nodes skips without them."""
    why = netns.netns_unavailable() if SCENARIOS[name].get("network") == "netns" else None
    if why is not None:
        pytest.skip(f"{name} needs namespaced nodes: {why}")
    reshard_run("lm", **SCENARIOS[name]).assert_ok()
