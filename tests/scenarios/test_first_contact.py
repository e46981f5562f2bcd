"""What a newcomer meets first: bad settings rejected at startup naming the option, artifacts that
never collide, and a replay command that works where pytest was started."""
import json
import os
import subprocess
import sys

import pytest
import torch  # here, not in a test: pytester's sys.modules snapshot would drop it after one

from pytest_reshard import chaos
from pytest_reshard.session import Session, lock_artifacts, scenario_from

from ..conftest import WORKLOADS

TOY = str(WORKLOADS / "toy_train.py")


def test_an_artifacts_path_that_is_a_file_is_a_usage_error(pytester):
    pytester.makefile(".txt", art="not a folder")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--reshard-artifacts=art.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--reshard-artifacts='art.txt': cannot write there*"])


def test_an_artifacts_folder_nobody_may_create_is_a_usage_error(pytester):
    pytester.makepyfile("def test_x(): pass")   # /proc refuses new folders, even to root
    result = pytester.runpytest_subprocess("--reshard-artifacts=/proc/reshard-art")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--reshard-artifacts='/proc/reshard-art': cannot write there*"])


def test_comparing_with_a_baseline_that_does_not_exist_fails_before_anything_runs(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--reshard-compare=nosuch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--reshard-compare='nosuch': no baseline*none is saved there*"])


def test_nccl_asked_for_by_name_without_a_gpu_is_an_error_not_a_skip(pytester):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--reshard-backend=nccl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--reshard-backend=nccl: no CUDA device is available here*"])


def test_a_second_session_on_the_same_artifacts_folder_is_refused(tmp_path):
    held = lock_artifacts(tmp_path / "art")
    try:
        code = ("import sys; from pathlib import Path; from pytest_reshard.session import Session\n"
                f"Session(Path({str(tmp_path / 'art')!r}))")
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60)
        assert other.returncode != 0
        assert "is in use by the pytest-reshard session of pid" in other.stderr, other.stderr
        assert "--reshard-artifacts=OTHER" in other.stderr
        with Session(tmp_path / "art"):  # the same process may: it is our own folder
            pass
    finally:
        held.close()
    Session(tmp_path / "art").close()  # released: free for anyone


def test_folders_are_unique_per_node_id_and_never_another_tests(tmp_path):
    with Session(tmp_path) as session:
        plus, under = session.run_dir_of("t.py::test_it[x+y]"), session.run_dir_of("t.py::test_it[x_y]")
        assert plus != under
        sc = scenario_from(TOY, world_size=2, steps=3)
        first = session.run(sc, "t.py::test_it[x_y]")
        assert session.run_dir_of("t.py::test_it[x_y]") == first.run_dir   # a rerun: its own
        # another name that sanitises to the same folder gets its own, and the first stays
        assert session.run_dir_of("t.py::test_it[x/y]") != first.run_dir
        assert (first.run_dir / "verdict.json").exists()
    rows = json.loads((first.run_dir / "verdict.json").read_text())
    assert rows["name"] == "t.py::test_it[x_y]"


@pytest.mark.nightly   # the CI budget: test_cli.py replays a saved scenario in CI
def test_the_replay_command_runs_from_where_pytest_was_started(pytester):
    sub = pytester.mkdir("suite")
    (sub / "test_one.py").write_text(f"""
import pytest
from pytest_reshard import chaos

@pytest.mark.reshard(world_size=2, steps=4, timeout=90)
def test_replayed(reshard_run):
    reshard_run({TOY!r}, faults=[chaos.shift_shards(to_world_size=1, at_step=1)]).assert_ok()
""")
    result = pytester.runpytest_subprocess("suite/test_one.py", "--rootdir=suite",
                                           "--reshard-artifacts=art")
    result.assert_outcomes(passed=1)
    (replay,) = [p.read_text().strip() for p in (pytester.path / "art").rglob("replay.txt")]
    assert replay.startswith("pytest suite/test_one.py::test_replayed --rootdir=suite"), replay
    again = subprocess.run([sys.executable, "-m", *replay.split(), "--reshard-artifacts=art2", "-q"],
                           cwd=pytester.path,
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": ""})
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 passed" in again.stdout


def test_the_reference_cache_serves_a_later_session_until_the_script_changes(tmp_path):
    script = tmp_path / "train.py"
    script.write_text((WORKLOADS / "toy_train.py").read_text())
    (tmp_path / "helper_module.py").write_text("X = 1\n")
    script.write_text(script.read_text().replace("import torch\n", "import torch\nimport helper_module  # noqa\n", 1))
    sc = scenario_from(str(script), world_size=2, steps=4,
                       faults=[chaos.shift_shards(to_world_size=1, at_step=1)])

    def session_run(name):
        said = []
        with Session(tmp_path / name, progress=said.append,
                     reference_cache=tmp_path / "cache") as session:
            session.run(sc, "t").assert_ok()
        return [m for m in said if m.startswith("reference run")]

    assert len(session_run("first")) == 2          # the clean runs at 2 and 1 ranks
    assert session_run("second") == []             # both from the cache
    (tmp_path / "helper_module.py").write_text("X = 2\n")   # a module the script imports
    assert len(session_run("third")) == 2          # invalid: they run again
