"""A fork server that serves clients one after another (a SLURM node's, ``serve_at``).

Each client hands over the descriptor its ranks write to; a rank's exit goes to the client that
asked for it; a client that drops takes its own ranks with it and no one else's, and the server
lives on for the next. Real processes, no cluster.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

from pytest_reshard.supervisor.launch.forkserver import server_environment

RANK = """
import os, sys, time
# one write per line: unbuffered, print() writes each word apart and two ranks' words interleave
sys.stdout.write(f"rank {os.environ['RANK']} of client {os.environ['CLIENT']}\\n")
sys.stdout.flush()
if os.environ.get("LINGER"):
    time.sleep(600)
sys.exit(int(os.environ["RANK"]))
"""


def _client(name: str, out: int, deadline: float) -> socket.socket:
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect("\0" + name)
        except OSError:
            sock.close()
            assert time.monotonic() < deadline, f"no fork server at {name}"
            time.sleep(0.01)
            continue
        socket.send_fds(sock, [b'{"op": "hello"}\n'], [out])
        sock.settimeout(30)
        return sock


def _spawn(sock: socket.socket, script: str, client: str, ranks: range, linger: bool) -> None:
    env = {**os.environ, "CLIENT": client, **({"LINGER": "1"} if linger else {})}
    sock.sendall(b"".join(json.dumps({"op": "spawn", "argv": [script], "cwd": os.getcwd(),
                                      "env": {**env, "RANK": str(r)}}).encode() + b"\n"
                          for r in ranks))


def _messages(sock: socket.socket, want: int) -> list[dict]:
    got, buffer = [], b""
    while len(got) < want:
        chunk = sock.recv(1 << 16)
        assert chunk, f"the server closed the connection after {got}"
        *lines, buffer = (buffer + chunk).split(b"\n")
        got += [json.loads(line) for line in lines]
    return got


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_clients_one_after_another_each_get_their_own_ranks_output_and_exits(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    name = f"pytest-reshard-test-{uuid.uuid4().hex[:8]}"
    server = subprocess.Popen([sys.executable, "-m", "pytest_reshard.supervisor.launch.forkserver",
                               "--at", name], env=server_environment(os.environ),
                              stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        a_out, b_out = tmp_path / "a.log", tmp_path / "b.log"
        with open(a_out, "w") as fa, open(b_out, "w") as fb:
            a = _client(name, fa.fileno(), deadline)
            _spawn(a, str(script), "a", range(2), linger=True)
            a_pids = [m["pid"] for m in _messages(a, 2)]
            b = _client(name, fb.fileno(), deadline)
            _spawn(b, str(script), "b", range(1, 3), linger=False)
            b_msgs = _messages(b, 4)  # two pids, then both exits
        pids = [m["pid"] for m in b_msgs if "pid" in m]
        assert sorted((m["exit"], m["code"]) for m in b_msgs if "exit" in m) == \
            sorted(zip(pids, [1, 2]))                # each exit to its own client, with its code
        assert all(_alive(p) for p in a_pids)        # b's ranks ending touched none of a's
        a.close()                                    # a client gone: its ranks go with it
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in a_pids):
            assert time.monotonic() < deadline, "a dropped client's ranks still alive"
            time.sleep(0.01)
        assert server.poll() is None                 # and the server lives on
        c = _client(name, 1, time.monotonic() + 30)
        _spawn(c, str(script), "c", range(1), linger=False)
        assert [m.get("code") for m in _messages(c, 2)] == [None, 0]
        c.close()
        assert sorted(a_out.read_text().splitlines()) == ["rank 0 of client a", "rank 1 of client a"]
        assert sorted(b_out.read_text().splitlines()) == ["rank 1 of client b", "rank 2 of client b"]
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
