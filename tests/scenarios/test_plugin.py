"""The pytest plugin, tested as users meet it: through pytester runs."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pytest_reshard import procfs as processes
from pytest_reshard.supervisor.launch.forkserver import die_with_parent

from ..conftest import WORKLOADS


def test_gpu_and_nightly_markers_skip_with_reasons(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.gpu(2)
        def test_gpu(): pass
        @pytest.mark.nightly
        def test_nightly(): pass
    """)
    result = pytester.runpytest_subprocess("-rs")  # the gpu marker imports torch: not in this process
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*needs 2 CUDA device(s), found 0*",
                                 "*nightly chaos run: pass --reshard-nightly*"])


def test_reshard_run_reports_table_artifacts_and_properties(pytester):
    pytester.makepyfile(f"""
        import pytest
        from pytest_reshard import chaos

        @pytest.mark.reshard(world_size=3, steps=8, timeout=90)
        def test_train(reshard_run):
            result = reshard_run({str(WORKLOADS / "toy_train.py")!r},
                                 faults=[chaos.shift_shards(to_world_size=2, at_step=3)])
            result.assert_ok()
    """)
    summary = pytester.path / "summary.md"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GITHUB_STEP_SUMMARY", str(summary))
        result = pytester.runpytest_subprocess("--junitxml=junit.xml", "--reshard-artifacts=art")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*reshard verdicts*", "scenario*faults*rewind*loss*samples*state*live*wall s",
                                 "test_train*shift_shards(all) at step 3*pass*pass*pass*pass*pass*"])
    run_dir = pytester.path / "art" / "test_reshard_run_reports_table_artifacts_and_properties.py__test_train"
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["status"] == "pass" and set(verdict["checks"]) >= {"no_rewind", "liveness"}
    assert "--reshard-seed=0" in (run_dir / "replay.txt").read_text()
    assert list((run_dir / "events").glob("g1-r*.jsonl"))
    assert "| test_train | shift_shards(all) at step 3" in summary.read_text()
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="reshard_verdict" value="pass"' in junit
    assert 'name="reshard_schedule_hash"' in junit


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_interrupting_pytest_leaves_no_rank_behind(tmp_path, sig):
    """Ctrl-C or SIGKILL pytest mid-scenario: cleanup, PDEATHSIG and the probe's watchdog end
    every rank."""
    (tmp_path / "test_long.py").write_text(f"""
import pytest
@pytest.mark.reshard(world_size=3, steps=100000, timeout=300)
def test_long(reshard_run):
    reshard_run({str(WORKLOADS / "toy_train.py")!r}, stall_s=300)
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}

    def child() -> None:
        die_with_parent()   # even if this test's own runner is killed
        # Python handles Ctrl-C only if SIGINT is not ignored when it starts, and a run started
        # in the background by a shell (nohup CMD &) ignores it: pytest would never see it
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "--reshard-artifacts=art", "test_long.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=child)
    try:
        events = tmp_path / "art" / "test_long.py__test_long" / "events"
        deadline = time.monotonic() + 60
        while not (len(list(events.glob("g0-r*.jsonl"))) == 3 and
                   all(b'"ev":"end"' in p.read_bytes() for p in events.glob("g0-r*.jsonl"))):
            assert time.monotonic() < deadline, "the scenario never started training"
            assert proc.poll() is None, "pytest exited before the scenario started"
            time.sleep(0.05)
        ours = processes.started_by(proc.pid)
        assert len(ours) >= 4  # fork server + 3 ranks
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while processes.started_by(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes.started_by(proc.pid) == []


def test_plugin_and_probe_do_not_import_torch():
    code = ("import sys, pytest_reshard.plugin, pytest_reshard.probe, pytest_reshard.session; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_seed_last_reuses_the_previous_run(pytester):
    pytester.makepyfile("def test_x(): pass")
    first = pytester.runpytest_subprocess("--reshard-seed=41")
    first.stdout.fnmatch_lines(["reshard: seed=41 *"])
    again = pytester.runpytest_subprocess("--reshard-seed=last")
    again.stdout.fnmatch_lines(["reshard: seed=41 *"])
    empty = pytester.runpytest_subprocess("--reshard-seed=last", "-p", "no:cacheprovider")
    empty.stderr.fnmatch_lines(["*--reshard-seed=last: no previous seed is recorded*"])
