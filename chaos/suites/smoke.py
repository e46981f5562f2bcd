"""The smoke suite: both bundled workloads (tiny, CPU) through the core faults.

Run it with ``pytest-reshard smoke``. Each scenario must pass every default checker. For the LM:
planned reshards 4 -> 3 -> 2, a replicated kill that must lose nothing, and a spot preemption.
For the target + drafter pipeline: every scenario of the ``dflash`` suite (role-aware kills,
a silent drafter death, topology changes 2+2 <-> 3+1).
"""
import pytest

from pytest_reshard import chaos
from pytest_reshard.chaos.suites.dflash import SCENARIOS as DFLASH

pytestmark = pytest.mark.chaos

SCENARIOS = {
    "reshard-4-to-3": dict(world_size=4, faults=[
        chaos.shift_shards(to_world_size=3, at_step=4, phase="optimizer", notice_s=10)]),
    "reshard-3-to-2": dict(world_size=3, faults=[
        chaos.shift_shards(to_world_size=2, at_step=5, phase="backward", notice_s=10)]),
    "reshard-4-to-3-to-2": dict(world_size=4, faults=[
        chaos.shift_shards(to_world_size=3, at_step=3, phase="forward", notice_s=10),
        chaos.shift_shards(to_world_size=2, at_step=7, phase="optimizer", notice_s=10)]),
    "kill-replicated": dict(world_size=4, args=["--replicas", "2"], faults=[
        chaos.kill(rank=1, at_step=6, phase="backward")]),
    "preempt": dict(world_size=4, faults=[
        chaos.preempt(at_step=5, phase="forward", grace_s=10)]),
}


@pytest.mark.reshard(steps=12, timeout=120)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_lm_survives(reshard_run, name):
    result = reshard_run("lm", **SCENARIOS[name])
    result.assert_ok()


@pytest.mark.reshard(world_size=4, steps=12, timeout=120)
@pytest.mark.parametrize("name", list(DFLASH))
def test_dflash_survives(reshard_run, name):
    result = reshard_run("dflash", **DFLASH[name])
    result.assert_ok()
