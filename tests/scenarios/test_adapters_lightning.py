"""Lightning 2.6 under chaos through ``ReshardCallback`` (tests/workloads/lightning_train.py: a
tiny torch module, synthetic data, ``strategy="ddp"`` on CPU with 2 gloo ranks, 4 batches per
epoch, 2 epochs, ``ModelCheckpoint(save_last=True)``, ``fit(ckpt_path="last")``).

The first three reproduce real Lightning resume bugs (lightning 2.6.6) and assert that the
harness names them; the last is the configuration that is correct and passes every checker.
"""
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from pytest_reshard import chaos  # noqa: E402
from pytest_reshard.adapters import lightning as reshard  # noqa: E402

from ..doc_examples import write  # noqa: E402

SCRIPT = Path(__file__).parent.parent / "workloads" / "lightning_train.py"
reshard.workload("lightning_train", SCRIPT)

pytestmark = pytest.mark.reshard(world_size=2, steps=8, timeout=180)


def _failed(result, check):
    v = result.verdicts[check]
    assert v.status == "fail", f"{check} should fail: {v.status}: {v.message}"
    return v.message


def test_a_mid_epoch_resume_with_a_plain_dataloader_restarts_the_epoch(reshard_run):
    """A checkpoint every 3 steps, a preemption at step 5 (batch 1 of epoch 1): the callback
    writes ``last-stop.ckpt`` after step 5 and every rank stops. Lightning restores the loop at
    batch 2 of epoch 1, but a ``DataLoader`` has no ``state_dict``: its iterator starts the
    epoch over (Lightning only warns), so steps 6 and 7 train on batches 0 and 1 again."""
    result = reshard_run("lightning_train", args=["--every-n-train-steps", "3"],
                         faults=[chaos.preempt(at_step=5, phase="forward")])
    samples = _failed(result, "exactly_once_samples")
    assert "consumed twice" in samples and "generation 1" in samples, samples
    loss = _failed(result, "loss_continuity")
    assert "resume point step 6" in loss, loss
    result.assert_no_rewind()           # the planned stop itself lost nothing


def test_an_epoch_boundary_resume_with_dropout_diverges_the_rng_is_not_saved(reshard_run):
    """A kill in epoch 1 resumes from the end-of-epoch-0 checkpoint. A ``.ckpt`` holds model,
    optimizer, schedulers and loops but no RNG state: with dropout the resumed ranks draw masks
    from the RNG ``seed_everything`` left, not from where the saved run was."""
    result = reshard_run("lightning_train", args=["--dropout", "0.2"],
                         faults=[chaos.kill(rank=1, at_step=5, phase="backward")])
    state = result.verdicts["state_equivalence"]
    assert "rng" in state.message and "generation 1" in state.message, state.message
    # the adapter takes the load digest at the restore (digest_at="restore"), so an RNG that
    # differs at the epoch's start is not excused as the data iterator's draw
    assert state.status == "fail", state.message
    loss = _failed(result, "loss_continuity")
    assert "resume point step 4" in loss, loss


def test_max_steps_resumes_an_end_of_epoch_checkpoint_into_the_finished_epoch(reshard_run):
    """With ``max_steps`` (iteration-based training) Lightning treats every resume as a
    restart inside the saved epoch, even from the checkpoint written at that epoch's end: it
    runs a fifth batch of epoch 0 from a restarted iterator (samples of batch 0 again), and
    epoch 1 comes one batch short. ``max_epochs`` resumes it correctly (the next test)."""
    result = reshard_run("lightning_train", args=["--max-steps"],
                         faults=[chaos.kill(rank=1, at_step=5, phase="backward")])
    samples = _failed(result, "exactly_once_samples")
    assert "(epoch 0) consumed twice" in samples and "step 4 (generation 1" in samples, samples


