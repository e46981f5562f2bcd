"""Hypothesis strategies for schedules (valid by construction) and the suite profiles."""
import subprocess
import sys

import pytest

hypothesis = pytest.importorskip("hypothesis")



def test_plugin_imports_neither_hypothesis_nor_torch():
    code = ("import sys, pytest_reshard.plugin, pytest_reshard.schedule.strategies; "
            "print(sorted(m for m in ('torch', 'hypothesis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


PROFILE_TEST = """
from pytest_reshard.schedule import strategies
def test_p():
    print("ACTIVE", strategies.ACTIVE_PROFILE, strategies.profile().max_examples)
"""


def _profile_env(monkeypatch, env):
    if env is None:
        monkeypatch.delenv("RESHARD_PROFILE", raising=False)
    else:
        monkeypatch.setenv("RESHARD_PROFILE", env)


@pytest.mark.parametrize("args, env, ini, shown", [
    ([], None, "", "ci"),
    ([], None, "reshard_profile = nightly", "nightly"),
    ([], "nightly", "reshard_profile = ci", "nightly"),               # env beats ini
    (["--reshard-profile=ci"], "nightly", "reshard_profile = nightly", "ci"),  # command line wins
])
def test_profile_precedence_and_header(pytester, monkeypatch, args, env, ini, shown):
    _profile_env(monkeypatch, env)
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(PROFILE_TEST)
    result = pytester.runpytest_subprocess("-s", *args)
    result.stdout.fnmatch_lines([f"reshard: seed=0 *profile={shown} *",
                                 f"*ACTIVE {shown} {10 if shown == 'ci' else 50}"])
    assert result.ret == 0
