import json
import os
import time
from pathlib import Path

import pytest

from pytest_reshard.supervisor import procfs as processes

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


def ports_of(run_dir):
    sup = Path(run_dir) / "events" / "supervisor.jsonl"
    return [e["port"] for e in map(json.loads, sup.read_text().splitlines()) if e["ev"] == "gen_start"]