def test_an_epoch_boundary_resume_with_dropout_and_the_rng_saved_by_a_callback_passes(reshard_run):
    """The same kill, with the RNG states kept in the checkpoint by a callback. Lightning builds
    the data iterator, whose ``iter()`` draws from torch's generator, before ``on_train_start``:
    the adapter digests the RNG at ``on_fit_start``, after the callback restored it (taken at
    ``on_train_start`` it was a false alarm)."""
    result = reshard_run("lightning_train", args=["--dropout", "0.2", "--save-rng"],
                         faults=[chaos.kill(rank=1, at_step=5, phase="backward")])
    result.assert_ok()
    assert result.history.generations[1].resume_step == 4


def test_a_planned_stop_before_any_save_of_the_generation_resumes_from_the_callbacks_save(
        reshard_run):
    """The other path: a checkpoint every 3 steps and a shift after step 1, before the
    ModelCheckpoint saved anything in this generation: its ``on_train_end`` writes ``last.ckpt``
    (``save_last`` and nothing saved yet), after the callback's ``last-stop.ckpt``. The resume
    must still be the callback's save, at step 2 (the rest is Lightning's plain-DataLoader
    restart of the epoch, asserted by the first test)."""
    result = reshard_run("lightning_train", args=["--every-n-train-steps", "3"],
                         faults=[chaos.shift_shards(to_world_size=1, at_step=1)])
    loads = [c for c in result.history.checkpoints("load") if c.gen == 1]
    assert loads and all(c.step == 1 and str(c.info.get("path")).endswith("last-stop.ckpt")
                         for c in loads), loads
    assert result.history.generations[1].resume_step == 2
    result.assert_no_rewind()


@pytest.fixture(scope="module")
def readme_example(tmp_path_factory):
    """The frameworks guide's Lightning example, unchanged, as workload ``readme_lightning``."""
    reshard.workload("readme_lightning", write("Lightning", tmp_path_factory.mktemp("readme"),
                                               "readme_lightning.py"))
    return "readme_lightning"


def test_a_planned_stop_mid_epoch_resumes_from_the_callbacks_save(reshard_run, readme_example):
    """The guide's setup, ``ModelCheckpoint(save_last=True, every_n_epochs=1)``, and a shift at
    step 5 (batch 1 of epoch 1): the callback saves ``last-stop.ckpt`` and sets
    ``should_stop``; Lightning then ends the epoch, and the ModelCheckpoint writes ``last.ckpt``
    at ``on_train_epoch_end`` with the epoch counted as done. ``ckpt_path="last"`` takes the
    newest ``last*.ckpt``: without the fix, ``last.ckpt``, and the next generation finds
    ``max_epochs`` reached and trains nothing (steps 6 and 7 lost). The resume must be the
    callback's save, at step 6."""
    result = reshard_run(readme_example, faults=[chaos.shift_shards(to_world_size=1, at_step=5)])
    result.assert_liveness()
    result.assert_no_rewind()
    loads = [c for c in result.history.checkpoints("load") if c.gen == 1]
    assert loads and all(c.step == 5 and str(c.info.get("path")).endswith("last-stop.ckpt") for c in loads), loads
    assert result.history.generations[1].resume_step == 6
    # what is left is Lightning's own mid-epoch bug (a plain DataLoader restarts its epoch)
    assert "consumed twice" in _failed(result, "exactly_once_samples")


def test_a_checkpoint_folder_outside_the_work_folder_is_refused_saying_what_to_pass(
        reshard_run, tmp_path, monkeypatch):
    """``ModelCheckpoint(dirpath="lightning-out")`` under the harness would share its files with
    the clean reference run, and the callback cannot move it (``ckpt_path="last"`` is resolved
    before any callback hook): it refuses at ``setup``, naming ``reshard.output_dir``."""
    monkeypatch.chdir(tmp_path)
    result = reshard_run("lightning_train", args=["--ckpt-dir", "lightning-out"], steps=4,
                         faults=[chaos.kill(rank=1, at_step=2, phase="backward")])
    assert result.verdicts["liveness"].status == "fail"
    log = (Path(result.run_dir) / "logs" / "g0-r0.log").read_text()
    folder = tmp_path.resolve() / "lightning-out"    # ModelCheckpoint makes its dirpath absolute
    assert f"ModelCheckpoint saves to {folder}, outside this run's work folder" in log and \
        f"dirpath=reshard.output_dir('{folder}')" in log, log[-3000:]
