"""Nodes on one machine: each node gets a network namespace and an address of its own.

A multi-node scenario runs one torchrun agent per node. To make the nodes separate hosts, as
they are in a cluster, ``create(n)`` builds (as root, with iproute2):

- a bridge ``rsb<tag>`` holding ``10.77.K.1/24`` in the root namespace: the "head" address where
  the harness hosts the rendezvous endpoint;
- per node ``i`` a namespace ``reshard-<tag>-n<i>`` with its own loopback and one end of a veth
  pair, ``rs0``, holding ``10.77.K.<i+2>/24``; the other end joins the bridge.

There is no route, NAT or forwarding out of the bridge: the traffic never leaves this machine.
Where namespaces cannot be made (not root, no ``ip``, a kernel without them), ``mode="auto"``
falls back to loopback: every node is 127.0.0.1, and ``Network.note`` says why.

``close()`` kills every process left in the namespaces and deletes them and the bridge (the veth
pairs go with them). A creator killed with SIGKILL cannot: a reaper process, started with the
network, waits on a pipe only the creator holds and does it when that pipe closes. Each network
also leaves a state file naming its creator's pid, so the next ``create`` removes what a reaper
that was itself killed left behind.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_reshard import procfs as processes

__all__ = ["Network", "create", "netns_unavailable"]

STATE_DIR = Path(os.environ.get("RESHARD_NETNS_STATE", "/run/pytest-reshard-netns"))
NETNS_DIR = Path("/var/run/netns")
IFNAME = "rs0"  # the node's interface inside its namespace (GLOO_SOCKET_IFNAME)
CLONE_NEWNET = 0x40000000
SUBNET = "10.77"


@dataclass
class Network:
    """Where each node lives: its address, its namespace (None on loopback), and why."""

    mode: str                     # "netns" or "loopback"
    hosts: list[str]              # node i's address
    head: str                     # the rendezvous endpoint's address (root namespace)
    ifname: str                   # the nodes' interface, for GLOO_SOCKET_IFNAME
    namespaces: list[str | None]
    note: str = ""                # why loopback, when it is
    _links: list[str] = field(default_factory=list)
    _state: Path | None = None
    _reaper: subprocess.Popen | None = None

    def preexec(self, node: int) -> Callable[[], None] | None:
        """A ``preexec_fn`` that moves the child into node ``node``'s namespace (None on
        loopback)."""
        name = self.namespaces[node]
        if name is None:
            return None
        path = str(NETNS_DIR / name)

        def enter() -> None:
            fd = os.open(path, os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {path} failed")
            finally:
                os.close(fd)
        return enter

    def pids(self, node: int) -> list[int]:
        """Processes living in node ``node``'s namespace (empty on loopback)."""
        name = self.namespaces[node]
        if name is None:
            return []
        out = _ip("netns", "pids", name, check=False)
        return [int(p) for p in out.split()]

    def close(self) -> None:
        """Kill what runs in the namespaces, then delete them and the bridge. Idempotent."""
        _remove(self.namespaces, self._links)
        if self._state is not None:
            self._state.unlink(missing_ok=True)
            self._state = None
        self.namespaces = [None] * len(self.namespaces)
        self._links = []
        reaper, self._reaper = self._reaper, None
        if reaper is not None:   # its pipe closes with its stdin: it finds nothing to do
            reaper.stdin.close()  # type: ignore[union-attr]  # Popen(stdin=PIPE)
            try:
                reaper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                reaper.kill()
                reaper.wait()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def loopback(nodes: int, note: str) -> Network:
    return Network("loopback", ["127.0.0.1"] * nodes, "127.0.0.1", "lo", [None] * nodes, note)


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None if they can (as far as we can tell)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); every node is 127.0.0.1"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2) on PATH to make network namespaces; every node is 127.0.0.1"
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces; every node is 127.0.0.1"
    return None


