"""Record mode on a real job: ``torchrun`` itself (not the harness) runs a 2-rank gloo DDP script
with ``RESHARD_RECORD`` set; rank 1 SIGKILLs itself in a step of the first incarnation, torchrun
restarts the workers (``--max-restarts=1``), and they resume from the script's own checkpoint.
Then ``pytest-reshard judge DIR`` judges the recording, as on a production job.

Every wait is bounded: each torchrun and each judge runs under a timeout, in its own session,
whose processes are killed (the whole group) if it runs over.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_reshard.contract import Cause, Ev
from pytest_reshard.history.recorded import load_recorded
from pytest_reshard.session.judge import judge_history

WORKLOAD = Path(__file__).parents[1] / "workloads" / "record_train.py"
TORCHRUN_S = 240   # two incarnations of two ranks importing torch, on a busy 2-core machine
JUDGE_S = 120


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``cmd`` in its own session; on a timeout every process of it is killed, then it fails."""
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
            pytest.fail(f"{' '.join(cmd[:4])} ... ran over {timeout} s:\n{out[-3000:]}")
        return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def _env(record: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESHARD_")}
    env.update(RESHARD_RECORD=str(record), OMP_NUM_THREADS="1",
               # pytorch#135712: a restart on one node fails in "Gloo connectFullMesh" without it
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return env


def torchrun_job(folder: Path, *script_args: str) -> Path:
    """The recording of one torchrun job of the workload in ``folder/rec``."""
    record = folder / "rec"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           "--max-restarts=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
           "--monitor-interval=0.2", str(WORKLOAD), "--workdir", str(folder / "work"),
           *script_args]
    done = _run(cmd, _env(record), TORCHRUN_S)
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{done.stdout[-4000:]}"
    return record


def judge(record: Path, *extra: str) -> tuple[int, str, dict]:
    done = _run([sys.executable, "-m", "pytest_reshard.cli", "judge", str(record), *extra],
                dict(os.environ), JUDGE_S)
    verdict = json.loads((record / "verdict.json").read_text())
    return done.returncode, done.stdout, verdict


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("record")
    return {"correct": torchrun_job(root / "correct", "--crash-at", "4"),
            "bug": torchrun_job(root / "bug", "--crash-at", "4", "--ignore-checkpoint"),
            "clean": torchrun_job(root / "clean")}


def test_torchrun_restart_is_recorded_as_two_generations(jobs: dict[str, Path]) -> None:
    files = sorted(p.name for p in jobs["correct"].glob("rec-r*.jsonl"))
    assert len(files) == 4, files   # two ranks, two incarnations: one file each
    starts = [json.loads(p.read_text().splitlines()[0]) for p in jobs["correct"].glob("*.jsonl")]
    assert sorted((s["restart"], s["rank"]) for s in starts) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {s["launcher"] for s in starts} == {"torchrun"}
    assert not list(jobs["correct"].glob("*.hb")) and not list(jobs["correct"].glob("plan-*"))


def test_judge_passes_no_rewind_on_the_correct_resume(jobs: dict[str, Path]) -> None:
    code, out, verdict = judge(jobs["correct"])
    assert code == 0, out
    checks = verdict["checks"]
    assert checks["no_rewind"]["status"] == "pass", checks["no_rewind"]["message"]
    assert checks["liveness"]["status"] == "pass", checks["liveness"]["message"]
    for name in ("loss_continuity", "exactly_once_samples"):   # no clean run in production
        assert checks[name]["status"] == "unknown" and "--reference" in checks[name]["message"]
    assert "generation 0: 2 ranks, resumed at step 0, ended by failure" in out
    assert "generation 1: 2 ranks, resumed at step 3" in out
    assert (jobs["correct"] / "report.html").exists()


def test_judge_fails_no_rewind_when_the_resume_ignores_the_checkpoint(
        jobs: dict[str, Path]) -> None:
    code, out, verdict = judge(jobs["bug"])
    assert code == 1, out
    v = verdict["checks"]["no_rewind"]
    assert v["status"] == "fail"
    assert "generation 1 resumed at step 0" in v["message"], v["message"]
    assert "committed steps 0..3 replayed" in v["message"], v["message"]
    assert "no_rewind fail" in out


def test_a_clean_recording_is_the_reference_for_loss_and_samples(jobs: dict[str, Path]) -> None:
    code, out, verdict = judge(jobs["correct"], "--reference", str(jobs["clean"]))
    assert code == 0, out
    checks = verdict["checks"]
    for name in ("loss_continuity", "exactly_once_samples", "no_rewind"):
        assert checks[name]["status"] == "pass", (name, checks[name]["message"])


# -- a real SIGTERM under record mode: recorded, and the job ends as it would without the probe --

PREEMPTED = textwrap.dedent("""
    import signal, sys, time
    from pytest_reshard.rank import probe

    run = probe.attach(max_rewind_steps=1)
    stop = []
    if sys.argv[1] == "own-handler":   # the job's own, installed after attach, as trainers do
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    step = 0
    while not stop:
        with run.step(step) as s:
            s.record(loss=1.0 / (step + 1))
            if step == 0:
                print("ready", flush=True)
            time.sleep(0.05)
        step += 1
    print("handled", flush=True)
    run.close()
""")
SIGTERM_S = 60


def _preempt(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The script under record mode, sent SIGTERM once it is training."""
    record = tmp_path / "rec"
    script = tmp_path / "preempted.py"
    script.write_text(PREEMPTED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESHARD_")}
    env.update(RESHARD_RECORD=str(record), RANK="0", WORLD_SIZE="1",
               TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_RUN_ID="preempt")
    with subprocess.Popen([sys.executable, str(script), mode], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as proc:
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            assert first.strip() == "ready", first + proc.stdout.read()
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=SIGTERM_S)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, first + out, ""), record


def test_a_sigterm_without_a_handler_of_the_jobs_own_still_kills_it_and_is_recorded(
        tmp_path: Path) -> None:
    done, record = _preempt(tmp_path, "default")
    assert done.returncode == -signal.SIGTERM, done.stdout   # died of it, as without the probe
    assert "handled" not in done.stdout
    h = load_recorded(record)
    assert [(s.signal, s.armed) for s in h.signals()] == [(signal.SIGTERM.name, False)]
    g = h.generations[0]
    assert g.cause != Cause.COMPLETE and "after a SIGTERM landed" in g.detail, g.detail
    assert judge_history(h)["liveness"].status != "pass"


def test_a_sigterm_the_job_handles_itself_is_a_preemption_not_complete(tmp_path: Path) -> None:
    done, record = _preempt(tmp_path, "own-handler")
    assert done.returncode == 0 and "handled" in done.stdout, done.stdout   # its handler ran
    h = load_recorded(record)
    assert [s.signal for s in h.signals()] == [signal.SIGTERM.name]
    assert h.rank_events(Ev.EXIT)   # it closed
    g = h.generations[0]
    assert (g.cause, g.planned) == (Cause.PREEMPT, True), g.detail
