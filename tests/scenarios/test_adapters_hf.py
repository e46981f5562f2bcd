"""The Hugging Face Trainer under chaos through ``hf.instrument`` (tests/workloads/hf_train.py:
a tiny GPT-2 from its config, synthetic data, 2 or 4 gloo ranks on CPU).

The first three reproduce real Trainer resume bugs (transformers 5.24.0) and assert that the
harness names them; the rest are the configurations that are correct and must pass every checker.
"""
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from pytest_reshard import chaos  # noqa: E402
from pytest_reshard.adapters import hf  # noqa: E402

from ..doc_examples import write  # noqa: E402

SCRIPT = Path(__file__).parent.parent / "workloads" / "hf_train.py"
hf.workload("hf_train", SCRIPT, preload=("transformers.models.gpt2.modeling_gpt2",))

# save_steps 3 (the script's default): steps 2, 5 and 7 save; max_rewind_steps is 3.
pytestmark = pytest.mark.reshard(world_size=2, steps=8, timeout=180)
DROPOUT = ["--dropout", "0.1"]


def _failed(result, check):
    v = result.verdicts[check]
    assert v.status == "fail", f"{check} should fail: {v.status}: {v.message}"
    return v.message


def test_a_rank_killed_inside_a_save_resumes_with_an_unrestored_rng(reshard_run):
    """Rank 1 dies inside the step-5 save, after the save's one collective (store_flos): rank 0
    goes on and writes everything but ``rng_state_1.pth``. ``get_last_checkpoint`` takes that
    folder, and rank 1's ``_load_rng_state`` finds no file, logs at INFO level and goes on with
    the RNG it was seeded with: its dropout masks are not the ones the saved run would draw."""
    result = reshard_run("hf_train", args=DROPOUT,
                         faults=[chaos.kill_during_save(at_step=5, boundary="start", rank=1)])
    message = _failed(result, "state_equivalence")
    assert "rng" in message and "rank 1" in message and "step 5" in message, message
    saved = {(c.gen, c.rank) for c in result.history.checkpoints("save") if c.step == 5}
    assert saved == {(0, 0)}, saved   # rank 1 never finished its part of the save
    folder = Path(result.run_dir) / "work" / "checkpoint-6"
    assert (folder / "rng_state_0.pth").exists() and not (folder / "rng_state_1.pth").exists()


def test_a_rank_killed_after_writing_its_rng_file_is_judged_by_what_it_wrote(reshard_run):
    """Rank 1 dies at the step-5 save's commit point: ``rng_state_1.pth`` is written, the save
    never recorded as done on rank 1. Its ``saving`` record holds what the file holds, so the
    resume's restore is compared with it and passes (it was ``unknown``; once a false alarm)."""
    result = reshard_run("hf_train", args=DROPOUT,
                         faults=[chaos.kill_during_save(at_step=5, boundary="commit", rank=1)])
    verdict = result.verdicts["state_equivalence"]
    assert verdict.status == "pass", verdict
    loaded = {c.step for c in result.history.checkpoints("load")}
    saving = {(c.gen, c.rank) for c in result.history.checkpoints("saving") if c.step == 5}
    assert loaded == {5} and (0, 1) in saving, (loaded, saving)


def test_a_script_that_never_resumes_is_told_how_to_in_the_trainers_terms(reshard_run):
    """The official run_clm.py resumes only when asked (``--resume_from_checkpoint``), and a
    user's dataset may have no sample-id column: the verdicts say what to change in the script,
    not which probe call to make."""
    result = reshard_run("hf_train", args=["--no-resume", "--no-sample-ids"],
                         faults=[chaos.preempt(at_step=4, phase="forward")])
    message = _failed(result, "no_rewind")
    assert message.endswith("pass trainer.train(resume_from_checkpoint=get_last_checkpoint("
                            "trainer.args.output_dir))"), message
    samples = result.verdicts["exactly_once_samples"]
    assert samples.status == "unknown" and "have no 'sample_id' column" in samples.message, samples


def test_a_shift_to_one_process_looks_only_for_rng_state_pth(reshard_run):
    """2 -> 1: the checkpoint holds ``rng_state_0.pth`` and ``rng_state_1.pth``; a single
    process looks for ``rng_state.pth`` alone, does not find it, and keeps its seeded RNG."""
    result = reshard_run("hf_train", args=DROPOUT,
                         faults=[chaos.shift_shards(to_world_size=1, at_step=3)])
    message = _failed(result, "state_equivalence")
    assert "rng" in message and "rank 0" in message and "world size 2 -> 1" in message, message
    result.assert_no_rewind()