def create(nodes: int, mode: str = "auto") -> Network:
    """A network of ``nodes`` nodes: ``"netns"`` (separate hosts; raises if impossible),
    ``"loopback"``, or ``"auto"`` (namespaces if possible, else loopback with a note)."""
    if mode not in ("auto", "netns", "loopback"):
        raise ValueError(f"network mode {mode!r}: use 'auto', 'netns' or 'loopback'")
    if mode == "loopback":
        return loopback(nodes, "loopback requested")
    why = netns_unavailable()
    if why is None:
        try:
            return _create_netns(nodes)
        except (OSError, subprocess.SubprocessError) as e:
            why = f"making network namespaces failed ({e}); every node is 127.0.0.1"
    if mode == "netns":
        raise RuntimeError(f"network='netns' was asked for, but {why}")
    return loopback(nodes, why)


def _create_netns(nodes: int) -> Network:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers pick subnets one at a time
        sweep_stale()
        k = _free_subnet()
        tag = f"{os.getpid() % 100000:05d}{k:03d}"[-7:]
        bridge = f"rsb{tag}"
        names = [f"reshard-{tag}-n{i}" for i in range(nodes)]
        links = [bridge] + [f"rsv{tag}{i}" for i in range(nodes)]
        state = STATE_DIR / f"{tag}.json"
        state.write_text(json.dumps({"pid": os.getpid(), "namespaces": names, "links": links,
                                     "subnet": k}))
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{SUBNET}.{k}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names):
            _ip("netns", "add", name)
            _ip("link", "add", links[i + 1], "type", "veth", "peer", "name", IFNAME, "netns", name)
            _ip("link", "set", links[i + 1], "master", bridge, "up")
            _ip("-n", name, "addr", "add", f"{SUBNET}.{k}.{i + 2}/24", "dev", IFNAME)
            _ip("-n", name, "link", "set", IFNAME, "up")
            _ip("-n", name, "link", "set", "lo", "up")
    except BaseException:
        _remove(names, links)
        state.unlink(missing_ok=True)
        raise
    # the reaper's stdin is a pipe only this process holds (not inherited: close_fds), in a
    # session of its own, so that a kill of this process's group spares it
    reaper = subprocess.Popen([sys.executable, "-c", f"import {__name__} as n; n._reap()",
                               str(state)], stdin=subprocess.PIPE, start_new_session=True)
    return Network("netns", [f"{SUBNET}.{k}.{i + 2}" for i in range(nodes)], f"{SUBNET}.{k}.1",
                   IFNAME, list(names), "", links, state, reaper)


def _reap() -> None:
    """The reaper: once its stdin closes (its creator closed the network, or died), remove what
    the state file in ``argv[1]`` still names."""
    sys.stdin.buffer.read()
    state = Path(sys.argv[1])
    try:
        info = json.loads(state.read_text())
    except (OSError, ValueError):
        return   # closed by its creator
    _remove(info.get("namespaces", []), info.get("links", []))
    state.unlink(missing_ok=True)


def sweep_stale() -> list[str]:
    """Remove the namespaces and links of networks whose creator is gone; their names."""
    removed = []
    for state in STATE_DIR.glob("*.json"):
        try:
            info = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        if processes.alive(int(info.get("pid", 0))):
            continue
        _remove(info.get("namespaces", []), info.get("links", []))
        state.unlink(missing_ok=True)
        removed += info.get("namespaces", [])
    return removed


def _free_subnet() -> int:
    used = set()
    for line in _ip("-4", "-o", "addr", "show", check=False).splitlines():
        for word in line.split():
            if word.startswith(f"{SUBNET}."):
                used.add(int(word.split(".")[2]))
    for state in STATE_DIR.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            used.add(int(json.loads(state.read_text())["subnet"]))
    free = [k for k in range(1, 255) if k not in used]
    if not free:
        raise OSError(f"no free {SUBNET}.K.0/24 subnet left for a bridge")
    return free[(os.getpid() * 7) % len(free)]


def _remove(namespaces: Sequence[str | None], links: list[str]) -> None:
    for name in namespaces:
        if name is None or not (NETNS_DIR / name).exists():
            continue
        for pid in _ip("netns", "pids", name, check=False).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", name, check=False)
    for link in links:
        if Path(f"/sys/class/net/{link}").exists():
            _ip("link", "del", link, check=False)


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


