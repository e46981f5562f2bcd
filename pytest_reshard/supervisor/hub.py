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

Nobody but the processes the harness started may write a rank's history: the hub draws a
secret for the run (``secrets``), the launcher hands it to the nodes only through their
environment (``Env.HUB_SECRET``), and every hello must answer a fresh nonce with its HMAC
(``contract.hub_mac``). A peer that cannot, or that breaks the protocol before it could, is closed
and counted with its address and reason (``refused``: the report names them), and nothing it sent
reaches the run folder. Everything a peer sends is bounded (``MAX_LINE``, ``MAX_HELLO_LINE``,
``HELLO_DEADLINE_S``, ``MAX_CONNECTIONS``, ``MAX_PENDING``); a line of an authenticated peer the
hub cannot accept is dropped and named (``dropped``), so no verdict passes on a history that lacks
it, and the hub and every other peer carry on.

One thread serves every connection (``selectors``); readers take a lock-free snapshot of plain
dicts the thread updates. Nothing it records needs a shared file system: only the checkpoints do.
"""
from __future__ import annotations

import collections
import errno
import hmac
import ipaddress
import json
import math
import os
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TypeAlias, cast

from pytest_reshard.contract import (HUB_PROTOCOL, Refusal, RunDir, decode_event, encode_event,
                                     hub_mac, name_of)
from pytest_reshard.supervisor.outcome import REFUSED_WRITE, HarnessError

__all__ = ["Hub", "NodeView", "CLOCK_SLACK_S", "MAX_LINE", "MAX_HELLO_LINE", "HELLO_DEADLINE_S",
           "MAX_CONNECTIONS", "MAX_PENDING"]

#: A node clock this far from the harness's (beyond what the hello's latency explains) is corrected.
CLOCK_SLACK_S = 0.05
#: The longest line an authenticated peer may send: a rank's biggest events (a ``record`` with
#: its samples, the allocator's statistics) are tens of KiB.
MAX_LINE = 4 << 20
#: The longest line before the challenge is answered (a hello, the answer): a few hundred bytes.
MAX_HELLO_LINE = 4096
#: From the connection to the answer to the challenge: a rank sends its hello as soon as it
#: connects, so only a stalled machine or a peer holding a slot open takes longer.
HELLO_DEADLINE_S = 20.0
#: Connections open at once (every rank and agent of a generation, and the last one's closing):
#: each costs two file descriptors (socket and events file) of the harness's.
MAX_CONNECTIONS = 1024
#: Connections open at once that have not answered the challenge yet: enough for a whole
#: generation connecting together, few enough that a flood cannot take the harness's descriptors.
MAX_PENDING = 256
#: The hub's nonce, in bytes (hex on the wire).
NONCE_BYTES = 16

_WILDCARDS = ("", "0.0.0.0", "::")


@dataclass
class NodeView:
    """One node agent's connection and its last report."""

    node: int
    host: str
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> pid, state, peak, code
    bye: int | None = None        # its agent's exit code, when it said goodbye
    gone: float | None = None     # when its connection closed (time.time())
    conn: socket.socket | None = None


#: What the hub kept out, counted: (reason, the peer's address, who it had proven it was: "" for
#: a connection that never passed the challenge, else e.g. "rank 1 of generation 0") -> how many.
Counts: TypeAlias = "collections.Counter[tuple[Refusal, str, str]]"


class _Conn:
    def __init__(self, sock: socket.socket, addr: tuple[str, int], deadline: float) -> None:
        self.sock = sock
        self.host, self.port = str(addr[0]), int(addr[1])
        self.buf = b""
        self.deadline = deadline             # for the hello, while not ``kind``
        self.hello: dict[str, Any] | None = None  # said, not yet proven
        self.said_at = 0.0                   # when the hello arrived (time.time())
        self.line = b""                      # the hello line, as sent
        self.nonce = ""
        self.kind: str | None = None         # "rank" or "node", once it answered the challenge
        self.key: tuple[int, int] = (0, 0)
        self.fd = -1                         # the rank's events file
        self.skipping = False                # inside a line past ``MAX_LINE``: dropped to its end

    def name(self) -> str:
        if self.kind == "rank":
            return f"rank {self.key[1]} of generation {self.key[0]}"
        if self.kind == "node":
            return f"node {self.key[1]}'s agent of generation {self.key[0]}"
        return "a connection that had not answered the challenge"


class _Refuse(Exception):
    """This peer is closed and counted for ``reason``."""

    def __init__(self, reason: Refusal) -> None:
        super().__init__(reason.value)
        self.reason = reason


