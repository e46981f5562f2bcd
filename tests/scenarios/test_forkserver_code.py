"""The fork server compiles a rank's code once and forks several ranks per request.

A rank must still see what ``python -m module`` or ``python script.py`` shows it (its
``__main__``, ``__file__``, ``__spec__``, ``sys.argv``, and no warning a cold interpreter does
not print), and an edited script or module must run as edited. Real forked processes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

MODULE = '''
import sys


def main():
    me = sys.modules["__main__"]
    print("name", __name__, "is_main", me.__dict__ is globals())
    print("file", __file__ == sys.argv[0], __file__.endswith("h19mod.py"))
    print("spec", __spec__.name, "package", repr(__package__))
    print("argv", sys.argv[1:])
    print("VERSION", VERSION)


VERSION = 1
if __name__ == "__main__":
    main()
'''

SCRIPT = '''
import sys
print("script", __name__, __file__.endswith("h19script.py"), sys.argv[1:], "VERSION", VERSION)
'''


def _wait(server, pids: list[int]) -> dict[int, int]:
    deadline = time.monotonic() + 60
    while not all(p in server.poll() for p in pids):
        assert time.monotonic() < deadline, "a forked rank did not exit"
        time.sleep(0.01)
    return {p: server.poll()[p] for p in pids}


@pytest.fixture
def server(tmp_path, monkeypatch):
    from pytest_reshard.supervisor.launch.forkserver import ForkServer
    from pytest_reshard.workloads import WARMUP

    (tmp_path / "h19mod.py").write_text(MODULE.replace("VERSION = 1", "VERSION = 1"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    s = ForkServer((WARMUP, "h19mod"))
    yield s
    s.close()


def test_a_module_runs_as_python_dash_m_runs_it_and_as_edited(server, tmp_path):
    env = dict(os.environ)
    logs = [tmp_path / f"m{i}.log" for i in range(3)]
    pids = server.spawn_many([(["-m", "h19mod", f"--rank={i}"], env, str(tmp_path), log)
                              for i, log in enumerate(logs)])
    assert len(set(pids)) == 3
    assert set(_wait(server, pids).values()) == {0}
    cold = subprocess.run([sys.executable, "-m", "h19mod", "--rank=0"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert logs[0].read_text() == cold.stdout + cold.stderr  # no runpy warning, same globals
    assert "argv ['--rank=2']" in logs[2].read_text()
    # Edited after the server compiled it: the rank runs the new source.
    (tmp_path / "h19mod.py").write_text(MODULE.replace("VERSION = 1", "VERSION = 22"))
    log = tmp_path / "edited.log"
    (pid,) = server.spawn_many([(["-m", "h19mod"], env, str(tmp_path), log)])
    assert _wait(server, [pid]) == {pid: 0}
    assert "VERSION 22" in log.read_text()


def test_a_script_is_compiled_once_and_recompiled_when_edited(server, tmp_path):
    env = dict(os.environ)
    script = tmp_path / "h19script.py"
    script.write_text("VERSION = 1\n" + SCRIPT)
    first = [server.spawn([str(script), str(i)], env, str(tmp_path), tmp_path / f"s{i}.log")
             for i in range(2)]
    assert set(_wait(server, first).values()) == {0}
    assert (tmp_path / "s1.log").read_text() == "script __main__ True ['1'] VERSION 1\n"
    script.write_text("VERSION = 333\n" + SCRIPT)
    pid = server.spawn([str(script), "x"], env, str(tmp_path), tmp_path / "s2.log")
    assert _wait(server, [pid]) == {pid: 0}
    assert (tmp_path / "s2.log").read_text() == "script __main__ True ['x'] VERSION 333\n"


def test_a_script_that_does_not_compile_fails_in_its_rank(server, tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("def oops(:\n")
    pid = server.spawn([str(script)], dict(os.environ), str(tmp_path), tmp_path / "b.log")
    assert _wait(server, [pid]) == {pid: 1}
    assert "SyntaxError" in (tmp_path / "b.log").read_text()
