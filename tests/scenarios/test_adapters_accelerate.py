"""A training loop of one's own on Accelerate 1.x through ``reshard.instrument``
(tests/workloads/accelerate_train.py: a tiny torch module, synthetic data, 2 gloo ranks on CPU,
``save_state`` every 3 steps, the global batch held at 8)."""
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

from pytest_reshard import chaos  # noqa: E402
from pytest_reshard.adapters import accelerate as reshard  # noqa: E402

from ..doc_examples import write  # noqa: E402

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


@pytest.fixture(scope="module")
def readme_example(tmp_path_factory):
    """The frameworks guide's Accelerate example, unchanged, as workload ``readme_accelerate``."""
    reshard.workload("readme_accelerate", write("Accelerate", tmp_path_factory.mktemp("readme"),
                                                "readme_accelerate.py"))
    return "readme_accelerate"


def test_the_readme_example_survives_a_shift_with_its_saves_in_the_work_folder(
        reshard_run, readme_example, tmp_path, monkeypatch):
    """The three lines of the frameworks guide (import, ``instrument``, ``for ... in run.steps``): a shift
    2 -> 1 after step 3 resumes at step 4 with every component, and the saves are in the run's
    work folder, not the script's ``output_dir`` (the ranks' working directory here)."""
    monkeypatch.chdir(tmp_path)
    result = reshard_run(readme_example, faults=[chaos.shift_shards(to_world_size=1, at_step=3)])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 4
    assert (Path(result.run_dir) / "work" / "step-3" / reshard.MARKER).exists()
    assert not (tmp_path / "accelerate-out").exists()
    assert "saves go to the run's work folder" in (Path(result.run_dir) / "logs" / "g0-r0.log").read_text()


def test_the_readme_example_resumes_from_the_last_complete_save_after_a_kill(reshard_run,
                                                                             readme_example):
    result = reshard_run(readme_example,
                         faults=[chaos.kill_during_save(at_step=5, boundary="start", rank=1)])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 3


def test_the_readme_example_resumes_inside_its_second_epoch(reshard_run, readme_example):
    """12 steps of an 8-batch loader: a shift 2 -> 1 after step 9 resumes at step 10, the second
    batch of epoch 1 (``set_epoch(1)``, two batches skipped); each sample once per epoch."""
    result = reshard_run(readme_example, steps=12,
                         faults=[chaos.shift_shards(to_world_size=1, at_step=9)])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 10
