"""The GitHub workflows pass actionlint (with shellcheck on their scripts when it is installed),
and every pytest-reshard option they pass exists."""
import re
from pathlib import Path


from pytest_reshard.plugin import OPTIONS

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def test_the_three_workflows_exist():
    assert sorted(p.name for p in WORKFLOWS.glob("*.yml")) == [
        "nightly-chaos.yml", "pr.yml", "upgrade-gate.yml"]


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
