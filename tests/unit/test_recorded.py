"""Record mode and ``pytest-reshard judge`` without processes: the probe's record mode in this
process, the recorded history's derivations on hand-written files, the judge's production rules.
The same against real torchrun jobs: tests/scenarios/test_record_judge.py."""
from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any, Sequence

import pytest

from pytest_reshard import cli
from pytest_reshard.contract import RECORD_FILE, Cause, Env, encode_event, record_file
from pytest_reshard.history import HistoryError
from pytest_reshard.history.recorded import (Incarnation, generations_of, load_recorded,
                                             recorded_files)
from pytest_reshard.rank import probe
from pytest_reshard.session.judge import NEEDS_REFERENCE, judge_history, reference_refusal


class Job:
    """Writes record-mode files as the probe would: one per process."""

    def __init__(self, folder: Path, *, world: int = 2, launcher: str | None = "torchrun",
                 job: str | None = "job1", budget: int = 3) -> None:
        self.folder, self.world, self.launcher, self.job, self.budget = \
            folder, world, launcher, job, budget
        self.t = 1000.0
        self.pid = 100
        folder.mkdir(parents=True, exist_ok=True)

    def incarnation(self, *, restart: int | None, resume: int, steps: Sequence[int],
                    crash_at: int | None = None, close: bool = True, ranks: Sequence[int] = (),
                    saves: Sequence[int] = (), steps_declared: int | None = None,
                    sigterm: bool = False) -> None:
        """Every rank of one launch: resumes at ``resume``, runs ``steps``; with ``crash_at``
        every rank's events stop at that step's begin (no close)."""
        files: dict[int, list[dict[str, Any]]] = {}
        for r in ranks or range(self.world):
            self.pid += 1
            self.t += 0.01
            files[r] = [{"ev": "start", "t": self.t, "gen": restart or 0, "rank": r,
                         "world_size": self.world, "role": "trainer", "pid": self.pid,
                         "max_rewind_steps": self.budget, "record": True, "host": "node7",
                         "launcher": self.launcher, "restart": restart, "job": self.job,
                         "steps": steps_declared, "script": "train.py"},
                        {"ev": "resumed", "t": self.t, "gen": restart or 0, "rank": r,
                         "step": resume, "source": "checkpoint"}]
        for s in steps:
            for r, evs in files.items():
                self.t += 0.001
                g = restart or 0
                evs.append({"ev": "begin", "t": self.t, "gen": g, "rank": r, "step": s})
                if s == crash_at:
                    continue
                evs.append({"ev": "record", "t": self.t, "gen": g, "rank": r, "step": s,
                            "loss": 1.0 / (s + 1), "samples": [2 * s + r]})
                evs.append({"ev": "end", "t": self.t, "gen": g, "rank": r, "step": s})
                if s in saves and r == 0:
                    evs.append({"ev": "ckpt_save", "t": self.t, "gen": g, "rank": r, "step": s,
                                "digest": {}})
            if s == crash_at:
                break
        for r, evs in files.items():
            self.t += 0.001
            if sigterm:
                evs.append({"ev": "signal", "t": self.t, "gen": restart or 0, "rank": r,
                            "signal": "SIGTERM"})
            if close and crash_at is None:
                evs.append({"ev": "exit", "t": self.t, "gen": restart or 0, "rank": r,
                            "code": 0})
            name = record_file(r, "node7", evs[0]["pid"], evs[0]["t"])
            (self.folder / name).write_bytes(b"".join(encode_event(e) for e in evs))


def crash_and_resume(folder: Path, *, resume: int, restart: bool = True) -> None:
    """A crash in step 4 (the save of step 2 the last), the launcher's restart at ``resume``."""
    job = Job(folder)
    job.incarnation(restart=0 if restart else None, resume=0, steps=range(8), crash_at=4,
                    saves=[2])
    job.incarnation(restart=1 if restart else None, resume=resume, steps=range(resume, 8))


# -- generations ------------------------------------------------------------------------------

def inc(rank: int, t: float, *, restart: int | None = None, job: str | None = None) -> Incarnation:
    return Incarnation(path=Path(f"r{rank}-{t}"), rank=rank, t=t, restart=restart, job=job)


