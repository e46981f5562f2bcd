"""The upgrade gate's pure parts: environment specs, planted regressions, container options,
the cross-stack checkpoint verdict, the report, and the CLI's early errors."""
from pathlib import Path

import pytest

from pytest_reshard.checkpoints import compat as ckptcompat
from pytest_reshard.gate import envs as envmatrix
from pytest_reshard.gate import stacks as upgrade_gate
from pytest_reshard.gate.envs import DockerEnv, EnvError, VenvEnv, parse_env


def test_environment_specs(tmp_path):
    env = parse_env(f"venv:{tmp_path}")
    assert isinstance(env, VenvEnv) and env.path == tmp_path and not env.requirements
    built = parse_env("venv:torch==2.14.1, numpy<2", root=tmp_path)
    assert built.requirements == ["torch==2.14.1", "numpy<2"] and built.path is None
    wheel = "torch @ file:///wheels/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert parse_env(f"venv:{wheel}", root=tmp_path).requirements == [wheel]  # not a folder
    image = parse_env("docker:ghcr.io/org/train:cu130#/opt/venv/bin/python", mounts=[tmp_path])
    assert isinstance(image, DockerEnv) and image.image == "ghcr.io/org/train:cu130"
    assert image.python == "/opt/venv/bin/python" and image.mounts == [tmp_path]
    assert parse_env("docker:reshard-ci:local").python == "python3"


@pytest.mark.parametrize("spec, message", [
    ("venv:", "write venv:PATH"),
    ("conda:torch", "unknown environment kind 'conda'"),
    ("venv:/no/such/venv", "no folder /no/such/venv"),
])
def test_bad_environment_specs_say_what_to_write(spec, message):
    with pytest.raises(EnvError, match=message):
        parse_env(spec)


def test_container_options_host_network_mounts_and_gpus(tmp_path):
    env = DockerEnv("docker:img", image="img", mounts=[tmp_path], gpus="none")
    opts = env.container_options(["-m", "x"], cwd=tmp_path, env={"A": "1"})
    assert opts["network_mode"] == "host" and opts["ipc_mode"] == "host" and opts["init"]
    assert opts["command"] == ["python3", "-m", "x"] and opts["working_dir"] == str(tmp_path)
    assert opts["volumes"][str(tmp_path)] == {"bind": str(tmp_path), "mode": "rw"}
    src = envmatrix.source_tree()
    assert src is not None and opts["volumes"][str(src)] == {"bind": str(src), "mode": "ro"}
    assert opts["environment"]["A"] == "1" and "device_requests" not in opts
    pytest.importorskip("docker", reason="the docker SDK (pytest-reshard[docker]) is not installed")
    env.gpus = "all"
    (request,) = env.container_options([], cwd=tmp_path, env={})["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]


def test_planted_regression():
    plant = upgrade_gate.parse_plant("memory=200MB, step_time=50ms")
    assert plant == {"memory": 200 * 2**20, "step_time": pytest.approx(0.05)}
    faults = upgrade_gate.planted_faults(plant, [(0, 5), (5, 7)])
    assert [(f.kind, f.target, f.step) for f in faults] == [
        ("memory_pressure", "all", 0), ("slow_rank", "all", 0),
        ("memory_pressure", "all", 5), ("slow_rank", "all", 5)]
    assert faults[3].params["steps"] == 7 and faults[3].params["delay_ms"] == pytest.approx(50)
    for bad in ("memory=lots", "latency=5ms", "memory=5ms"):
        with pytest.raises(ValueError, match="write memory=N"):
            upgrade_gate.parse_plant(bad)


SAVED = {"step": 5, "world_size": 4, "environment": {"torch": "2.13.0+cpu"},
         "digest": {"model": "m1", "optimizer": "o1", "rng": "r1"}}


def test_checkpoint_verdict_names_what_differs():
    new = {"torch": "2.14.1"}
    ok = ckptcompat.judge(SAVED, dict(SAVED["digest"]), loaded_world=3, finished=True,
                          why_not="", new_env=new)
    assert ok["status"] == "pass" and "written by torch 2.13.0+cpu at world size 4, loaded by " \
        "torch 2.14.1 at world size 3: 3 of 3 components equal" in ok["message"]
    bad = ckptcompat.judge(SAVED, {**SAVED["digest"], "optimizer": "o2"}, loaded_world=3,
                           finished=True, why_not="", new_env=new)
    assert bad["status"] == "fail" and bad["differ"] == ["optimizer"]
    assert "optimizer o1 -> o2" in bad["message"]
    fresh = ckptcompat.judge(SAVED, None, loaded_world=3, finished=True, why_not="", new_env=new)
    assert fresh["status"] == "fail" and "no load was recorded" in fresh["message"]
    died = ckptcompat.judge(SAVED, dict(SAVED["digest"]), loaded_world=3, finished=False,
                            why_not="rank 2 died", new_env=new)
    assert died["status"] == "fail" and "rank 2 died" in died["message"]


def _baseline(path: Path, torch: str, peak_mb: int, step_s: float) -> None:
    import json

    mb = 2**20
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": {"torch": torch}, "runs": {"u.py::t[steady]": {
        "peak_mem": peak_mb * mb, "memory_budget": 2048 * mb, "step_time": step_s,
        "peak_mem_by_rank": {"0": peak_mb * mb, "1": 290 * mb}, "loss_digest": "ab"}}}))


def test_report_fails_naming_field_and_amount(tmp_path):
    _baseline(tmp_path / "b" / "old.json", "2.13.0+cpu", 294, 0.120)
    _baseline(tmp_path / "b" / "new.json", "2.14.1", 494, 0.175)
    stacks = [upgrade_gate.StackRun("old", VenvEnv("venv:a"), 0),
              upgrade_gate.StackRun("new", VenvEnv("venv:b"), 0)]
    lines: list[str] = []
    rc = upgrade_gate.report(stacks, tmp_path / "b", upgrade_gate.gate.parse(
        "peak_mem:+150MB,step_time:+10%"), {"status": "pass", "message": "equal"}, tmp_path,
        lines.append)
    text = "\n".join(lines)
    assert rc == 1 and "gate: FAIL (2 regression(s), 0 other failure(s))" in text
    assert "REGRESSED u.py::t[steady]: rank 0 headroom fell from 1754 MB to 1554 MB (-200 MB" \
        in text and "beyond peak_mem:+150MB" in text
    assert "median step time (rank 0) 120.0 ms -> 175.0 ms (+55.0 ms, +45.8%), beyond " \
        "step_time:+10%" in text
    assert (tmp_path / "report.json").exists() and "**FAIL**" in (tmp_path / "report.md").read_text()
    _baseline(tmp_path / "b" / "new.json", "2.14.1", 300, 0.121)
    lines.clear()
    assert upgrade_gate.report(stacks, tmp_path / "b", upgrade_gate.gate.parse(
        "peak_mem:+150MB,step_time:+10%"), None, tmp_path, lines.append) == 0
    assert lines[-1].startswith("gate: PASS")
