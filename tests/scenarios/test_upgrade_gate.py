"""``pytest-reshard gate`` end to end: real stacks, real processes, a real Docker engine.

Both run a small suite of the toy workload (a user's script), so each stack costs seconds; the
bundled ``upgrade`` suite and the torch 2.13.0 vs 2.14.1 demo are in docs/guide/regression-gate.md.
"""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_reshard.gate import envs as envmatrix

from ..conftest import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
TOY_SUITE = '''
import os
import pytest
from pytest_reshard.gate.stacks import PLANT_ENV, parse_plant, planted_faults

@pytest.mark.reshard(world_size={world_size}, steps=6, timeout=90)
def test_toy(reshard_run):
    faults = planted_faults(parse_plant(os.environ.get(PLANT_ENV, "")), [(0, 6)])
    reshard_run({toy!r}, faults=faults, memory_budget_bytes=2**30).assert_ok()
'''
PLANT = ["--plant", "memory=200MB,step_time=150ms", "--fail", "peak_mem:+150MB,step_time:+50ms"]


def gate(tmp_path, *args, world_size=2, timeout=300):
    workdir = tmp_path / "gate"
    workdir.mkdir(exist_ok=True)
    suite = workdir / "toy_suite.py"   # inside the gate's folder: a container sees it there
    suite.write_text(TOY_SUITE.format(world_size=world_size, toy=str(WORKLOADS / "toy_train.py")))
    out = subprocess.run([sys.executable, "-m", "pytest_reshard.cli", "gate", "--suite", str(suite),
                          "--dir", str(workdir), *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=timeout, check=False)
    return out.returncode, out.stdout + out.stderr


def assert_planted_regressions_named(rc, text):
    assert rc == 1, text
    lines = text.splitlines()
    assert any("with a planted regression (memory=200MB,step_time=150ms)" in ln for ln in lines)
    room = [ln for ln in lines if ln.startswith("REGRESSED") and "headroom fell from" in ln]
    assert room and "under its 1024 MB budget, beyond peak_mem:+150MB" in room[0], text
    step = [ln for ln in lines if ln.startswith("REGRESSED") and "median step time" in ln]
    assert step and "beyond step_time:+50ms" in step[0], text
    assert "gate: FAIL (2 regression(s), 0 other failure(s))" in text
    ran = next(ln for ln in lines if ln.startswith("ranks ran in"))
    assert ran.count("cold interpreters") == 2, ran   # the stack's memory, not the harness's


def test_planted_regression_fails_the_gate_naming_field_and_amount(tmp_path):
    """The same venv twice (one rank, to stay cheap); the new stack holds 200 MB more per rank
    and sleeps 150 ms a step."""
    rc, text = gate(tmp_path, "--old", f"venv:{sys.prefix}", "--new", f"venv:{sys.prefix}",
                    "--no-checkpoint", *PLANT, world_size=1)
    assert_planted_regressions_named(rc, text)


PRELOADING_SUITE = '''
from pathlib import Path
import pytest
from pytest_reshard.workloads import WorkloadSpec, register

# The new stack's fork server imports a model library besides the warm-up: a harness that
# preloads more. Ranks forked from it would map all of that.
MORE = ("transformers.models.gpt2.modeling_gpt2",) if Path.cwd().name == "new" else ()
register(WorkloadSpec(name="toy", script={toy!r}, preload=MORE), replace=True)


@pytest.mark.reshard(world_size=1, steps=4, timeout=90)
def test_toy(reshard_run):
    reshard_run("toy").assert_ok()
'''


@pytest.mark.nightly   # every PR's planted-regression gate says its ranks ran cold
def test_a_harness_that_preloads_more_does_not_move_the_gates_memory(tmp_path):
    """The same venv twice, the new stack's fork server preloading a model library too: the
    gate's ranks are cold interpreters, so their memory is the stack's, and stays within 10%."""
    pytest.importorskip("transformers")
    workdir = tmp_path / "gate"
    workdir.mkdir()
    suite = workdir / "preloading_suite.py"
    suite.write_text(PRELOADING_SUITE.format(toy=str(WORKLOADS / "toy_train.py")))
    out = subprocess.run([sys.executable, "-m", "pytest_reshard.cli", "gate", "--suite", str(suite),
                          "--dir", str(workdir), "--old", f"venv:{sys.prefix}", "--new",
                          f"venv:{sys.prefix}", "--no-checkpoint", "--fail", "peak_mem:+10%"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    text = out.stdout + out.stderr
    assert "gate: PASS" in text and out.returncode == 0, text
    ran = next(ln for ln in text.splitlines() if ln.startswith("ranks ran in"))
    assert ran.count("cold interpreters") == 2, ran


@pytest.fixture(scope="session")
def ci_image():
    """A local image of this test run's own stack, imported into the engine at DOCKER_HOST."""
    try:
        client = envmatrix.docker_client()
    except envmatrix.EnvError as e:
        if os.environ.get("RESHARD_DOCKER_REQUIRED") == "1":
            pytest.fail(f"RESHARD_DOCKER_REQUIRED=1 but {e}")
        pytest.skip(f"no Docker engine could be started or reached: {e} (.ci/run starts a "
                    "private one with .ci/docker-engine)")
    import docker
    import torch

    key = hashlib.sha256(f"{sys.prefix}:{torch.__version__}".encode()).hexdigest()[:10]
    tag = f"reshard-ci:{key}"
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        cli = shutil.which("docker")
        if cli is None:
            pytest.fail("the docker CLI is needed to import the CI image (docker import)")
        rootfs = subprocess.Popen([sys.executable, str(ROOT / ".ci" / "rootfs.py"), sys.prefix],
                                  stdout=subprocess.PIPE)
        try:
            subprocess.run([cli, "import", "--change", "ENV PATH=/opt/venv/bin:/usr/bin:/bin",
                            "-", tag], stdin=rootfs.stdout, check=True, capture_output=True,
                           timeout=300)
        finally:
            rootfs.stdout.close()
            assert rootfs.wait(timeout=60) == 0
    return client, tag


@pytest.mark.nightly   # the CI budget (building the image is 40 s): the venv gate runs in CI
def test_docker_backend_runs_the_gate_against_a_real_engine(tmp_path, ci_image):
    """Old stack in a container (host networking, the checkout mounted read-only), new stack in
    this venv with a planted regression: both named; the container's checkpoint, written at 4
    ranks, loads at 3 ranks here with every component equal; no container is left."""
    client, tag = ci_image
    rc, text = gate(tmp_path, "--old", f"docker:{tag}", "--new", f"venv:{sys.prefix}", *PLANT)
    assert_planted_regressions_named(rc, text)
    assert "checkpoint written by old, loaded by new: PASS" in text, text
    executable = next(ln for ln in text.splitlines() if ln.startswith("executable"))
    assert "/opt/venv/bin/python3" in executable and sys.prefix in executable  # old: the image
    assert client.containers.list(all=True, filters={"label": "pytest-reshard=gate"}) == []
