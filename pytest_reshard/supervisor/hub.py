"""The harness's end of ranks on other machines: one TCP server that is their history's way home.

A rank whose launcher sets ``RESHARD_HUB`` connects here instead of writing into the run folder,
and a node's agent connects to report what its own kernel sees (``contract.HUB_PROTOCOL``). The
hub writes each rank's lines to that rank's events file in the run folder on this machine, one
``os.write`` per line as the probe does locally, so the tail, the history and every checker read
a remote run exactly as a local one. What the local launchers learn from this machine's ``/proc``
and from heartbeat file times, it learns from the wire:

- a rank's heartbeat is the last line it sent (a blank line every 0.1 s), timed on this machine's
  clock when it arrived: no clock is shared, and no file time crosses an NFS attribute cache;
- a rank's events carry its node's clock: the hub measures the offset at the hello (the rank's
  clock against this one, within the one-way latency) and, past ``CLOCK_SLACK_S``, moves every
  ``t`` onto this machine's clock, so that events of several nodes order as they happened;
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
from typing import Any, cast

from pytest_reshard.contract import HUB_PROTOCOL, RunDir, decode_event, encode_event

__all__ = ["Hub", "NodeView", "CLOCK_SLACK_S"]

#: A node clock this far from the harness's (beyond what the hello's latency explains) is corrected.
CLOCK_SLACK_S = 0.05


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
        self.offsets: dict[tuple[int, int], float] = {}  # (gen, rank) -> seconds added to its t
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
        view = self.node_of(gen, rank)
        return None if view is None else view.ranks.get(rank)

    def node_of(self, gen: int, rank: int) -> NodeView | None:
        for (g, _), view in list(self.nodes.items()):
            if g == gen and rank in view.ranks:
                return view
        return None

    def check(self) -> None:
        """Raise if the hub cannot be trusted any more: its thread died, or a peer broke the
        protocol (every later verdict would blame the workload for the harness's fault)."""
        if self.errors:
            raise RuntimeError(f"the hub at {self.address}: {'; '.join(self.errors[:3])}")
        if not self._thread.is_alive() and not self._closed:
            raise RuntimeError(f"the hub at {self.address} stopped serving")

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
            if isinstance(key.data, _Conn) and key.data.fd >= 0:
                os.close(key.data.fd)
            cast(socket.socket, key.fileobj).close()  # only sockets are registered
        self._sel.close()
        self._wake_w.close()

    # -- the server thread -------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._closed:
            for key, _ in self._sel.select(timeout=1.0):
                if key.fileobj is self._listener:
                    try:
                        sock, _ = self._listener.accept()
                    except OSError as e:  # a peer gone before it was accepted, out of fds
                        self.errors.append(f"accept failed: {e}")
                        continue
                    self._sel.register(sock, selectors.EVENT_READ, _Conn(sock))
                elif key.fileobj is not self._wake_r:
                    try:
                        self._read(key.data)
                    except Exception as e:  # noqa: BLE001 - one bad peer must not stop the rest
                        self.errors.append(f"{key.data.kind or 'a new connection'} "
                                           f"{key.data.key}: {type(e).__name__}: {e}")
                        self._end(key.data, time.time())

    def _read(self, conn: _Conn) -> None:
        """One read: the socket is readable, so ``recv`` returns at once (sockets stay blocking,
        so that ``command`` and the plan are sent whole)."""
        try:
            chunk = conn.sock.recv(1 << 16)
        except OSError:
            chunk = b""
        now = time.time()
        if chunk:
            *lines, conn.buf = (conn.buf + chunk).split(b"\n")
            for line in lines:
                self._line(conn, line, now)
            return
        self._end(conn, now)

    def _end(self, conn: _Conn, now: float) -> None:
        self._sel.unregister(conn.sock)
        conn.sock.close()
        if conn.kind == "rank":
            if conn.buf:  # a line torn by a kill mid-send: kept, as a torn file line is
                os.write(conn.fd, conn.buf)
            os.close(conn.fd)
            conn.fd = -1
            self.ended[conn.key] = now
        elif conn.kind == "node":
            self.nodes[conn.key].gone = now

    def _line(self, conn: _Conn, line: bytes, now: float) -> None:
        if conn.kind is None:
            self._hello(conn, json.loads(line))
        elif conn.kind == "rank":
            self.beats[conn.key] = now
            if line.strip():
                offset = self.offsets.get(conn.key)
                if offset:  # its node's clock, moved onto ours
                    event = decode_event(line)
                    event["t"] = round(float(event["t"]) + offset, 6)
                    line = encode_event(event)[:-1]
                os.write(conn.fd, line + b"\n")
        else:
            report = json.loads(line)
            view = self.nodes[conn.key]
            if "ranks" in report:
                view.ranks = {int(r): dict(info) for r, info in report["ranks"].items()}
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
            now = time.time()
            offset = now - float(hello.get("t", now))
            if abs(offset) > CLOCK_SLACK_S:
                self.offsets[conn.key] = offset
            conn.fd = os.open(self.dir.rank_events(gen, rank),
                              os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            plan = json.loads(self.dir.plan(gen).read_text())
            self.beats[conn.key] = now
            conn.sock.sendall(json.dumps(plan).encode() + b"\n")
        elif hello["hello"] == "node":
            node = int(hello["node"])
            conn.kind, conn.key = "node", (gen, node)
            self.nodes[conn.key] = NodeView(node, str(hello.get("host", "")), conn=conn.sock)
        else:
            raise ValueError(f"unknown hello {hello['hello']!r}")