def test_generations_follow_the_launchers_restart_count_whatever_the_start_order() -> None:
    incs = [inc(0, 5.0, restart=1), inc(1, 1.0, restart=0), inc(0, 1.1, restart=0),
            inc(1, 4.0, restart=1)]
    assert generations_of(incs) == [1, 0, 0, 1]


def test_without_a_restart_count_a_rank_that_starts_again_begins_the_next_generation() -> None:
    incs = [inc(0, 0.0), inc(1, 0.1), inc(1, 5.0), inc(0, 5.1), inc(0, 9.0)]
    assert generations_of(incs) == [0, 0, 1, 1, 2]


def test_an_srun_retry_loop_in_one_requeued_job_is_a_generation_per_step() -> None:
    """SLURM's restart count stays 0 through a batch script's srun loop: each srun is a job
    step of its own, and a requeue starts the steps again."""
    def srun(rank: int, t: float, requeue: int, step: int) -> Incarnation:
        return Incarnation(path=Path(f"r{rank}-{t}"), rank=rank, t=t, restart=requeue, job="9",
                           launch=(requeue, step, 0))

    incs = [srun(0, 1.0, 0, 0), srun(1, 1.1, 0, 0), srun(0, 5.0, 0, 1), srun(1, 5.1, 0, 1),
            srun(1, 9.0, 1, 0), srun(0, 9.1, 1, 0)]
    assert generations_of(incs) == [0, 0, 1, 1, 2, 2]


def test_jobs_follow_each_other_in_the_order_they_started() -> None:
    # a job resubmitted from its checkpoint: SLURM counts its restarts from 0 again
    incs = [inc(0, 50.0, restart=0, job="B"), inc(0, 1.0, restart=0, job="A"),
            inc(0, 9.0, restart=1, job="A"), inc(1, 50.1, restart=0, job="B")]
    assert generations_of(incs) == [2, 0, 1, 2]


# -- the recorded history ---------------------------------------------------------------------

def test_a_correct_resume_passes_no_rewind_and_the_crash_is_an_unplanned_failure(
        tmp_path: Path) -> None:
    crash_and_resume(tmp_path, resume=3)
    h = load_recorded(tmp_path)
    assert sorted(h.generations) == [0, 1]
    g0, g1 = h.generations[0], h.generations[1]
    assert (g0.cause, g0.planned) == (Cause.FAILURE, False)
    assert "rank 0 (pid" in g0.detail and "last seen at step 4 (begin)" in g0.detail
    assert (g1.cause, g1.planned, g1.resume_step) == (Cause.COMPLETE, True, 3)
    assert h.target_step() == 7   # the last generation closed: its last committed step
    verdicts = judge_history(h)
    assert verdicts["no_rewind"].status == "pass", verdicts["no_rewind"].message
    assert verdicts["liveness"].status == "pass", verdicts["liveness"].message
    assert "launcher started the next one" in verdicts["liveness"].message


def test_a_resume_from_step_0_fails_no_rewind_naming_the_replayed_steps(tmp_path: Path) -> None:
    crash_and_resume(tmp_path, resume=0)
    v = judge_history(load_recorded(tmp_path))["no_rewind"]
    assert v.status == "fail"
    assert "committed steps 0..3 replayed (4 steps, budget 3)" in v.message, v.message
    assert v.generation == 1


def test_order_alone_derives_the_generations_without_a_restart_count(tmp_path: Path) -> None:
    crash_and_resume(tmp_path, resume=0, restart=False)
    assert judge_history(load_recorded(tmp_path))["no_rewind"].status == "fail"


def test_checks_that_need_a_clean_run_say_unknown_without_a_reference(tmp_path: Path) -> None:
    crash_and_resume(tmp_path, resume=3)
    verdicts = judge_history(load_recorded(tmp_path))
    for name in ("loss_continuity", "exactly_once_samples"):
        assert verdicts[name].status == "unknown"
        assert "--reference DIR" in verdicts[name].message