@pytest.mark.reshard(world_size=4, steps=8, timeout=180)
def test_a_fixed_per_device_batch_replays_samples_after_a_shift(reshard_run):
    """4 -> 2 with ``per_device_train_batch_size`` fixed: the checkpoint says global step 4; the
    Trainer fast-forwards 4 batches of the *new* global size (2 x 2), so the ranks retrain
    samples 16..31 of the shuffled order, which the 4 ranks had already consumed."""
    result = reshard_run("hf_train", args=["--per-device-batch", "2"],
                         faults=[chaos.shift_shards(to_world_size=2, at_step=3)])
    message = _failed(result, "exactly_once_samples")
    assert "consumed twice" in message and "generation 1" in message, message
    assert "data" in result.verdicts["state_equivalence"].message, \
        result.verdicts["state_equivalence"].message


@pytest.mark.reshard(world_size=4, steps=8, timeout=180)
def test_a_constant_global_batch_survives_a_shift(reshard_run):
    """4 -> 2 with the global batch held at 8 (per-device 2, then 4): every checker passes."""
    result = reshard_run("hf_train", faults=[chaos.shift_shards(to_world_size=2, at_step=3)])
    result.assert_ok()
    assert [g.world_size for _, g in sorted(result.history.generations.items())] == [4, 2]


def test_a_kill_between_saves_costs_at_most_the_save_interval(reshard_run):
    result = reshard_run("hf_train", faults=[chaos.kill(rank=1, at_step=4, phase="backward")])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 3   # checkpoint-3, saved after step 2


def test_a_preemption_saves_and_stops_at_once(reshard_run):
    result = reshard_run("hf_train", faults=[chaos.preempt(at_step=4, phase="forward")])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 5   # saved after step 4: nothing lost


def test_a_crash_inside_the_trainers_save_leaves_a_checkpoint_it_cannot_resume_from(reshard_run,
                                                                                     tmp_path):
    """Any crash inside ``_save_checkpoint`` leaves ``checkpoint-6/`` half written, and
    ``get_last_checkpoint`` takes the newest folder whether or not it is complete (no fallback to
    ``checkpoint-3``: transformers#35525): the job cannot start again. Here rank 0 is killed half
    way through the temporary that safetensors renames to ``model.safetensors``; the sweep of the
    whole save fails at each of its crash points."""
    from pytest_reshard.session import scenario_from
    from pytest_reshard.sweep import record

    points = record(scenario_from("hf_train", world_size=2, steps=8), tmp_path / "record")
    torn = next(p for p in points if p.mode == "torn" and p.path.startswith("checkpoint-6/.tmp"))
    result = reshard_run("hf_train", faults=[torn.fault()])
    message = _failed(result, "crash_consistency")
    assert "could not start again after generation 0 left the checkpoint of step 5 incomplete" \
        in message and f"`write {torn.path}`" in message and "`checkpoint-6/` (6 files) missing" \
        in message, message


@pytest.fixture(scope="module")
def readme_example(tmp_path_factory):
    """The frameworks guide's Trainer example, unchanged, as workload ``readme_hf``."""
    hf.workload("readme_hf", write("Hugging Face Trainer", tmp_path_factory.mktemp("readme"),
                                   "readme_hf.py"),
                preload=("transformers.models.gpt2.modeling_gpt2",))
    return "readme_hf"


def test_the_readme_example_saves_into_the_work_folder_and_resumes_from_it(
        reshard_run, readme_example, tmp_path, monkeypatch):
    """The guide's script says ``output_dir="hf-out"`` and nothing about the harness: under it
    ``hf.instrument`` moves output_dir to the run's work folder (and logs it), so a preemption
    after step 4 resumes at step 5 from there, and nothing is written to ``hf-out`` (the ranks'
    working directory here), which the clean reference run would share."""
    monkeypatch.chdir(tmp_path)
    result = reshard_run(readme_example, faults=[chaos.preempt(at_step=4, phase="forward")])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 5
    assert (Path(result.run_dir) / "work" / "checkpoint-5").is_dir()
    # the Trainer makes the folder it was given at its construction, and nothing goes into it
    assert not list((tmp_path / "hf-out").glob("*")), list((tmp_path / "hf-out").glob("*"))
    log = (Path(result.run_dir) / "logs" / "g0-r0.log").read_text()
    assert "output_dir is the run's work folder" in log, log[-2000:]
