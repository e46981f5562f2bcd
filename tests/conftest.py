import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_reshard import procfs as processes

pytest_plugins = ["pytester"]
WORKLOADS = Path(__file__).parent / "workloads"


@pytest.fixture
def toy():
    return str(WORKLOADS / "toy_train.py")


@pytest.fixture(autouse=True)
def nothing_leaks(request):
    """After every test: no rank we started is alive (the session's warm fork server may be)."""
    yield
    deadline = time.monotonic() + 10
    while processes.leaked_ranks(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = processes.leaked_ranks(os.getpid())
    assert not left, f"processes still alive after {request.node.nodeid}: {left}"


def until(done, timeout: float, what: str) -> None:
    """Wait for ``done()``, at most ``timeout`` seconds (then fail saying ``what``)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.01)


def text_of(path: Path) -> str:
    """A file's text, or "" while it does not exist yet."""
    try:
        return path.read_text()
    except OSError:
        return ""


def harness_training(tmp_path: Path, run: Path, scenario: str, ranks: int) -> subprocess.Popen:
    """A harness in a process of its own running ``scenario_from(<scenario>)`` into ``run``,
    returned once every one of its ``ranks`` began a step (for a test that kills it)."""
    code = ("from pathlib import Path\nfrom pytest_reshard.session import Session, scenario_from\n"
            f"with Session(Path({str(tmp_path / 'art')!r})) as s:\n"
            f"    s.execute(scenario_from({scenario}), Path({str(run)!r}))\n")
    harness = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        until(lambda: all('"ev":"begin"' in text_of(run / "events" / f"g0-r{r}.jsonl")
                          for r in range(ranks)), 120, "every rank trained")
    except BaseException:
        harness.kill()
        harness.wait(timeout=30)
        raise
    return harness


def ports_of(run_dir):
    sup = Path(run_dir) / "events" / "supervisor.jsonl"
    return [e["port"] for e in map(json.loads, sup.read_text().splitlines()) if e["ev"] == "gen_start"]


# -- a real SLURM cluster ---------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
SLURM_ENV = ("SLURM_CONF", "PATH", "RESHARD_SLURM_DIR", "RESHARD_SLURM_NODES", "RESHARD_SLURM_ADDRS",
             "RESHARD_SLURM_HEAD", "RESHARD_SLURM_CONTROLLER", "RESHARD_SLURM_IFNAME")


def _exports(text: str) -> dict[str, str]:
    """``export A=1 B='x y'`` lines, as the .ci scripts print them."""
    import shlex

    found = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            found.update(word.split("=", 1) for word in words[1:] if "=" in word)
    return found


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """Two namespaced slurmd nodes: the cluster ``.ci/run`` started (its exports are in the
    environment), else one this session starts and stops with ``.ci/slurm-cluster`` (root and
    apt needed). Skips with the reason where none can run, fails under RESHARD_SLURM_REQUIRED=1."""
    import subprocess

    started = None
    if not (os.environ.get("RESHARD_SLURM_DIR") and os.environ.get("SLURM_CONF")):
        why = os.environ.get("RESHARD_SLURM_UNAVAILABLE")
        if not why:
            started = tmp_path_factory.mktemp("slurm")
            done = subprocess.run([str(ROOT / ".ci" / "slurm-cluster"), "start", str(started), "2"],
                                  capture_output=True, text=True, timeout=900)
            exports = _exports(done.stdout)
            why = exports.get("RESHARD_SLURM_UNAVAILABLE") or (
                done.returncode and f"exit {done.returncode}: {done.stderr.strip()[-500:]}")
        if why:
            if os.environ.get("RESHARD_SLURM_REQUIRED") == "1":
                pytest.fail(f"RESHARD_SLURM_REQUIRED=1 but no SLURM cluster could start: {why}")
            pytest.skip(f"no SLURM cluster: {why} (.ci/run starts one with .ci/slurm-cluster)")
        saved = {k: os.environ.get(k) for k in SLURM_ENV}
        os.environ.update({k: v for k, v in exports.items() if k in SLURM_ENV})
    try:
        yield os.environ["RESHARD_SLURM_DIR"]
    finally:
        if started is not None:
            subprocess.run([str(ROOT / ".ci" / "slurm-cluster"), "stop", str(started)],
                           capture_output=True, timeout=120)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
