"""Record mode on a real SLURM job: ``sbatch`` (not the harness) runs a 2-node gloo DDP job with
``RESHARD_RECORD`` set; rank 1 SIGKILLs itself in step 4, the job step fails, and the batch
script requeues the job (``scontrol requeue``, ``--requeue``): SLURM runs the batch script again
with the next ``SLURM_RESTART_COUNT``, and the job resumes from its own checkpoint. Then
``pytest-reshard judge DIR`` judges the recording.

Why a requeue: it is how SLURM itself restarts a job (a node failure under ``--requeue`` takes the
same path), and the one restart SLURM counts for the job's processes. A third job retries ``srun``
in a loop inside its batch script instead (no requeue): every attempt has the same job id and no
restart count, and only its job step (``SLURM_STEP_ID``) tells the attempts apart, so the judge
must read them as two generations, not as two processes of one rank (damage, exit 2). torchrun
under ``srun`` numbers its own restarts, as ``test_record_judge.py`` covers.

SLURM holds a requeued batch job until the first run's credentials expire (EligibleTime 121 s
after the requeue on this cluster); the test, as the job's owner may, moves its start forward
(``scontrol update StartTime=now+5``: a start in the second of the requeue is refused, "Job
credential revoked", and the job fails). Nothing recorded depends on when it starts.

Every wait is bounded: a job that has not ended within ``JOB_S`` is cancelled and the test fails;
after the jobs, no job and no process of theirs is left on the cluster.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_reshard.contract import Env, Ev, read_jsonl
from pytest_reshard.history.recorded import Incarnation, incarnation_of, recorded_files

from .test_record_judge import judge
from .test_slurm import _node_processes, _squeue

WORKLOAD = Path(__file__).parents[1] / "workloads" / "record_train.py"
JOB_S = 240      # two runs of a 2-node job, each importing torch, on a busy 2-core machine
STEPS = 8
REQUEUE_DELAY_S = 5   # a requeued job's start, moved forward (module docstring)

# What a user writes (docs/guide/record-and-judge.md, SLURM), on 1 task per node.
SETUP = f"""# job.sh RECORD_DIR CKPT_DIR [record_train.py options]
export {Env.RECORD}=$1 {Env.STEPS}={STEPS} OMP_NUM_THREADS=1
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_NODELIST" | head -n1)
export MASTER_PORT=$((29500 + SLURM_JOB_ID % 1000))
"""
SRUN = f"""srun bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS exec "$@"' \\
    _ {sys.executable} {WORKLOAD} --workdir "$2" "${{@:3}}\""""
BATCH = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --requeue --open-mode=append
{SETUP}{SRUN} \\
  || {{ [ "${{SLURM_RESTART_COUNT:-0}}" -lt 3 ] && scontrol requeue "$SLURM_JOB_ID"; }}
"""
# The same job retrying srun in its batch script: no requeue, so SLURM counts no restart.
RETRY_BATCH = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1
{SETUP}for attempt in 1 2 3; do
  echo "srun attempt $attempt"
  {SRUN} && break
done
"""
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def _scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30).stdout


def _job(job: str) -> dict[str, str]:
    """``scontrol show job -o``'s fields (empty once SLURM has forgotten the job)."""
    return dict(re.findall(r"(\w+)=(\S*)", _scontrol("show", "job", "-o", job)))


