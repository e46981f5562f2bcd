"""The harness's own machine fails, not the workload: the run folder's file system fills up
mid-run. The run must end in a harness error that says so, never in a verdict on the workload,
and the user's training must not be broken by the probe's failed writes."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pytest_reshard import procfs
from pytest_reshard.contract import RunDir, lost_writes
from pytest_reshard.probe import HEARTBEAT_S, Run
from pytest_reshard.session import Session, scenario_from
from pytest_reshard.supervisor import HarnessError

from ..conftest import harness_training, ports_of, text_of, until


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


@pytest.fixture
def ext4_fs(tmp_path: Path):
    """A 64 MiB ext4 on a loop device that turns read-only on its first error, as a disk whose
    file system hit a fault does (``errors=remount-ro``); yields (mount point, its sysfs knob
    that raises such an error)."""
    image, mnt = tmp_path / "ext4.img", tmp_path / "ext4"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", str(image)], capture_output=True, text=True)
    mounted = made.returncode or subprocess.run(
        ["mount", "-o", "loop,errors=remount-ro", str(image), str(mnt)], capture_output=True,
        text=True).returncode
    if made.returncode or mounted:
        pytest.skip("a loop-mounted ext4 needs mkfs.ext4, root and a loop device")
    try:
        device = subprocess.run(["findmnt", "-no", "SOURCE", str(mnt)], capture_output=True,
                                text=True, check=True).stdout.strip()
        knob = Path("/sys/fs/ext4") / Path(device).name / "trigger_fs_error"
        if not knob.exists():
            pytest.skip(f"this kernel has no {knob}")
        yield mnt, knob
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_a_run_folder_that_turns_read_only_mid_run_ends_the_run_unjudged(ext4_fs, toy: str) -> None:
    """Once both ranks trained, the file system goes read-only under them (the ranks' open
    events files included): a harness error naming it, no verdict."""
    mnt, knob = ext4_fs
    events = mnt / "art" / "ro" / "events"

    def fail_the_disk() -> None:
        until(lambda: all('"ev":"begin"' in text_of(events / f"g0-r{r}.jsonl") for r in (0, 1)),
              120, "both ranks trained")
        knob.write_text("the harness's disk failed\n")

    thread = threading.Thread(target=fail_the_disk, daemon=True)
    thread.start()
    with Session(mnt / "art") as session:
        with pytest.raises(HarnessError, match=r"not judged: .*Read-only file system") as refused:
            session.execute(scenario_from(toy, world_size=2, steps=100_000, timeout_s=120),
                            mnt / "art" / "ro")
    thread.join(timeout=5)
    assert str(mnt) in str(refused.value) and not list(mnt.rglob("verdict.json"))


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


@pytest.mark.parametrize("launcher,extra", [("fork", {}), ("local", {}), ("torchrun", {}),
                                            pytest.param("elastic", {"nodes": 2},  # the CI budget
                                                         marks=pytest.mark.nightly)])
def test_a_harness_killed_outright_leaves_no_process_port_or_namespace(tmp_path: Path, toy: str,
                                                                        launcher: str,
                                                                        extra: dict) -> None:
    """SIGKILL the harness mid-training (an OOM kill of pytest, a CI runner's hard timeout): no
    rank, fork server, torchrun agent, store port or network namespace of its run outlives it
    (the ranks' heartbeats find their supervisor gone; namespaces have a reaper)."""
    run = tmp_path / "run"
    harness = harness_training(tmp_path, run, f"{toy!r}, world_size=2, steps=100_000, "
                               f"launcher={launcher!r}, timeout_s=300, **{extra!r}", ranks=2)
    try:
        ours = procfs.started_by(harness.pid)
        assert ours, "no process of the run found"
        ports = ports_of(run)
        namespaces = [n for e in map(json.loads, text_of(run / "events" / "supervisor.jsonl")
                                     .splitlines()) if e["ev"] == "nodes"
                      for n in e.get("namespaces") or ()]
    finally:
        harness.kill()
        harness.wait(timeout=30)
    until(lambda: not procfs.started_by(harness.pid), 30, "every process of the run gone")
    until(lambda: not any(procfs.listening(p) for p in ports), 30, "every port of the run closed")
    until(lambda: not any(n in _namespaces() for n in namespaces), 30, "its namespaces removed")


def _namespaces() -> str:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return listed.stdout


def test_another_process_writing_into_the_events_file_is_not_judged(tmp_path: Path) -> None:
    """A line appended to a rank's events file by someone else (here: the script itself) is
    damage: the run is a harness error, so no allow_unknown can turn it into a pass."""
    script = tmp_path / "meddles.py"
    script.write_text(
        "import os\nfrom pytest_reshard import probe\nrun = probe.attach()\n"
        "run.resumed(0, source='fresh')\nfor step in range(4):\n"
        "    with run.step(step) as s:\n"
        "        s.record(loss=1.0 / (step + 1))\n"
        "    if step == 1 and os.environ.get('RESHARD_DIR'):\n"
        "        path = os.path.join(os.environ['RESHARD_DIR'], 'events',\n"
        "                            f\"g{run.generation}-r{run.rank}.jsonl\")\n"
        "        with open(path, 'a') as f:\n"
        "            f.write('{\"ev\": \"end\", \"step\": 3}\\n')\n"
        "run.close()\n")
    with Session(tmp_path / "art") as session:
        with pytest.raises(HarnessError, match=r"not judged: the run's history is damaged at "
                                               r".*g0-r0\.jsonl:\d+: it has no checksum"):
            session.run(scenario_from(str(script), world_size=1, steps=4, timeout_s=60), "meddles")
