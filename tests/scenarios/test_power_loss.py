"""``power_loss`` end to end: the machine loses power at a file event of a save, the work folder
comes back with only what was durable, and ``crash_consistency`` judges the resume.

``workloads/ckpt_train.py`` saves ``model.pt`` through a temporary file three ways: durable
(data fsynced, renamed, folder fsynced) passes; a rename before the data is synced, and a
folder never synced, each fail naming the file. The power goes as rank 0 opens the temporary of
the save after step 6, once the saves of steps 2 and 4 were recorded complete."""
import pytest

from pytest_reshard import chaos

SCRIPT = "../workloads/ckpt_train.py"


def run(reshard_run, mode):
    return reshard_run(SCRIPT, world_size=2, steps=8, args=["--save", mode],
                       faults=[chaos.power_loss(at_step=5, event=1, rank=0)])


def test_a_save_that_syncs_its_data_and_its_folder_survives_a_power_loss(reshard_run):
    result = run(reshard_run, "durable")
    result.assert_ok()
    loss = result.history.power_losses()
    assert len(loss) == 1 and not loss[0].removed and not loss[0].cut, loss   # all durable
    assert result.history.generations[1].resume_step == 4


@pytest.mark.parametrize("mode, expected", [
    ("rename_unsynced", ["the power loss took the save of step 3",
                         "`ckpt-train/model.pt`: never fsynced: left empty"]),
    ("dir_unsynced", ["the power loss took the save of step 3",
                      "`ckpt-train/model.pt` missing",
                      "renamed from `ckpt-train/model.pt.tmp`, but `ckpt-train/` was never "
                      "fsynced after it: the rename is undone"]),
])
def test_a_save_that_is_not_durable_loses_what_it_said_it_saved(reshard_run, mode, expected):
    v = run(reshard_run, mode).verdicts["crash_consistency"]
    assert v.status == "fail", v.message
    for words in expected:
        assert words in v.message, v.message
    assert "the power went as rank 0 was about to `open ckpt-train/model.pt.tmp`" in v.message


def test_a_power_loss_before_the_folder_sync_takes_back_only_the_save_in_flight(reshard_run):
    """The cut falls after the rename of the save after step 6, before its folder fsync: the
    rename is undone and `model.pt` is the save of step 4 again (kept when the rename replaced
    it), which the job resumes from; nothing it had recorded complete is lost."""
    result = reshard_run(SCRIPT, world_size=2, steps=8, args=["--save", "durable"],
                         faults=[chaos.power_loss(at_step=5, path="ckpt-train", op="fsync")])
    result.assert_ok()
    [loss] = result.history.power_losses()
    assert loss.renames_undone == (("ckpt-train/model.pt", "ckpt-train/model.pt.tmp"),), loss
    assert result.history.generations[1].resume_step == 4
