"""Find processes a supervisor started, and listening ports: the "nothing leaks" guarantee.

A rank is ours if its environment names our supervisor pid (cold and torchrun launches) or if it
is a fork server started by us, or forked from one (forked ranks keep the server's command line).
Linux only (reads /proc); elsewhere the lists are empty.
"""
from __future__ import annotations

import os

from pathlib import Path


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def started_by(supervisor_pid: int) -> list[int]:
    """Live (non-zombie) processes started, directly or not, by the supervisor in that pid."""
    me = str(supervisor_pid).encode()
    marker = b"RESHARD_SUPERVISOR_PID=" + me
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == supervisor_pid:
            continue
        cmdline = _read(entry / "cmdline").split(b"\0")
        ours = ("pytest_reshard.supervisor.launch.forkserver".encode() in cmdline and me in cmdline) or \
            marker in _read(entry / "environ").split(b"\0")
        if ours and not _zombie(entry):
            found.append(int(entry.name))
    return sorted(found)


def _zombie(entry: Path) -> bool:
    stat = _read(entry / "stat")
    return b")" in stat and stat.rsplit(b")", 1)[1].split()[:1] == [b"Z"]


def listening(port: int) -> bool:
    """True if something listens on this TCP port (IPv4 or IPv6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(Path(table)).decode().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def parent(pid: int) -> int | None:
    stat = _read(Path(f"/proc/{pid}/stat"))
    try:
        return int(stat.rsplit(b")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def leaked_ranks(supervisor_pid: int) -> list[int]:
    """Our processes other than the session's own warm fork servers (which may stay)."""
    return [p for p in started_by(supervisor_pid)
            if not (parent(p) == supervisor_pid
                    and b"pytest_reshard.supervisor.launch.forkserver" in _read(Path(f"/proc/{p}/cmdline")))]


def alive(pid: int) -> bool:
    """A process with this pid exists (possibly another user's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stopped(pid: int | None) -> bool:
    """True if the process is stopped by a signal (SIGSTOP/SIGTSTP) or traced."""
    if pid is None:
        return False
    stat = _read(Path(f"/proc/{pid}/stat"))
    return b")" in stat and stat.rsplit(b")", 1)[1].split()[:1] in ([b"T"], [b"t"])


def peak_rss(pid: int) -> int | None:
    """The process's peak resident set size in bytes (VmHWM), or None if it is gone."""
    for line in _read(Path(f"/proc/{pid}/status")).splitlines():
        if line.startswith(b"VmHWM:"):
            return int(line.split()[1]) * 1024
    return None
