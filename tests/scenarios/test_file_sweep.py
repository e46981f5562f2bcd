"""The file-event sweep end to end, on real processes and real files.

- (The bundled LM's DCP save and the pipeline's save, killed at every file event, are the ``files``
  suite: ``pytest-reshard files``, which the nightly workflow runs.)
- A user's script (``workloads/ckpt_train.py``) with a correct atomic save passes its sweep; each of
  its four planted bugs fails ``crash_consistency`` with the message that names it.
- The plugin's matrix, ``sweep.json`` and the smallest failing point's replay command.
"""
import json

import pytest
import torch  # noqa: F401 - imported once here, not in each rank's first test

from pytest_reshard import chaos
from pytest_reshard.session import scenario_from
from pytest_reshard.sweep import record

SCRIPT = "../workloads/ckpt_train.py"


@pytest.mark.reshard(workload=SCRIPT, world_size=2, steps=8, args=["--save", "atomic"])
@pytest.mark.reshard_sweep()
def test_an_atomic_user_save_survives_a_crash_at_every_file_event(reshard_run, file_point):
    file_point.judge(reshard_run(faults=[file_point.fault()]))


def crash_point(tmp_path, mode, pick):
    """The first crash point of the ckpt_train save in ``mode`` that ``pick`` accepts."""
    from pathlib import Path

    script = str(Path(__file__).parent / SCRIPT)
    scenario = scenario_from(script, world_size=2, steps=8, args=["--save", mode])
    points = record(scenario, tmp_path / "record")
    chosen = [p for p in points if pick(p)]
    assert chosen, [p.id for p in points]
    return chosen[0]


@pytest.mark.parametrize("mode, pick, expected", [
    ("inplace", lambda p: p.mode == "torn" and p.path.endswith("model.pt"),
     ["the job could not start again: generation 1 read `ckpt-train/model.pt`, torn",
      "killed after"]),
    ("latest_first", lambda p: p.op == "rename" and p.path.endswith(".metadata.tmp"),
     ["read `ckpt-train/latest` and then `ckpt-train/step_4/.metadata`, which did not exist",
      "killed before `rename ckpt-train/step_4/.metadata.tmp"]),
    ("prune_first", lambda p: p.op == "mkdir",
     ["no checkpoint was complete when generation 0 ended",
      "`ckpt-train/step_2/` (3 files) removed by `rmtree ckpt-train/step_2` in step 3",
      "started from scratch"]),
], ids=["inplace", "latest_first", "prune_first"])
def test_a_planted_checkpoint_bug_fails_at_its_crash_point(reshard_run, tmp_path, mode, pick,
                                                          expected):
    point = crash_point(tmp_path, mode, pick)
    result = reshard_run(SCRIPT, world_size=2, steps=8, args=["--save", mode],
                         faults=[point.fault()])
    v = result.verdicts["crash_consistency"]
    assert v.status == "fail", v.message
    for words in expected:
        assert words in v.message, v.message


def test_an_async_save_not_awaited_before_a_planned_exit_fails(reshard_run):
    result = reshard_run(SCRIPT, world_size=2, steps=8, args=["--save", "async_unawaited"],
                         files=True,   # record file events: crash_consistency judges any run
                         faults=[chaos.shift_shards(to_world_size=1, at_step=4, phase="optimizer",
                                                    notice_s=20)])
    v = result.verdicts["crash_consistency"]
    assert v.status == "fail", v.message
    assert "ended as planned (reshard) after its save of step" in v.message
    assert "/.done` missing" in v.message
    assert result.verdicts["no_rewind"].status == "fail"


def test_the_sweep_prints_its_matrix_and_the_smallest_failing_point(pytester):
    from pathlib import Path

    script = Path(__file__).parent / SCRIPT
    pytester.makepyfile(test_user_sweep=f'''
        import pytest

        @pytest.mark.reshard(workload={str(script)!r}, world_size=2, steps=8,
                             args=["--save", "inplace"])
        @pytest.mark.reshard_sweep()
        def test_save(reshard_run, file_point):
            file_point.judge(reshard_run(faults=[file_point.fault()]))
    ''')
    art = pytester.path / "art"
    out = pytester.runpytest_subprocess(f"--reshard-artifacts={art}", "-p", "no:cacheprovider",
                                        "-k", "e01-before-open or torn-write")
    out.assert_outcomes(passed=1, failed=1)
    text = out.stdout.str()
    assert "reshard file-event sweeps" in text
    assert "2 crash points: 1 as they must be, 1 not" in text
    assert "smallest failing point: test_user_sweep.py::test_save[s3-e02-torn-write-model.pt]" \
        in text
    assert "replay: pytest 'test_user_sweep.py::test_save[s3-e02-torn-write-model.pt]'" in text
    matrix = json.loads((art / "sweep.json").read_text())
    assert [(p["event"], p["mode"], p["ok"]) for p in matrix] == [(1, "before", True),
                                                                 (2, "torn", False)]
    assert (art / "sweep.html").read_text().count("<tr>") == 3   # a header and two points


def test_file_point_without_a_scenario_is_a_usage_error(pytester):
    pytester.makepyfile(test_bad='''
        def test_save(reshard_run, file_point):
            pass
    ''')
    out = pytester.runpytest_subprocess(f"--reshard-artifacts={pytester.path / 'art'}")
    assert out.ret != 0
    assert "file_point needs the scenario it sweeps" in out.stdout.str() + out.stderr.str()


@pytest.mark.nightly   # the CI budget: the sweep above records its scenario from its test's marker
def test_the_sweep_records_its_scenario_from_the_modules_marker_too(pytester):
    """A module's ``pytestmark`` sets the size and length, the test's own marker the workload: the
    recording runs the scenario both make, as ``reshard_run`` does."""
    from pathlib import Path

    script = Path(__file__).parent / SCRIPT
    pytester.makepyfile(test_user_sweep=f'''
        import pytest

        pytestmark = pytest.mark.reshard(world_size=2, steps=6)

        @pytest.mark.reshard(workload={str(script)!r}, args=["--save", "atomic"])
        def test_save(reshard_run, file_point):
            pass
    ''')
    art = pytester.path / "art"
    out = pytester.runpytest_subprocess(f"--reshard-artifacts={art}", "-p", "no:cacheprovider",
                                        "--collect-only", "-q")
    assert out.ret == 0, out.stdout.str()
    (scenario,) = art.glob("_sweeps/*/run/scenario.json")
    recorded = json.loads(scenario.read_text())
    assert (recorded["world_size"], recorded["steps"]) == (2, 6), recorded
