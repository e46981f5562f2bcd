"""The pytest plugin, tested as users meet it: through pytester runs."""

import pytest


@pytest.mark.parametrize("ask", ["--fixtures", "--fixtures-per-test", "--collect-only",
                                 "--markers"])
def test_a_run_that_runs_nothing_makes_no_artifacts_folder(pytester, ask):
    pytester.makepyfile("def test_x(): pass")
    assert pytester.runpytest(ask).ret == 0
    assert not (pytester.path / "reshard-artifacts").exists()
    pytester.runpytest().assert_outcomes(passed=1)               # and a real run makes it
    assert (pytester.path / "reshard-artifacts").is_dir()


def test_markers_are_documented(pytester):
    result = pytester.runpytest("--markers")
    for marker in ("@pytest.mark.reshard(world_size=4, steps=20", "@pytest.mark.chaos",
                   "@pytest.mark.gpu(count=1)", "@pytest.mark.nightly"):
        result.stdout.fnmatch_lines([f"{marker}*"])


def test_options_have_help_and_ini_twins(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["pytest-reshard: chaos tests*", "*--reshard-artifacts=*", "*--reshard-timeout=*",
                                 "*--reshard-seed=*", "*--reshard-backend=*", "*reshard_backend (string)*"])


def test_header_shows_seed_and_backend(pytester):
    pytester.makeini("[pytest]\nreshard_seed = 7\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--reshard-backend=gloo")
    result.stdout.fnmatch_lines(["reshard: seed=7 backend=gloo launcher=fork*"])


@pytest.mark.parametrize("args, ini, message", [
    (["--reshard-backend=mpi"], "", "*--reshard-backend='mpi': choose one of auto, gloo, nccl*"),
    ([], "reshard_timeout = -1", "*ini reshard_timeout='-1': expected a positive number*"),
    (["--reshard-seed=abc"], "", "*--reshard-seed='abc': expected a integer or last*"),
])
def test_bad_settings_are_rejected_naming_their_source(pytester, args, ini, message):
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_every_registered_launcher_is_accepted_and_others_are_refused_naming_them(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--reshard-launcher=elastic")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["reshard: *launcher=elastic*"])
    result = pytester.runpytest("--reshard-launcher=nosuch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--reshard-launcher='nosuch': choose one of elastic, fork, "
                                 "local, slurm, slurm-fork, torchrun*"])


def test_a_users_registered_launcher_is_accepted(pytester, monkeypatch):
    from pytest_reshard.supervisor import launch

    monkeypatch.setattr(launch, "_LAUNCHERS", dict(launch._LAUNCHERS))  # registered for this test
    pytester.makeconftest("""
        from pytest_reshard.supervisor import launch
        from pytest_reshard.supervisor.launch.fork import ForkLauncher

        class Mine(ForkLauncher):
            name = "mine"

        launch.register("mine", "conftest:Mine")
    """)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--reshard-launcher=mine")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["reshard: *launcher=mine*"])
