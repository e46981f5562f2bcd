"""The harness's own machine fails, not the workload: the run folder's file system fills up
mid-run. The run must end in a harness error that says so, never in a verdict on the workload,
and the user's training must not be broken by the probe's failed writes."""
from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pytest

from pytest_reshard.contract import RunDir, lost_writes
from pytest_reshard.probe import HEARTBEAT_S, Run
from pytest_reshard.session import Session, scenario_from
from pytest_reshard.supervisor import HarnessError


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 256 KiB tmpfs: a real file system that really fills up."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"mounting a tmpfs needs root (CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_a_full_run_folder_ends_the_run_unjudged(small_fs: Path, toy: str) -> None:
    with Session(small_fs) as session:
        with pytest.raises(HarnessError, match=r"not judged: .*No space left on device.*run it "
                                               "again") as refused:
            session.run(scenario_from(toy, world_size=2, steps=100_000, timeout_s=120), "fills_up")
    assert str(small_fs) in str(refused.value)
    assert not list(small_fs.rglob("verdict.json"))    # nothing was judged
    # (the autouse nothing_leaks fixture checks that no process we started is alive)


def test_the_probe_keeps_training_when_its_events_file_refuses_a_write(small_fs: Path) -> None:
    """No OSError reaches the training loop; the heartbeat carries the errno to the supervisor."""
    folder = RunDir(small_fs / "run")
    folder.events.mkdir(parents=True)
    folder.plan(0).write_text('{"seed": 0, "world_size": 1, "roles": ["trainer"], "faults": []}')
    run = Run({"RESHARD_DIR": str(folder.root), "RESHARD_GENERATION": "0", "RANK": "0",
               "WORLD_SIZE": "1", "RESHARD_SUPERVISOR_PID": str(os.getpid())})
    try:
        (small_fs / "filler").write_bytes(b"\0" * (os.statvfs(small_fs).f_bavail * 4096))
    except OSError:
        pass                                               # full, as wanted
    for i in range(200):                                   # every event now fails to land
        with run.step(i) as step:
            step.record(loss=1.0)
    assert run.lost == errno.ENOSPC                        # kept, not raised
    deadline = time.monotonic() + 100 * HEARTBEAT_S        # the next beats carry it
    while lost_writes(os.stat(folder.heartbeat(0, 0))) != errno.ENOSPC:
        assert time.monotonic() < deadline, "the heartbeat never said the events were lost"
        time.sleep(HEARTBEAT_S / 2)
    run.close()
