"""The console script: suites, replay, and clear errors."""
import subprocess
import sys

from pytest_reshard import cli


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pytest_reshard.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_bundled_suites_are_listed_and_collect(tmp_path):
    assert {"catalog", "dflash", "files", "nightly", "smoke", "upgrade"} <= set(cli.suites())
    for suite, tests in (("smoke", ["test_lm_survives[", "test_dflash_survives["]),
                         ("catalog", ["test_lm_survives["]), ("dflash", ["test_dflash_survives["]),
                         ("upgrade", ["test_lm_upgrade["])):
        out = run_cli(suite, "--", "--collect-only", "-q", cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert all(t in out.stdout for t in tests), out.stdout


def test_unknown_suite_and_missing_replay_say_what_to_do(tmp_path):
    out = run_cli("nosuch", cwd=tmp_path)
    assert out.returncode == 2 and "bundled suites: catalog, dflash, files, nightly, smoke, upgrade" \
        in out.stderr
    out = run_cli("replay", str(tmp_path / "nothing.json"), cwd=tmp_path)
    assert out.returncode == 2 and "pass a scenario.json" in out.stderr
    out = run_cli("sweep", str(tmp_path / "train.py"), cwd=tmp_path)
    assert out.returncode == 2 and "pass the training script to sweep" in out.stderr


def test_replay_reruns_a_saved_scenario(tmp_path, toy):
    from pytest_reshard import chaos
    from pytest_reshard.session import Session, scenario_from

    sc = scenario_from(toy, world_size=2, steps=6, faults=[chaos.kill(rank=1, at_step=3)])
    with Session(tmp_path / "first") as s:
        first = s.run(sc, "first")
    out = run_cli("replay", str(first.run_dir / "scenario.json"), "--artifacts",
                  str(tmp_path / "again"), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kill(rank:1) at step 3 backward" in out.stdout and "FAIL" not in out.stdout
    assert f"report: {tmp_path / 'again'}" in out.stdout  # replay-<hash>/report.html