def _submit(folder: Path, batch: str, *args: str) -> str:
    folder.mkdir(parents=True)
    script = folder / "job.sh"
    script.write_text(batch)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESHARD_")}
    done = subprocess.run(["sbatch", "--parsable", f"--output={folder / 'slurm-%j.out'}",
                           str(script), str(folder / "rec"), str(folder / "work"), *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"sbatch failed: {done.stderr}"
    return done.stdout.strip().split(";")[0]


def _wait(jobs: list[str], deadline: float) -> dict[str, dict[str, str]]:
    """Each job's last fields once every job ended. A job held after its requeue starts
    ``REQUEUE_DELAY_S`` from now."""
    last: dict[str, dict[str, str]] = {}
    moved: set[tuple[str, str]] = set()   # (job, restart count): each requeue moved once
    while time.monotonic() < deadline:
        for job in jobs:
            if last.get(job, {}).get("JobState") in ENDED:
                continue
            fields = _job(job)
            requeue = (job, fields.get("Restarts", "0"))
            if fields.get("Reason") == "BeginTime" and requeue[1] != "0" and requeue not in moved:
                _scontrol("update", f"JobId={job}", f"StartTime=now+{REQUEUE_DELAY_S}")
                moved.add(requeue)
            last[job] = fields
        if all(last[job].get("JobState") in ENDED for job in jobs):
            return last
        time.sleep(0.5)
    raise TimeoutError(f"jobs not ended within {JOB_S} s: "
                       f"{ {j: last.get(j, {}).get('JobState') for j in jobs} }")


def _starts(record: Path) -> list[Incarnation]:
    out = []
    for path in recorded_files(record):
        events, _, _ = read_jsonl(path)
        assert events and events[0][1]["ev"] == Ev.START, path
        out.append(incarnation_of(path, events[0][1]))
    return out


def _settle() -> None:
    """Until no job is queued and no process is left on the nodes (at most 30 s)."""
    deadline = time.monotonic() + 30
    while (_squeue() or _node_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)


#: Two minutes of a real cluster's jobs: nightly, for the CI budget (torchrun's recording runs in
#: CI: test_record_judge.py).
pytestmark = pytest.mark.nightly


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The correct job, the planted bug and the srun retry loop, submitted together (each takes
    one CPU of each node: the third runs as soon as one of the others is requeued); the job ids
    in ``<folder>/job``."""
    assert not _squeue(), f"the cluster is busy before the test: {_squeue()}"
    root = tmp_path_factory.mktemp("record-slurm")
    folders = {"correct": root / "correct", "bug": root / "bug", "retry": root / "retry"}
    restarts = {"correct": "1", "bug": "1", "retry": "0"}   # SLURM's count: a requeue each, none
    ids: dict[str, str] = {}
    try:
        ids["correct"] = _submit(folders["correct"], BATCH, "--crash-at", "4")
        ids["bug"] = _submit(folders["bug"], BATCH, "--crash-at", "4", "--ignore-checkpoint")
        ids["retry"] = _submit(folders["retry"], RETRY_BATCH, "--crash-at", "4")
        ended = _wait(list(ids.values()), time.monotonic() + JOB_S)
    except BaseException:
        if ids:
            subprocess.run(["scancel", *ids.values()], capture_output=True, timeout=30)
        _settle()
        raise
    _settle()
    assert not _squeue(), f"jobs left: {_squeue()}"
    assert not _node_processes(), f"processes left on the nodes: {_node_processes()}"
    for name, job in ids.items():
        out = "".join(p.read_text() for p in folders[name].glob("slurm-*.out"))
        fields = ended[job]
        assert (fields.get("JobState"), fields.get("Restarts")) == ("COMPLETED", restarts[name]), \
            (fields, out)
        (folders[name] / "job").write_text(job)
    return {name: folder / "rec" for name, folder in folders.items()}


def test_a_requeued_slurm_job_is_recorded_as_two_generations_on_its_nodes(
        jobs: dict[str, Path]) -> None:
    job = (jobs["correct"].parent / "job").read_text()
    nodes = set(os.environ["RESHARD_SLURM_NODES"].split())
    starts = _starts(jobs["correct"])
    assert sorted((s.restart, s.rank) for s in starts) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {(s.launcher, s.job) for s in starts} == {("slurm", job)}
    for restart in (0, 1):   # a rank on each node, in each run
        assert {s.host for s in starts if s.restart == restart} == nodes, starts


def test_judge_passes_no_rewind_on_the_requeued_jobs_resume(jobs: dict[str, Path]) -> None:
    code, out, verdict = judge(jobs["correct"])
    assert code == 0, out
    checks = verdict["checks"]
    assert checks["no_rewind"]["status"] == "pass", checks["no_rewind"]["message"]
    assert checks["liveness"]["status"] == "pass", checks["liveness"]["message"]
    gen0 = re.search(r"generation 0: 2 ranks, resumed at step 0, ended by failure: .*", out)
    assert gen0, out
    for node in os.environ["RESHARD_SLURM_NODES"].split():   # the ranks that never closed
        assert f" on {node})" in gen0.group(0), gen0.group(0)
    assert "generation 1: 2 ranks, resumed at step 3, ended by complete" in out, out


def test_judge_fails_no_rewind_when_the_requeued_job_starts_from_step_0(
        jobs: dict[str, Path]) -> None:
    code, out, verdict = judge(jobs["bug"])
    assert code == 1, out
    v = verdict["checks"]["no_rewind"]
    assert v["status"] == "fail"
    assert "generation 1 resumed at step 0" in v["message"], v["message"]
    assert "committed steps 0..3 replayed" in v["message"], v["message"]
    assert "no_rewind fail" in out


def test_an_srun_retry_loop_is_recorded_as_two_job_steps_on_its_nodes(
        jobs: dict[str, Path]) -> None:
    out = "".join(p.read_text() for p in jobs["retry"].parent.glob("slurm-*.out"))
    assert re.findall(r"srun attempt \d", out) == ["srun attempt 1", "srun attempt 2"], out
    nodes = set(os.environ["RESHARD_SLURM_NODES"].split())
    starts = _starts(jobs["retry"])
    # SLURM counted no restart: only the job step tells the attempts apart
    assert sorted((s.launch, s.rank) for s in starts) == [
        ((0, 0, 0), 0), ((0, 0, 0), 1), ((0, 1, 0), 0), ((0, 1, 0), 1)], starts
    assert {s.restart for s in starts} == {0}, starts
    for step in (0, 1):   # a rank on each node, in each srun
        assert {s.host for s in starts if s.launch == (0, step, 0)} == nodes, starts


def test_judge_passes_no_rewind_on_the_srun_retry_loops_resume(jobs: dict[str, Path]) -> None:
    code, out, verdict = judge(jobs["retry"])
    assert code == 0, out
    checks = verdict["checks"]
    assert checks["no_rewind"]["status"] == "pass", checks["no_rewind"]["message"]
    assert checks["liveness"]["status"] == "pass", checks["liveness"]["message"]
    assert "generation 0: 2 ranks, resumed at step 0, ended by failure: " in out, out
    assert "generation 1: 2 ranks, resumed at step 3, ended by complete" in out, out
    assert "generation 2" not in out, out
