"""How a rank ends: a script that ends the ordinary way is judged as under torchrun.

A DDP script that ends with ``run.close(); dist.destroy_process_group()`` and returns must pass
every checker under the warm fork server as under a cold interpreter; a teardown that aborts
after ``run.close()`` (FSDP2 under torchrun, "terminate called without an active exception") is
a clean exit under every launcher; and a forked rank exits as ``python script.py`` does.
"""
import os
import time
from pathlib import Path

import pytest

from ..conftest import WORKLOADS

DDP = str(WORKLOADS / "ddp_train.py")

pytestmark = pytest.mark.reshard(world_size=4, steps=30, timeout=90)


def test_ddp_script_ending_normally_passes_under_fork(reshard_run):
    """Before the fork server kept the default group (warmup._keep_default_group), freeing the
    DDP model at ``main()``'s return deadlocked a forked rank in ~ProcessGroupGloo: "rank N
    stopped responding at step 29, phase end" in most runs on a loaded machine."""
    from pytest_reshard import chaos

    for i in range(3):   # the deadlock hit most runs: three is enough to see it
        result = reshard_run(DDP, launcher="fork",
                             faults=[chaos.shift_shards(to_world_size=3, at_step=10, notice_s=20)])
        assert result.history.detections() == [], f"run {i}: {result.history.detections()}"
        result.assert_ok()
        assert [g.world_size for g in result.history.generations.values()] == [4, 3]


@pytest.mark.parametrize("launcher", ["fork", "local",
                                      pytest.param("torchrun", marks=pytest.mark.nightly)])
def test_abort_after_close_is_a_clean_exit(reshard_run, launcher):
    """Every rank aborts (SIGABRT) after run.close(): every step ended and the probe recorded the
    exit, so it is the clean exit it is, whatever the exit code, under every launcher."""
    result = reshard_run(DDP, launcher=launcher, steps=10, args=["--abort-after-close"])
    work = result.run_dir / "work"
    assert sorted(p.name for p in work.glob("aborted-*")) == [f"aborted-g0-r{r}" for r in range(4)]
    assert result.history.detections() == []
    result.assert_ok()


# -- the fork server's children exit as a cold interpreter does ------------------------------
ENDINGS = r'''
import atexit, os, sys, threading
out, how = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
open(out + ".buffered", "w").write("flushed at exit")     # never closed
def late():
    threading.main_thread().join()                        # returns once the script's main ended
    open(out + ".thread", "w").write("joined")
threading.Thread(target=late).start()                     # not a daemon: exit waits for it
print("main is", __name__, os.path.basename(__file__), flush=True)
if how == "exit3":
    sys.exit(3)
if how == "message":
    sys.exit("stopping: bad config")
if how == "raise":
    raise ValueError("boom")
'''


@pytest.fixture(scope="module")
def server():
    from pytest_reshard.supervisor.launch.forkserver import ForkServer

    s = ForkServer()
    yield s
    s.close()


def _spawn(server, script: Path, how: str, tmp: Path) -> tuple[int, str]:
    out = tmp / how
    log = tmp / f"{how}.log"
    pid = server.spawn([str(script), str(out), how], dict(os.environ), str(tmp), log)
    deadline = time.monotonic() + 30
    while pid not in server.poll():
        assert time.monotonic() < deadline, "the forked script did not exit"
        time.sleep(0.01)
    return server.poll()[pid], log.read_text()


@pytest.mark.parametrize("how, code", [("return", 0), ("exit3", 3), ("message", 1), ("raise", 1)])
def test_forked_script_exits_as_python_script_does(server, tmp_path, how, code):
    """atexit handlers run, a file never closed is flushed, a non-daemon thread is joined, and
    sys.exit / an uncaught exception give the code and output ``python script.py`` gives
    (os._exit in the child skipped all of it)."""
    script = tmp_path / "endings.py"
    script.write_text(ENDINGS)
    got, log = _spawn(server, script, how, tmp_path)
    assert got == code, log
    out = tmp_path / how
    assert (Path(f"{out}.atexit").read_text(), Path(f"{out}.buffered").read_text(),
            Path(f"{out}.thread").read_text()) == ("ran", "flushed at exit", "joined")
    assert "main is __main__ endings.py" in log
    if how == "message":
        assert "stopping: bad config" in log
    if how == "raise":
        assert "ValueError: boom" in log and 'endings.py", line' in log
        assert "forkserver.py" not in log  # the traceback starts at the script, as cold



GROUP_LIFETIME = r'''
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

def main():
    store = dist.FileStore(sys.argv[1], 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=20))
    model = DDP(torch.nn.Linear(4, 1))
    model(torch.ones(2, 4)).sum().backward()
    dist.barrier()
    dist.destroy_process_group()

main()   # the model is freed here, in a live interpreter
print("gloo workers after main():", sum(t == "pt_gloo_runloop" for t in threads()), flush=True)
'''


def test_a_forked_rank_keeps_its_default_group_until_exit_as_a_cold_one(server, tmp_path):
    """The root cause, deterministically: in a cold DDP script the default group outlives the
    model (torch.distributed.nn's default arguments hold it until the interpreter exits), so its
    gloo workers are still there after main() returned; a forked rank must match."""
    import subprocess
    import sys

    script = tmp_path / "lifetime.py"
    script.write_text(GROUP_LIFETIME)
    cold = subprocess.run([sys.executable, str(script), str(tmp_path / "cold.store")],
                          capture_output=True, text=True, timeout=120)
    assert cold.returncode == 0, cold.stderr
    log = tmp_path / "fork.log"
    pid = server.spawn([str(script), str(tmp_path / "fork.store")], dict(os.environ),
                       str(tmp_path), log)
    deadline = time.monotonic() + 60
    while pid not in server.poll():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.01)
    assert server.poll()[pid] == 0, log.read_text()
    line = [x for x in log.read_text().splitlines() if x.startswith("gloo workers")]
    assert line == [x for x in cold.stdout.splitlines() if x.startswith("gloo workers")]
    assert line and not line[0].endswith(": 0"), line
