"""The file-event sweeps of the bundled workloads' saves, at 4 ranks: a crash at every file event.

Run it with ``pytest-reshard files``. A clean run records every file event of the LM's second
save on rank 0 (the coordinator: it writes DCP's ``.metadata`` and commits the checkpoint with
one rename); then each event is a scenario of its own: the rank killed before it, or torn
half-way through a write, or a byte of a data file flipped after the save, or (the LM only) the
machine's power lost before it (``power_loss``: what was not durable is gone). Every crash and
power loss must pass every checker (the resume takes the newest complete checkpoint, and no save
recorded complete is lost); every flipped byte must be caught. The target + drafter pipeline's
``torch.save`` + rename, on the rank that writes it, likewise. The matrix is printed at the end
and kept in ``sweep.html``.
"""
import pytest

pytestmark = pytest.mark.chaos


@pytest.mark.reshard(workload="lm", world_size=4, steps=8, args=["--ckpt-every", "3"],
                     timeout=120)
@pytest.mark.reshard_sweep(flip=True, power=True)
def test_lm_dcp_save_survives_a_crash_at_every_file_event(reshard_run, file_point):
    file_point.judge(reshard_run(faults=[file_point.fault()]))


@pytest.mark.reshard(workload="dflash", world_size=4, steps=12, timeout=120)
# The drafters' leader writes the checkpoint. No power points: the pipeline's rewind budget is 0
# (a lost rank costs nothing, the others hold its state), and a power loss takes every rank.
@pytest.mark.reshard_sweep(rank=2, flip=True)
def test_dflash_save_survives_a_crash_at_every_file_event(reshard_run, file_point):
    file_point.judge(reshard_run(faults=[file_point.fault()]))
