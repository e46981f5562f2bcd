"""End to end with a user's own script (tests/workloads/toy_train.py): real processes, gloo."""

import pytest

from pytest_reshard import chaos
from pytest_reshard import procfs as processes
from pytest_reshard.result import ReshardAssertionError

from ..conftest import ports_of

pytestmark = pytest.mark.reshard(world_size=4, steps=16, timeout=90)


def test_user_script_survives_planned_reshard(reshard_run, toy):
    result = reshard_run(toy, faults=[chaos.shift_shards(to_world_size=3, at_step=6, notice_s=10)])
    result.assert_ok()
    assert [g.world_size for g in result.history.generations.values()] == [4, 3]
    assert not any(processes.listening(p) for p in ports_of(result.run_dir))


def test_restart_from_zero_fails_no_rewind(reshard_run, toy):
    result = reshard_run(toy, args=["--restart-from-zero"],
                         faults=[chaos.shift_shards(to_world_size=3, at_step=6, notice_s=10)])
    with pytest.raises(ReshardAssertionError, match=r"no_rewind FAIL.*0\.\.6") as e:
        result.assert_no_rewind()
    assert "replay:" in str(e.value)


def test_dropped_optimizer_state_fails_state_equivalence(reshard_run, toy):
    result = reshard_run(toy, args=["--drop-optimizer-state"],
                         faults=[chaos.shift_shards(to_world_size=3, at_step=6, notice_s=10)])
    with pytest.raises(ReshardAssertionError, match="state_equivalence FAIL.*optimizer"):
        result.assert_state_equivalent()
    result.assert_no_rewind()


def test_killed_rank_detected_fast_and_named(reshard_run, toy):
    result = reshard_run(toy, faults=[chaos.kill(rank=2, at_step=7, phase="backward")])
    result.assert_ok()
    died = [d for d in result.history.detections() if d.kind == "died"]
    assert [(d.rank, d.step, d.phase, d.expected) for d in died] == [(2, 7, "backward", True)]
    assert died[0].latency_s < 2.0  # measured 0.02-0.09 s (CI), 0.11 s at load 4.5


def test_stopped_rank_detected_within_two_seconds(reshard_run, toy):
    result = reshard_run(toy, faults=[chaos.hang(rank=1, at_step=5, phase="forward")])
    stopped = [d for d in result.history.detections() if d.kind == "stopped"]
    assert [(d.rank, d.step, d.phase) for d in stopped] == [(1, 5, "forward")]
    assert stopped[0].latency_s < 2.0  # measured 0.17 s (CI), 0.13 s at load 4.5
    result.assert_live()


def test_unplanned_silent_hang_fails_liveness(reshard_run, toy):
    """A SIGSTOP nobody scheduled as a recoverable hang still ends the run, named and bounded."""
    result = reshard_run(toy, faults=[chaos.hang(rank=1, at_step=5, phase="forward")],
                         max_generations=1)
    with pytest.raises(ReshardAssertionError, match="liveness FAIL"):
        result.assert_live()


# Nightly: cold interpreters (30 s each on 2 cores); every PR runs torchrun in test_endings and the
# reshard path on the fork launcher here.
@pytest.mark.nightly
@pytest.mark.parametrize("launcher", ["local", "torchrun"])
def test_other_launchers_run_the_same_scenario(reshard_run, toy, launcher):
    # timeout: cold ranks (4 + 2 interpreters importing torch) ran 18.8-28.4 s (CI), 26.9 s at
    # load 6.4, 43.4 s at load 4.5 with others' bursts (to 10): the module's 90 s is 2x; 180 is 4x
    result = reshard_run(toy, launcher=launcher, steps=10, timeout=180,
                         faults=[chaos.shift_shards(to_world_size=2, at_step=4, notice_s=20)])
    result.assert_ok()
    assert [g.world_size for g in result.history.generations.values()] == [4, 2]


def test_scenario_timeout_ends_every_process(reshard_run, toy):
    """A hang nobody detects (a rank blocked with its heartbeat alive, and a huge stall_s) is
    still ended by the scenario timeout. (A SIGSTOPped rank is named from /proc at once.)"""
    # timeout: the run must reach the hang first: it fired 0.15-0.23 s in (warm fork server, CI,
    # load 4.5), so 12 s is 50x (the server's own warm-up, 4-10 s at load 7, is off the clock:
    # Session.execute warms it first)
    result = reshard_run(toy, timeout=12, hang_s=1000, stall_s=1000,
                         faults=[chaos.hang(rank=0, at_step=3, phase="forward", mode="block")])
    assert [f.kind for f in result.history.faults_fired()] == ["hang"]
    with pytest.raises(ReshardAssertionError, match="liveness FAIL.*timeout"):
        result.assert_live()
    assert not any(processes.listening(p) for p in ports_of(result.run_dir))


def test_planned_reshard_at_the_last_step_completes_the_run(reshard_run, toy):
    """Found by the property tests: a notice on the last step leaves nothing to resume."""
    result = reshard_run(toy, steps=8, faults=[chaos.shift_shards(to_world_size=2, at_step=7)])
    result.assert_ok()
    assert [g.cause for g in result.history.generations.values()] == ["complete"]


def test_a_workload_that_cannot_run_clean_gets_no_fake_comparison(reshard_run, tmp_path):
    script = tmp_path / "broken_train.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "from pytest_reshard import probe\n"
        "run = probe.attach()\n"
        "dist.init_process_group('gloo')\n"
        "run.resumed(step=0)\n"
        "for step in range(4):\n"
        "    with run.step(step) as s:\n"
        "        s.record(loss=1.0, samples=[step * 2 + dist.get_rank()])\n"
        "        if step == 2:\n"
        "            raise RuntimeError('a bug in the training loop')\n")
    result = reshard_run(str(script), world_size=2, steps=4)
    assert result.verdicts["liveness"].status == "fail"
    loss = result.verdicts["loss_continuity"]
    assert loss.status == "unknown" and "clean reference run" in loss.message


def test_the_fork_servers_warm_up_is_not_charged_to_the_first_scenario(tmp_path, monkeypatch, toy):
    """A workload whose preload takes 6 s to import (a heavy framework on a loaded machine), run
    first in a session: the server warms before the scenario's clock starts (its first event),
    so its timeout and startup bound are the ranks' own (they were charged with the import,
    and a first scenario with a 4 s timeout failed at load 6.4)."""
    import os
    import time

    from pytest_reshard.contract import Ev
    from pytest_reshard.session import Session, scenario_from
    from pytest_reshard.workloads import WorkloadSpec, register, unregister

    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(6)  # a slow import\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path),
                                                                   os.environ.get("PYTHONPATH")])))
    register(WorkloadSpec(name="toy_slow_preload", script=toy, preload=("slow_to_import",)))
    try:
        with Session(tmp_path / "art") as session:
            asked = time.time()
            history = session.execute(scenario_from("toy_slow_preload", world_size=2, steps=3,
                                                    timeout_s=120), tmp_path / "art" / "first")
    finally:
        unregister("toy_slow_preload")
    [scenario] = [e for e in history.events if e["ev"] == Ev.SCENARIO]
    assert scenario["t"] - asked >= 6, "the scenario's clock started before the server was warm"
    assert history.generations[0].cause == "complete", history.generations[0]
