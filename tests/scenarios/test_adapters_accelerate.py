"""A training loop of one's own on Accelerate 1.x through ``reshard.instrument``
(tests/workloads/accelerate_train.py: a tiny torch module, synthetic data, 2 gloo ranks on CPU,
``save_state`` every 3 steps, the global batch held at 8)."""
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

from pytest_reshard import chaos  # noqa: E402
from pytest_reshard.adapters import accelerate as reshard  # noqa: E402

SCRIPT = Path(__file__).parent.parent / "workloads" / "accelerate_train.py"
reshard.workload("accelerate_train", SCRIPT)

pytestmark = pytest.mark.reshard(world_size=2, steps=8, timeout=180)


def test_a_kill_inside_a_save_resumes_from_the_last_complete_one(reshard_run):
    """Rank 1 dies at the start of the step-5 save: the folder has no completion marker, so
    the resume takes step-2; every checker passes (the kill may cost up to 3 steps)."""
    result = reshard_run("accelerate_train",
                         faults=[chaos.kill_during_save(at_step=5, boundary="start", rank=1)])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 3


def test_a_shift_to_one_process_restores_every_component(reshard_run):
    result = reshard_run("accelerate_train", faults=[chaos.shift_shards(to_world_size=1, at_step=3)])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 4