def test_a_reference_recording_stands_for_the_clean_run(tmp_path: Path) -> None:
    crash_and_resume(tmp_path / "run", resume=3)
    Job(tmp_path / "clean", job="job0").incarnation(restart=0, resume=0, steps=range(8))
    verdicts = judge_history(load_recorded(tmp_path / "run"), load_recorded(tmp_path / "clean"))
    assert verdicts["loss_continuity"].status == "pass", verdicts["loss_continuity"].message
    assert verdicts["exactly_once_samples"].status == "pass", \
        verdicts["exactly_once_samples"].message


def test_a_reference_that_restarted_with_the_same_bug_is_refused_not_a_pass(tmp_path: Path) -> None:
    # the run replays steps 0..3 after its crash; a "reference" that did the same would make
    # the loss and the samples look right
    crash_and_resume(tmp_path / "run", resume=0)
    crash_and_resume(tmp_path / "clean", resume=0)
    ref = load_recorded(tmp_path / "clean")
    verdicts = judge_history(load_recorded(tmp_path / "run"), ref, tmp_path / "clean")
    for name in NEEDS_REFERENCE:
        v = verdicts[name]
        assert v.status == "unknown", (name, v.message)
        assert f"reference recording {tmp_path / 'clean'} cannot stand for a clean run" in v.message
        assert "2 generations" in v.message, v.message
        assert v.details["reference"] == "refused"
    assert verdicts["no_rewind"].status == "fail"   # what needs no reference is judged


def test_a_reference_that_crashed_or_replayed_a_step_is_refused(tmp_path: Path) -> None:
    crashed = Job(tmp_path / "crashed", job="job0")
    crashed.incarnation(restart=0, resume=0, steps=range(8), crash_at=5)
    why = reference_refusal(load_recorded(tmp_path / "crashed"), tmp_path / "crashed")
    assert why is not None and "ended by failure, not complete" in why, why
    replayed = Job(tmp_path / "replayed", job="job0")
    replayed.incarnation(restart=0, resume=0, steps=[0, 1, 2, 1, 2, 3, 4, 5, 6, 7])
    why = reference_refusal(load_recorded(tmp_path / "replayed"), tmp_path / "replayed")
    assert why is not None and "rank 0 began step 1 more than once" in why, why
    crash_and_resume(tmp_path / "run", resume=3)
    verdicts = judge_history(load_recorded(tmp_path / "run"), load_recorded(tmp_path / "crashed"),
                             tmp_path / "crashed")
    assert {verdicts[n].status for n in NEEDS_REFERENCE} == {"unknown"}


def test_a_damaged_reference_is_refused(tmp_path: Path) -> None:
    Job(tmp_path / "clean", job="job0").incarnation(restart=0, resume=0, steps=range(8))
    victim = recorded_files(tmp_path / "clean")[0]
    victim.write_bytes(victim.read_bytes().replace(b'"loss":', b'"lost":', 1))  # CRC mismatch
    ref = load_recorded(tmp_path / "clean")
    assert ref.damaged
    why = reference_refusal(ref, tmp_path / "clean")
    assert why is not None and "damaged at" in why and victim.name in why, why


def test_a_clean_reference_is_accepted(tmp_path: Path) -> None:
    Job(tmp_path / "clean", job="job0").incarnation(restart=0, resume=0, steps=range(8))
    assert reference_refusal(load_recorded(tmp_path / "clean"), tmp_path / "clean") is None


def test_a_reference_at_another_size_is_unknown_not_a_guess(tmp_path: Path) -> None:
    crash_and_resume(tmp_path / "run", resume=3)
    Job(tmp_path / "clean", world=1).incarnation(restart=0, resume=0, steps=range(8))
    verdicts = judge_history(load_recorded(tmp_path / "run"), load_recorded(tmp_path / "clean"))
    v = verdicts["exactly_once_samples"]
    assert v.status == "unknown" and "ran at 1 ranks" in v.message, v.message


