"""The target + drafter pipeline (speculative decoding: DFlash) under role-aware chaos, on CPU.

Run it with ``pytest-reshard dflash`` (the ``smoke`` suite runs it too). Each scenario must pass
every default checker, the sample ledger across the queue and the throughput check, with
2 targets + 2 drafters and with 3 + 1.
"""
import pytest

from pytest_reshard import chaos

pytestmark = pytest.mark.chaos

TWO_TWO = {"target": 2, "drafter": 2}
THREE_ONE = {"target": 3, "drafter": 1}
SCENARIOS = {
    # A drafter dies mid-backward; the survivors re-form a smaller drafter group and take its share.
    "drafter-killed-2+2": dict(roles=TWO_TWO, faults=[
        chaos.kill(role="drafter", at_step=5, phase="backward", then_world_size=3)]),
    # A pivot between target and drafter counts (in production, 5 + 3 -> 6 + 2), planned:
    # 2+2 -> 3+1 and back, with notice.
    "topology-2+2-3+1-2+2": dict(roles=TWO_TWO, faults=[
        chaos.shift_shards(roles=THREE_ONE, at_step=3, phase="optimizer"),
        chaos.shift_shards(roles=TWO_TWO, at_step=7, phase="forward")]),
    # A target dies while sending: the hidden states in flight are made again, exactly once.
    "target-killed-2+2": dict(roles=TWO_TWO, faults=[
        chaos.kill(role="target", at_step=5, phase="send")]),
    # A drafter vanishes with exit code 0 and no error, as two of three did during a production
    # run's ramp-up: detected in milliseconds, then recovered.
    "drafter-silent-2+2": dict(roles=TWO_TWO, faults=[
        chaos.crash_silently(role="drafter", at_step=4, phase="optimizer", then_world_size=3)]),
    "target-killed-3+1": dict(roles=THREE_ONE, faults=[
        chaos.kill(role="target", at_step=4, phase="forward")]),
    "preempted-3+1": dict(roles=THREE_ONE, faults=[
        chaos.preempt(at_step=5, phase="recv", grace_s=10)]),
    "topology-3+1-2+2": dict(roles=THREE_ONE, faults=[
        chaos.shift_shards(roles=TWO_TWO, at_step=5, phase="backward")]),
}


@pytest.mark.reshard(world_size=4, steps=12, timeout=120)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_dflash_survives(reshard_run, name):
    result = reshard_run("dflash", **SCENARIOS[name])
    result.assert_ok()
