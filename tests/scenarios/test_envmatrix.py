"""The upgrade gate's pure parts: environment specs, planted regressions, container options,
the cross-stack checkpoint verdict, the report, and the CLI's early errors."""
import subprocess
import sys

import pytest

from pytest_reshard.gate.envs import EnvError, parse_env


def test_an_existing_venv_without_pytest_reshard_is_refused(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.base_prefix + "/bin/python3")
    with pytest.raises(EnvError, match="pytest-reshard is not installed there"):
        parse_env(f"venv:{tmp_path}").prepare(print)


@pytest.mark.parametrize("args, message", [
    (["--old", "venv:x", "--new", "venv:y", "--fail", "peak_mem:lots"], "write FIELD:+N"),
    (["--old", "conda:x", "--new", "venv:y"], "unknown environment kind 'conda'"),
    (["--old", "venv:x", "--new", "venv:y", "--plant", "memory=lots"], "write memory=N"),
])
def test_gate_cli_rejects_bad_input_before_running_anything(tmp_path, args, message):
    out = subprocess.run([sys.executable, "-m", "pytest_reshard.cli", "gate", *args], cwd=tmp_path,
                         check=False,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr
    assert not (tmp_path / ".reshard-gate").exists()