def test_every_rank_closing_after_a_sigterm_is_a_planned_preemption(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.incarnation(restart=0, resume=0, steps=range(5), sigterm=True, saves=[4])
    job.incarnation(restart=1, resume=3, steps=range(3, 8))
    h = load_recorded(tmp_path)
    assert (h.generations[0].cause, h.generations[0].planned) == (Cause.PREEMPT, True)
    v = judge_history(h)["no_rewind"]
    assert v.status == "fail" and "preemption" in v.message   # a planned end may cost nothing


def test_a_job_that_never_closed_nor_declared_its_steps_is_unknown_about_finishing(
        tmp_path: Path) -> None:
    Job(tmp_path).incarnation(restart=0, resume=0, steps=range(4), close=False)
    h = load_recorded(tmp_path)
    assert h.scenario is None
    v = judge_history(h)["liveness"]
    assert v.status == "unknown" and "RESHARD_STEPS" in v.message, v.message


def test_a_declared_step_count_is_the_target(tmp_path: Path) -> None:
    Job(tmp_path).incarnation(restart=0, resume=0, steps=range(4), steps_declared=10)
    v = judge_history(load_recorded(tmp_path))["liveness"]
    assert v.status == "fail" and "step 9 never committed" in v.message, v.message


def test_two_processes_as_one_rank_of_one_generation_are_damage_not_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = Job(tmp_path)
    job.incarnation(restart=0, resume=0, steps=range(3))
    job.incarnation(restart=0, resume=0, steps=range(3), ranks=[1])
    h = load_recorded(tmp_path)
    assert h.damaged and "second process recorded as rank 1" in h.damaged[0].why
    verdicts = judge_history(h)
    assert {v.status for v in verdicts.values()} == {"unknown"}
    assert all("damaged" in v.message for v in verdicts.values())
    assert not any("failing disk" in v.message for v in verdicts.values())   # none to blame
    # could not judge: 2, not 0 (nor --strict's 3), whatever the checks said
    capsys.readouterr()
    assert cli.main(["judge", str(tmp_path), "--no-html"]) == 2
    assert "could not judge" in capsys.readouterr().err
    assert cli.main(["judge", str(tmp_path), "--no-html", "--strict"]) == 2


def test_one_hosts_clock_skew_does_not_reorder_the_generations(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.incarnation(restart=0, resume=0, steps=range(8), crash_at=4, saves=[2])
    job.t -= 100.0   # the restart's host runs 100 s behind the first one's
    job.incarnation(restart=1, resume=3, steps=range(3, 8))
    h = load_recorded(tmp_path)
    gens = [e["gen"] for e in h.events if "gen" in e]
    assert gens == sorted(gens), "a generation's events came before the one it followed"
    assert judge_history(h)["no_rewind"].status == "pass"


def test_an_empty_folder_is_an_error_that_says_what_to_record(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="RESHARD_RECORD"):
        load_recorded(tmp_path)
    assert cli.main(["judge", str(tmp_path)]) == 2


def test_judge_exit_status_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crash_and_resume(tmp_path / "good", resume=3)
    crash_and_resume(tmp_path / "bad", resume=0)
    assert cli.main(["judge", str(tmp_path / "good"), "--no-html"]) == 0
    assert cli.main(["judge", str(tmp_path / "good"), "--no-html", "--strict"]) == 3
    capsys.readouterr()
    assert cli.main(["judge", str(tmp_path / "bad"), "--json", "--no-html",
                     "--out", str(tmp_path / "out")]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["checks"]["no_rewind"]["status"] == "fail"
    saved = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert saved["status"] == "fail" and saved["checks"]["no_rewind"]["status"] == "fail"


# -- the probe in record mode -----------------------------------------------------------------

def record_env(folder: Path, **extra: str) -> dict[str, str]:
    return {Env.RECORD: str(folder), "RANK": "1", "WORLD_SIZE": "2",
            "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "abc", **extra}


def test_record_mode_writes_one_file_and_nothing_else(tmp_path: Path) -> None:
    before = (set(threading.enumerate()), signal.getsignal(signal.SIGTERM),
              signal.getsignal(signal.SIGUSR1))
    run = probe.Run(record_env(tmp_path), max_rewind_steps=2)
    assert run.active and run.recording == tmp_path and run.generation == 2
    with run.step(0) as s:
        s.record(loss=0.5, samples=[1, 2])
    run.checkpoint_saved(0, state={"model": {"w": 1}})   # digests off: not taken
    run.close()
    after = (set(threading.enumerate()), signal.getsignal(signal.SIGTERM),
             signal.getsignal(signal.SIGUSR1))
    assert after == before   # no heartbeat thread; SIGTERM's disposition is back as it was
    files = recorded_files(tmp_path)
    assert len(files) == 1 and RECORD_FILE.fullmatch(files[0].name)
    assert not any(p.suffix == ".hb" for p in tmp_path.iterdir())
    events = [json.loads(line) for line in files[0].read_text().splitlines()]
    start = events[0]
    assert (start["ev"], start["launcher"], start["restart"], start["job"], start["gen"]) == \
        ("start", "torchrun", 2, "abc", 2)
    assert start["host"] and start["pid"]
    save = next(e for e in events if e["ev"] == "ckpt_save")
    assert (save["digest"], save["undigested"]) == ({}, ["model"])   # said, for the verdict
    assert events[-1]["ev"] == "exit" and events[-1]["code"] == 0


def test_record_mode_records_sigterm_in_front_of_the_jobs_own_handler(tmp_path: Path) -> None:
    # the real signal's outcome (the default kills; a handler runs): test_record_judge.py
    before = signal.getsignal(signal.SIGTERM)
    run = probe.Run(record_env(tmp_path))
    try:
        assert signal.getsignal(signal.SIGTERM) == run._on_sigterm
        own = signal.signal(signal.SIGTERM, lambda signum, frame: None)   # the job's, since
        assert own == run._on_sigterm
        with run.step(0):   # each step puts the recorder back in front of the job's handler
            assert signal.getsignal(signal.SIGTERM) == run._on_sigterm
        run.stop_requested()   # the flag, as under the harness: no loop through itself
        assert run._previous_sigterm is not run._on_sigterm
        run.close()
    finally:
        signal.signal(signal.SIGTERM, before)


def test_record_mode_digests_when_asked(tmp_path: Path) -> None:
    run = probe.Run(record_env(tmp_path, **{Env.RECORD_DIGESTS: "1"}))
    run.checkpoint_saved(0, state={"model": {"w": 1}})
    run.close()
    events = [json.loads(line) for line in recorded_files(tmp_path)[0].read_text().splitlines()]
    save = next(e for e in events if e["ev"] == "ckpt_save")
    assert set(save["digest"]) == {"model"} and "undigested" not in save


def test_slurm_restart_count_and_the_attach_argument(tmp_path: Path) -> None:
    run = probe.Run({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1", "RANK": "0"},
                    record=tmp_path)
    run.close()
    start = json.loads(recorded_files(tmp_path)[0].read_text().splitlines()[0])
    assert (start["launcher"], start["restart"], start["job"]) == ("slurm", 1, "77")
    run = probe.Run({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "2", "RANK": "0"}, record=tmp_path)
    run.close()
    starts = [json.loads(p.read_text().splitlines()[0]) for p in recorded_files(tmp_path)]
    assert sorted(s["launch"] for s in starts) == [[0, 2, 0], [1, 0, 0]]


def test_a_folder_that_cannot_be_written_turns_recording_off(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = probe.Run(record_env(blocker / "sub"))
    assert not run.active and run.recording is None
    with run.step(0):
        pass
    run.close()
    assert "not recording" in capsys.readouterr().err


def test_without_the_variable_the_probe_stays_off(tmp_path: Path) -> None:
    run = probe.Run({"RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"})
    assert not run.active and run.recording is None


def test_attach_with_record_after_an_unrecorded_attach_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (Env.DIR, Env.RECORD, "TORCHELASTIC_RESTART_COUNT", "RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(probe, "_RUN", None)
    first = probe.attach()                 # a framework adapter, say
    assert not first.active
    run = probe.attach(record=tmp_path)
    assert run.recording == tmp_path and probe.attach() is run
    run.close()
    assert len(recorded_files(tmp_path)) == 1
