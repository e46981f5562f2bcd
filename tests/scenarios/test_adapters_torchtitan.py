"""torchtitan 0.3.0's own Trainer under chaos through ``torchtitan.instrument``
(tests/workloads/titan_train.py: the llama3 debug model, FSDP2, its HF text dataloader over a
local file, its DCP CheckpointManager every 3 steps, 2 gloo ranks on CPU with the patches of
``pytest_reshard.adapters.torchtitan_cpu``).

The first test reproduces a real torchtitan resume bug (0.3.0) and asserts that the harness names
it; the rest are configurations that are correct and must pass every checker.
"""
import os
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed: see the frameworks guide's torchtitan "
                                         "section (pip install --no-deps torchtitan==0.3.0 and the "
                                         "`torchtitan` extra)")

from pytest_reshard import chaos  # noqa: E402
from pytest_reshard.adapters import torchtitan  # noqa: E402

SCRIPT = Path(__file__).parent.parent / "workloads" / "titan_train.py"
torchtitan.workload("titan_train", SCRIPT, preload=("pytest_reshard.adapters.torchtitan_cpu",))

# interval 3: steps 2 and 5 save (torchtitan's steps 3 and 6), and the last step 7 (its step 8).
pytestmark = pytest.mark.reshard(world_size=2, steps=8, timeout=240)


@pytest.fixture(autouse=True)
def _assets(tmp_path_factory):
    """The tokenizer and the text, written once for the session (the script writes them if the
    folder is empty)."""
    os.environ.setdefault("TITAN_ASSETS", str(tmp_path_factory.getbasetemp() / "titan-assets"))


def _failed(result, check):
    v = result.verdicts[check]
    assert v.status == "fail", f"{check} should fail: {v.status}: {v.message}"
    return v.message


def test_a_clean_run_passes_every_checker(reshard_run):
    result = reshard_run("titan_train")
    result.assert_ok()
    saves = sorted({c.step for c in result.history.checkpoints("save")})
    assert saves == [2, 5, 7], saves


def test_a_kill_between_saves_costs_at_most_the_save_interval(reshard_run):
    result = reshard_run("titan_train", faults=[chaos.kill(rank=1, at_step=4, phase="backward")])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 3   # step-3/, saved after step 2


def test_a_restart_after_the_final_save_finds_a_model_only_checkpoint(reshard_run):
    """torchtitan's default ``last_save_model_only=True``: the final step's ``step-8/`` holds
    the model alone, yet ``_find_load_step`` takes it as the newest checkpoint to resume, so a
    job restarted with the same command after that save (rank 1 dies right after it: a
    teardown that hangs, a node lost) fails to load it: "Missing key in checkpoint
    state_dict: dataloader.dp_rank_0"."""
    result = reshard_run("titan_train", faults=[chaos.kill(rank=1, at_step=7, phase="checkpoint_commit")])
    message = _failed(result, "liveness")
    assert "Missing key in checkpoint state_dict" in message, message


def test_a_preemption_of_one_rank_saves_and_stops_every_rank_at_once(reshard_run):
    """SIGTERM reaches rank 1 alone; the per-step all-reduce tells rank 0, both save step 4."""
    result = reshard_run("titan_train", faults=[chaos.preempt(at_step=4, phase="forward", rank=1)])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 5   # step-5/, saved after step 4


def test_a_rank_killed_entering_a_save_resumes_from_the_previous_one(reshard_run):
    """Rank 1 dies entering the step-5 save; rank 0's DCP save fails at its first collective.
    ``step-6/`` holds no ``.metadata``, so the loader skips it and resumes from ``step-3/``."""
    result = reshard_run("titan_train",
                         faults=[chaos.kill_during_save(at_step=5, boundary="start", rank=1)])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 3


@pytest.mark.nightly   # the CI budget: a death entering DCP's save (above) and the file sweeps stay
def test_a_crash_inside_dcps_save_before_its_metadata_resumes_from_the_previous_save(reshard_run,
                                                                                     tmp_path):
    """A point inside DCP's own save, reached by the file watcher (DCP's writer untouched):
    rank 0 is killed before its first file event on ``step-6/.metadata`` (DCP's commit), the
    shards written. Without ``.metadata`` the loader skips ``step-6/`` and resumes from
    ``step-3/``, and every checker passes."""
    from pytest_reshard.session import scenario_from
    from pytest_reshard.sweep import record

    points = record(scenario_from("titan_train", world_size=2, steps=8), tmp_path / "record",
                    save_step=5)
    commit = next(p for p in points if p.mode == "before" and ".metadata" in p.path)
    result = reshard_run("titan_train", faults=[commit.fault()])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 3, commit.describe()


def test_a_shift_to_one_rank_is_refused_by_the_dataloader(reshard_run):
    """2 -> 1: model and optimizer reshard through DCP, but the data loader's state is per data
    rank and ``ParallelAwareDataloader.load_state_dict`` asserts the same degree ("dataloader
    resharding is not supported yet"): the resumed job cannot start, and the harness says why."""
    result = reshard_run("titan_train", faults=[chaos.shift_shards(to_world_size=1, at_step=3)])
    message = _failed(result, "liveness")
    assert "dataloader resharding is not supported" in message, message
    result.assert_no_rewind()