class Hub:
    """Serves ``RESHARD_HUB`` for one run folder; ``address`` is what the ranks connect to, and
    ``secret`` what they must prove they hold (hand it over in their environment only)."""

    def __init__(self, run_dir: RunDir, host: str, *, secret: str | None = None,
                 max_line: int = MAX_LINE, hello_deadline_s: float = HELLO_DEADLINE_S,
                 max_connections: int = MAX_CONNECTIONS, max_pending: int = MAX_PENDING) -> None:
        if host in _WILDCARDS or (_is_ip(host) and ipaddress.ip_address(host).is_unspecified):
            raise ValueError(f"the hub binds to the one address its ranks reach ({host!r} is every "
                             "interface of this machine): pass that interface's address, or "
                             "127.0.0.1 for ranks on this machine")
        self.dir = run_dir
        self.secret = secret or secrets.token_hex(32)
        self.max_line, self.hello_deadline_s = max_line, hello_deadline_s
        self.max_connections, self.max_pending = max_connections, max_pending
        self._listener = socket.create_server((host, 0))
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self.beats: dict[tuple[int, int], float] = {}   # (gen, rank) -> last line's arrival
        self.ended: dict[tuple[int, int], float] = {}   # (gen, rank) -> its connection closed
        self.nodes: dict[tuple[int, int], NodeView] = {}  # (gen, node) -> its agent's view
        self.orders: dict[tuple[int, str], dict[str, Any]] = {}  # (gen, host) -> what it runs
        self.offsets: dict[tuple[int, int], float] = {}  # (gen, rank) -> seconds added to its t
        self.errors: list[str] = []
        #: The errno of a rank's line the run folder refused (full, read-only), else 0.
        self.refused_write = 0
        self.refused: Counts = collections.Counter()   # connections closed before they were trusted
        self.dropped: Counts = collections.Counter()   # lines of trusted peers that never reached the run folder
        self._counting = threading.Lock()  # the counts are copied from other threads
        self._conns: dict[int, _Conn] = {}  # fd -> every open connection, trusted or not
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._lock = threading.Lock()  # guards node sockets (``command``, ``order``) and orders
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
        """Raise if the hub cannot be trusted any more: its thread died, or it failed to serve
        (every later verdict would blame the workload for the harness's fault). A bad peer is
        not the hub's failure: it is refused or its line dropped, and named (``summary``)."""
        if self.refused_write:
            raise HarnessError.refused(self.dir.root, self.refused_write, "the hub")
        if self.errors:
            raise RuntimeError(f"the hub at {self.address}: {'; '.join(self.errors[:3])}")
        if not self._thread.is_alive() and not self._closed:
            raise RuntimeError(f"the hub at {self.address} stopped serving")

    def pending(self) -> int:
        """Connections open that have not answered the challenge yet."""
        return sum(1 for c in list(self._conns.values()) if c.kind is None)

    def counts(self) -> tuple[Counts, Counts]:
        """A copy of ``refused`` and ``dropped`` as they are now (for ``summary``'s ``since``)."""
        with self._counting:
            return collections.Counter(self.refused), collections.Counter(self.dropped)

    def summary(self, since: tuple[Counts, Counts] | None = None) -> dict[str, Any]:
        """What the hub kept out since the counts ``since``, for the record (``Ev.HUB``): per
        reason, how many and from where; empty lists when nothing."""
        refused, dropped = self.counts()
        if since is not None:
            refused, dropped = refused - since[0], dropped - since[1]
        return {"refused": _grouped(refused), "dropped": _grouped(dropped)}

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

    def order(self, gen: int, host: str, what: dict[str, Any]) -> None:
        """Tell generation ``gen``'s agent on node ``host`` what to run there (``slurm-fork``):
        now if it is connected, else as soon as it has proven who it is."""
        with self._lock:
            self.orders[(gen, host)] = what
            for (g, _), view in list(self.nodes.items()):
                if g == gen and view.host == host and view.conn is not None and view.gone is None:
                    _send(view.conn, {"order": what})

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
        self._conns.clear()
        self._sel.close()
        self._wake_w.close()

    # -- the server thread -------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._closed:
            for key, _ in self._sel.select(timeout=self._until_deadline()):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is not self._wake_r:
                    conn = key.data
                    if conn.sock.fileno() < 0:
                        continue  # closed earlier in this round
                    try:
                        self._read(conn)
                    except _Refuse as e:
                        self._refuse(conn, e.reason)
                    except OSError as e:
                        if e.errno not in REFUSED_WRITE:
                            raise
                        self.refused_write = e.errno   # the run folder, not the peer: no verdict
                        self._end(conn, time.time())
                    except Exception as e:  # noqa: BLE001 - one bad peer must not stop the rest
                        self.errors.append(f"{conn.name()} from {conn.host}:{conn.port}: "
                                           f"{type(e).__name__}: {e}")
                        self._end(conn, time.time())
            self._expire()

    def _until_deadline(self) -> float:
        """How long the next ``select`` may wait: until the first hello deadline, at most 1 s."""
        now = time.monotonic()
        waits = [c.deadline - now for c in self._conns.values() if c.kind is None]
        return max(0.0, min([1.0, *waits]))

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if c.kind is None and c.deadline <= now]:
            self._refuse(conn, Refusal.SLOW)

    def _accept(self) -> None:
        try:
            sock, addr = self._listener.accept()
        except OSError as e:  # a peer gone before it was accepted, out of fds
            self.errors.append(f"accept failed: {e}")
            return
        conn = _Conn(sock, addr[:2], time.monotonic() + self.hello_deadline_s)
        if len(self._conns) >= self.max_connections or self.pending() >= self.max_pending:
            self._refused(conn, Refusal.TOO_MANY)
            sock.close()
            return
        self._conns[sock.fileno()] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        """One read: the socket is readable, so ``recv`` returns at once (sockets stay blocking,
        so that ``command`` and the plan are sent whole)."""
        try:
            chunk = conn.sock.recv(1 << 16)
        except OSError:
            chunk = b""
        now = time.time()
        if not chunk:
            self._end(conn, now)
            return
        data = conn.buf + chunk
        if conn.skipping:  # the rest of a line too long, up to its end
            cut = data.find(b"\n")
            if cut < 0:
                conn.buf = b""
                return
            conn.skipping, data = False, data[cut + 1:]
        *lines, conn.buf = data.split(b"\n")
        for line in lines:
            if conn.sock.fileno() < 0:
                return  # refused by an earlier line of this chunk
            if len(line) > self._limit(conn):
                self._too_long(conn)
            else:
                self._line(conn, line, now)
        if len(conn.buf) > self._limit(conn):
            self._too_long(conn)
            conn.buf, conn.skipping = b"", True

    def _limit(self, conn: _Conn) -> int:
        return self.max_line if conn.kind else MAX_HELLO_LINE

    def _too_long(self, conn: _Conn) -> None:
        if conn.kind is None:
            raise _Refuse(Refusal.TOO_LONG)
        self._drop(conn, Refusal.TOO_LONG)

    def _close(self, conn: _Conn) -> bool:
        """Forget and close a connection; False if it was closed already."""
        fd = conn.sock.fileno()
        if fd < 0:
            return False
        self._conns.pop(fd, None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):  # never registered (refused at accept)
            pass
        conn.sock.close()
        return True

    def _end(self, conn: _Conn, now: float) -> None:
        """The peer closed (or was closed): handled alike in every state, trusted or not."""
        if not self._close(conn):
            return
        if conn.kind == "rank":
            if conn.fd >= 0:
                if conn.buf and not conn.skipping:  # a line torn by a kill mid-send: kept, as a
                    _append(conn.fd, conn.buf)      # torn file line is (the history tolerates it)
                os.close(conn.fd)
                conn.fd = -1
            self.ended[conn.key] = now
        elif conn.kind == "node":
            self.nodes[conn.key].gone = now
        elif not self._closed:
            self._refused(conn, Refusal.CLOSED)

    def _refuse(self, conn: _Conn, reason: Refusal) -> None:
        """Close a peer that never became trusted, and count it."""
        if self._close(conn):
            self._refused(conn, reason)

    def _refused(self, conn: _Conn, reason: Refusal) -> None:
        with self._counting:
            self.refused[(reason, conn.host, "")] += 1

    def _drop(self, conn: _Conn, reason: Refusal) -> None:
        with self._counting:
            self.dropped[(reason, conn.host, conn.name())] += 1

    def _line(self, conn: _Conn, line: bytes, now: float) -> None:
        if conn.kind is None:
            if conn.hello is None:
                self._hello(conn, line, now)
            else:
                self._answer(conn, line, now)
        elif conn.kind == "rank":
            self.beats[conn.key] = now
            if line.strip():
                event = _event(line)
                if event is None or not _event_ok(event, conn.key):
                    self._drop(conn, Refusal.MALFORMED)
                    return
                offset = self.offsets.get(conn.key)
                if offset:  # its node's clock, moved onto ours
                    event["t"] = round(float(event["t"]) + offset, 6)
                    line = encode_event(event)[:-1]
                _append(conn.fd, line + b"\n")
        else:
            report = _object(line)
            if report is None or not self._report(conn, report):
                self._drop(conn, Refusal.MALFORMED)

    def _report(self, conn: _Conn, report: dict[str, Any]) -> bool:
        """An agent's report, taken only whole: False (nothing taken) if a field is wrong."""
        ranks, bye = report.get("ranks"), report.get("bye")
        try:
            if ranks is not None:
                if not isinstance(ranks, dict) or not all(
                        isinstance(i, dict) and _is_int(i.get("pid")) and _int_or_none(i.get("peak"))
                        and _int_or_none(i.get("code"))
                        and isinstance(i.get("state"), (str, type(None))) for i in ranks.values()):
                    return False
                parsed = {int(r): dict(info) for r, info in ranks.items()}
            if bye is not None and not _int_or_none(bye):
                return False
        except ValueError:  # a rank that is not a number
            return False
        view = self.nodes[conn.key]
        if ranks is not None:
            view.ranks = parsed
        if bye is not None:
            view.bye = int(bye)
        return True

    def _hello(self, conn: _Conn, line: bytes, now: float) -> None:
        """What the peer says it is; it still has to prove it (``_answer``)."""
        hello = _object(line)
        if hello is None:
            raise _Refuse(Refusal.MALFORMED)
        if hello.get("protocol") != HUB_PROTOCOL:
            raise _Refuse(Refusal.PROTOCOL)
        kind = hello.get("hello")
        if kind not in ("rank", "node") or not _index(hello.get("gen")) or \
                not _index(hello.get(kind)) or not _number(hello.get("t", 0.0)):
            raise _Refuse(Refusal.MALFORMED)
        conn.hello, conn.line, conn.said_at = hello, line, now
        conn.nonce = secrets.token_hex(NONCE_BYTES)
        try:
            conn.sock.sendall(json.dumps({"nonce": conn.nonce}).encode() + b"\n")
        except OSError:  # gone already: a peer's reset must not count as the hub's failure
            raise _Refuse(Refusal.CLOSED) from None

    def _answer(self, conn: _Conn, line: bytes, now: float) -> None:
        """The answer to the challenge: the peer is bound to what its hello said, or refused."""
        answer = _object(line)
        mac = answer.get("mac") if answer is not None else None
        if not isinstance(mac, str):
            raise _Refuse(Refusal.NO_CREDENTIALS)
        if not hmac.compare_digest(mac.encode(), hub_mac(self.secret, conn.nonce,
                                                          conn.line).encode()):
            raise _Refuse(Refusal.BAD_CREDENTIALS)
        hello = cast(dict, conn.hello)
        gen = int(hello["gen"])
        if hello["hello"] == "rank":
            rank = int(hello["rank"])
            conn.kind, conn.key = "rank", (gen, rank)
            offset = conn.said_at - float(hello.get("t", conn.said_at))
            if abs(offset) > CLOCK_SLACK_S:
                self.offsets[conn.key] = offset
            conn.fd = os.open(self.dir.rank_events(gen, rank),
                              os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            plan = json.loads(self.dir.plan(gen).read_text())
            self.beats[conn.key] = now
            conn.sock.sendall(json.dumps(plan).encode() + b"\n")
        else:
            node, host = int(hello["node"]), str(hello.get("host", ""))
            conn.kind, conn.key = "node", (gen, node)
            with self._lock:
                self.nodes[conn.key] = NodeView(node, host, conn=conn.sock)
                if (gen, host) in self.orders:
                    _send(conn.sock, {"order": self.orders[(gen, host)]})


def _send(sock: socket.socket, what: dict[str, Any]) -> None:
    """One line to a node agent; one that is gone is the generation's to notice, not the hub's."""
    try:
        sock.sendall(json.dumps(what).encode() + b"\n")
    except OSError:
        pass


def _object(line: bytes) -> dict[str, Any] | None:
    """A line as a JSON object, or None."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _append(fd: int, data: bytes) -> None:
    """One line onto a rank's events file; a short write is a full file system."""
    if os.write(fd, data) != len(data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _event(line: bytes) -> dict[str, Any] | None:
    """A rank's line as its event, its checksum checked, or None."""
    try:
        return decode_event(line)
    except ValueError:
        return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _index(x: Any) -> bool:
    """A generation, rank or node number."""
    return _is_int(x) and 0 <= x < 1 << 31


def _number(x: Any) -> bool:
    """A finite JSON number (a time)."""
    return (_is_int(x) or isinstance(x, float)) and math.isfinite(x)


def _int_or_none(x: Any) -> bool:
    return x is None or _is_int(x)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _event_ok(event: dict[str, Any], key: tuple[int, int]) -> bool:
    """A rank's event as the history reads it: a name, a time, and its own generation and rank."""
    return ("ev" in event and isinstance(name_of(event), str) and _number(event.get("t"))
            and event.get("gen", key[0]) == key[0] and event.get("rank", key[1]) == key[1])


def _grouped(counts: Counts) -> list[dict[str, Any]]:
    """Per reason (and peer, for a trusted one): how many, and from which addresses."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for (reason, host, peer), n in sorted(counts.items(), key=lambda kv: (kv[0][0].value,
                                                                           kv[0][2], kv[0][1])):
        g = groups.setdefault((reason.value, peer), {"reason": reason.value, "count": 0,
                                                     "hosts": [], **({"peer": peer} if peer else {})})
        g["count"] += n
        g["hosts"].append(host)
    return list(groups.values())

