"""The harness's end of ranks on other machines: one TCP server that is their history's way home.

A rank whose launcher sets ``RESHARD_HUB`` connects here instead of writing into the run folder,
and a node's agent connects to report what its own kernel sees (``contract.HUB_PROTOCOL``). The
hub writes each rank's lines to that rank's events file in the run folder on this machine, one
``os.write`` per line as the probe does locally, so the tail, the history and every checker read
a remote run exactly as a local one. What the local launchers learn from this machine's ``/proc``
and from heartbeat file times, it learns from the wire:

- a rank's heartbeat is the last line it sent (a blank line every 0.1 s), timed on this machine's
  clock when it arrived: no clock is shared, and no file time crosses an NFS attribute cache;
- a rank's end is its connection closing: the kernel closes a process's sockets however it ends
  (SIGKILL, ``os._exit``, a segfault), and sends what it had written first;
- its exit code, its state (stopped) and its peak memory come from its node's agent, which sees
  them in its own ``/proc`` and as the ranks' parent;
- commands (signal one rank) go back to that agent.

One thread serves every connection (``selectors``); readers take a lock-free snapshot of plain
dicts the thread updates. Nothing it records needs a shared file system: only the checkpoints do.
"""
from __future__ import annotations

import json
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pytest_reshard.contract import HUB_PROTOCOL, RunDir

__all__ = ["Hub", "NodeView"]


@dataclass
class NodeView:
    """One node agent's connection and its last report."""

    node: int
    host: str
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> pid, state, peak, code
    bye: int | None = None        # its agent's exit code, when it said goodbye
    gone: float | None = None     # when its connection closed (time.time())
    conn: socket.socket | None = None


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.kind: str | None = None   # "rank" or "node", after the hello
        self.key: tuple[int, int] = (0, 0)
        self.fd = -1                   # the rank's events file


class Hub:
    """Serves ``RESHARD_HUB`` for one run folder; ``address`` is what the ranks connect to."""

    def __init__(self, run_dir: RunDir, host: str) -> None:
        self.dir = run_dir
        self._listener = socket.create_server((host, 0))
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self.beats: dict[tuple[int, int], float] = {}   # (gen, rank) -> last line's arrival
        self.ended: dict[tuple[int, int], float] = {}   # (gen, rank) -> its connection closed
        self.nodes: dict[tuple[int, int], NodeView] = {}  # (gen, node) -> its agent's view
        self.errors: list[str] = []
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._lock = threading.Lock()  # guards node sockets for ``command``
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="reshard-hub", daemon=True)
        self._thread.start()

    # -- what the launcher asks ---------------------------------------------------------------
    def rank_of(self, gen: int, rank: int) -> dict[str, Any] | None:
        """What rank ``rank``'s node agent last said of it (pid, state, peak, code), if any."""
        for (g, _), view in list(self.nodes.items()):
            if g == gen and rank in view.ranks:
                return view.ranks[rank]
        return None

    def node_of(self, gen: int, rank: int) -> NodeView | None:
        for (g, _), view in list(self.nodes.items()):
            if g == gen and rank in view.ranks:
                return view
        return None

    def command(self, gen: int, rank: int, **what: Any) -> bool:
        """Send a command to the agent of the node that runs ``rank``; False if none can take it."""
        view = self.node_of(gen, rank)
        if view is None or view.conn is None or view.gone is not None:
            return False
        try:
            with self._lock:
                view.conn.sendall(json.dumps({"rank": rank, **what}).encode() + b"\n")
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Stop serving and close every connection: a rank still attached then ends itself."""
        if self._closed:
            return
        self._closed = True
        self._wake_w.send(b"x")
        self._thread.join(timeout=10)
        for key in list(self._sel.get_map().values()):
            self._sel.unregister(key.fileobj)
            key.fileobj.close()
        self._sel.close()
        self._wake_w.close()

    # -- the server thread -------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._closed:
            for key, _ in self._sel.select(timeout=1.0):
                if key.fileobj is self._listener:
                    sock, _ = self._listener.accept()
                    sock.setblocking(False)
                    self._sel.register(sock, selectors.EVENT_READ, _Conn(sock))
                elif key.fileobj is not self._wake_r:
                    self._read(key.data)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        now = time.time()
        if chunk:
            *lines, conn.buf = (conn.buf + chunk).split(b"\n")
            for line in lines:
                try:
                    self._line(conn, line, now)
                except (ValueError, KeyError, TypeError) as e:
                    self.errors.append(f"a bad line from {conn.kind or 'a new connection'} "
                                       f"{conn.key}: {e}: {line[:200]!r}")
            return
        self._sel.unregister(conn.sock)
        conn.sock.close()
        if conn.kind == "rank":
            if conn.buf:  # a line torn by a kill mid-send: kept, as a torn file line is
                os.write(conn.fd, conn.buf)
            os.close(conn.fd)
            self.ended[conn.key] = now
        elif conn.kind == "node":
            self.nodes[conn.key].gone = now

    def _line(self, conn: _Conn, line: bytes, now: float) -> None:
        if conn.kind is None:
            self._hello(conn, json.loads(line))
        elif conn.kind == "rank":
            self.beats[conn.key] = now
            if line.strip():
                os.write(conn.fd, line + b"\n")
        else:
            report = json.loads(line)
            view = self.nodes[conn.key]
            if "ranks" in report:
                view.ranks = {int(r): info for r, info in report["ranks"].items()}
            if "bye" in report:
                view.bye = int(report["bye"])

    def _hello(self, conn: _Conn, hello: dict[str, Any]) -> None:
        if hello.get("protocol") != HUB_PROTOCOL:
            raise ValueError(f"protocol {hello.get('protocol')!r}, this harness speaks "
                             f"{HUB_PROTOCOL}: run the same pytest-reshard on every node")
        gen = int(hello["gen"])
        if hello["hello"] == "rank":
            rank = int(hello["rank"])
            conn.kind, conn.key = "rank", (gen, rank)
            conn.fd = os.open(self.dir.rank_events(gen, rank),
                              os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            plan = json.loads(self.dir.plan(gen).read_text())
            self.beats[conn.key] = time.time()
            conn.sock.setblocking(True)  # the plan: one line, sent whole
            conn.sock.sendall(json.dumps(plan).encode() + b"\n")
            conn.sock.setblocking(False)
        elif hello["hello"] == "node":
            node = int(hello["node"])
            conn.kind, conn.key = "node", (gen, node)
            self.nodes[conn.key] = NodeView(node, str(hello.get("host", "")), conn=conn.sock)
        else:
            raise ValueError(f"unknown hello {hello['hello']!r}")
