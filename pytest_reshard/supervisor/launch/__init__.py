"""Launchers start one generation of ranks and can signal, poll and kill them.

Each launcher is one module here behind one protocol (``Launcher``), registered by name:

- ``fork`` (``fork.py``): ranks forked from a warm, torch-preloaded server (the default: a
  relaunch costs a fork plus process-group setup, not an ``import torch``).
- ``local`` (``local.py``): a cold ``python`` per rank, exactly what torchrun would run, without
  the agent.
- ``torchrun`` (``torchrun.py``): the real elastic agent (c10d rendezvous) runs the ranks; rank
  pids are learned from the probe's ``start`` events, since the agent owns them.
- ``elastic`` (``elastic.py``): one torchrun agent per node, each in its own network namespace
  where the machine allows; agents restart the ranks themselves after a node is lost.
- ``slurm`` (``slurm.py``): each generation a job step of a SLURM allocation, one torchrun agent
  per node; the ranks run on other machines and report over the harness's hub.
- ``slurm-fork`` (``slurm_fork.py``): the same steps, the ranks forked by a warm server each node
  keeps across generations (a relaunch on the same nodes costs what ``fork`` costs here).

Every rank runs in a session of its own, so ``kill`` reaches its whole process group
(data-loader workers included), and every rank dies with its launcher (``PR_SET_PDEATHSIG``).
"""
from __future__ import annotations

import importlib
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol, Sequence

from pytest_reshard.contract import Cause, Env
from pytest_reshard import procfs

__all__ = ["RankSpec", "LiveGeneration", "Regrouped", "Launcher", "LaunchContext", "register", "make",
           "launcher_class", "registered", "facts", "FACTS", "free_port", "parse_port_range", "KILL_WAIT_S",
           "host_store"]

#: How long a killed rank may take to be reaped before we call it a leak.
KILL_WAIT_S = 10.0


@dataclass
class RankSpec:
    rank: int
    argv: list[str]  # after the interpreter: ["-m", "module", ...] or ["script.py", ...]
    env: dict[str, str]
    cwd: str
    log: Path


class LiveGeneration:
    """The live processes of one generation (``history.Generation`` is its record). ``exit_codes``
    maps each rank to its code, None while it runs.

    Launchers whose agents re-form the world themselves after a failure (``elastic``) override
    ``restarting``, ``next_world_size`` and ``advance``; for the others a generation ends with its
    processes. Launchers whose ranks run on other machines (``slurm``) answer ``state``,
    ``peak_rss`` and ``last_beat`` from the ranks' reports instead of this machine's ``/proc``
    and heartbeat files, and may have a scheduler ``deliver`` planned faults."""

    def pids(self) -> dict[int, int]:
        raise NotImplementedError

    def exit_codes(self) -> dict[int, int | None]:
        raise NotImplementedError

    def signal(self, rank: int, sig: int) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """Every process of the generation is gone when this returns (bounded by KILL_WAIT_S)."""
        raise NotImplementedError

    def state(self, rank: int, pid: int | None) -> str | None:
        """The kernel's state letter of a live rank (``T``: stopped), None if unknown. ``pid``:
        the rank's, from ``pids()`` (a launcher whose ranks run elsewhere uses its reports)."""
        return procfs.state(pid)

    def peak_rss(self, rank: int, pid: int | None) -> int | None:
        return None if pid is None else procfs.peak_rss(pid)

    def last_beat(self, rank: int) -> float | None:
        """When the rank last showed life (``time.time()``); None: read its heartbeat file."""
        return None

    def deliver(self, fault: dict[str, Any]) -> float | None:
        """A planned fault fired: have the scheduler do its part for the causes its launcher
        ``delivers`` (a preemption's signal). Returns the grace the scheduler gives, which
        replaces the fault's own deadline, or None."""
        return None

    def capacity(self) -> int | None:
        """The most ranks a next generation can have (the nodes left), None: no limit."""
        return None

    def fence(self, node: int) -> None:
        """Kill node ``node`` for good, its agent and every rank on it (a node cut off the
        network, fenced as a scheduler would); only launchers of namespaced nodes have one."""
        raise NotImplementedError(f"{type(self).__name__} has no nodes to fence")

    def restarting(self) -> bool:
        """True while agents re-form the world on their own after a failure."""
        return False

    def next_world_size(self) -> int | None:
        """The world size the agents re-formed, when ``restarting``."""
        return None

    def advance(self, gen: int, world_size: int) -> "LiveGeneration":
        """The same processes, watched through generation ``gen`` (a restart by the agents)."""
        raise NotImplementedError(f"{type(self).__name__} does not restart ranks by itself")


class Regrouped(LiveGeneration):
    """A world re-formed in place (a live reshard): old rank ``survivors[i]`` of ``old``, the
    same process, is rank ``i`` now; ``joined`` holds the processes started for the ranks
    after them, and for a rank whose entry is None (a migration's). Killing it ends both, the
    leavers of ``old`` included."""

    def __init__(self, old: LiveGeneration, survivors: Sequence[int | None],
                 joined: LiveGeneration | None) -> None:
        self._old, self._joined = old, joined
        self._survivors = {new: r for new, r in enumerate(survivors) if r is not None}

    def _part(self, rank: int) -> tuple[LiveGeneration, int]:
        if rank in self._survivors:
            return self._old, self._survivors[rank]
        if self._joined is None:
            raise KeyError(rank)
        return self._joined, rank

    def pids(self) -> dict[int, int]:
        old = self._old.pids()
        pids = {new: old[r] for new, r in self._survivors.items() if r in old}
        return {**pids, **(self._joined.pids() if self._joined else {})}

    def exit_codes(self) -> dict[int, int | None]:
        old = self._old.exit_codes()
        codes = {new: old.get(r) for new, r in self._survivors.items()}
        return {**codes, **(self._joined.exit_codes() if self._joined else {})}

    def signal(self, rank: int, sig: int) -> None:
        part, r = self._part(rank)
        part.signal(r, sig)

    def kill(self) -> None:
        try:
            self._old.kill()
        finally:
            if self._joined is not None:
                self._joined.kill()

    def state(self, rank: int, pid: int | None) -> str | None:
        part, r = self._part(rank)
        return part.state(r, pid)

    def peak_rss(self, rank: int, pid: int | None) -> int | None:
        part, r = self._part(rank)
        return part.peak_rss(r, pid)


@dataclass(frozen=True)
class LaunchContext:
    """What a launcher may need to start: the fork server's preloads, readers of the probe's
    events (``pid_of(gen)``, ``clean_exit(gen, rank)``: an agent owns the ranks, so only their
    events say who they are and how they ended), the scenario, and a way to record a note."""

    preload: Sequence[str]
    pid_of: Callable[[int], dict[int, int]]
    clean_exit: Callable[[int, int], bool]
    scenario: Any = None
    note: Callable[[str, dict[str, Any]], None] | None = None


class Launcher(Protocol):
    #: The name scenarios use (``launcher="fork"``).
    name: ClassVar[str]
    #: True: torch's agent hosts the rendezvous; else the supervisor hosts a store for the ranks.
    own_rendezvous: ClassVar[bool]
    #: The launcher that runs this one's clean reference runs (None: itself).
    references_on: ClassVar[str | None]
    #: True: its ranks are this process's children, so a live reshard can keep some of them
    #: into the next generation and start the ones that join (``Regrouped``).
    keeps_processes: ClassVar[bool]
    #: True: it spans several nodes (``nodes=``; a node's loss is a ``kill_node``).
    multi_node: ClassVar[bool]
    #: True: membership mode (``replica_groups``) may start one group's ranks again with it,
    #: into the running generation.
    restarts_groups: ClassVar[bool]
    #: The planned ends its scheduler takes part in (``LiveGeneration.deliver``), by cause.
    delivers: ClassVar[frozenset[Cause]]

    @classmethod
    def from_context(cls, ctx: LaunchContext) -> "Launcher": ...
    def launch(self, specs: Sequence[RankSpec]) -> LiveGeneration: ...
    def close(self) -> None: ...


# name -> "module:Class", imported on first use (the elastic launcher pulls in torch's store)
_LAUNCHERS: dict[str, str] = {}


def register(name: str, where: str) -> None:
    """Make ``"module:Class"`` (a ``Launcher``) the launcher called ``name``."""
    if name in _LAUNCHERS and _LAUNCHERS[name] != where:
        raise ValueError(f"launcher {name!r} is already registered as {_LAUNCHERS[name]}")
    _LAUNCHERS[name] = where


def registered() -> list[str]:
    return sorted(_LAUNCHERS)


def launcher_class(name: str) -> type[Launcher]:
    if name not in _LAUNCHERS:
        raise ValueError(f"unknown launcher {name!r}: use one of {', '.join(registered())}")
    module, _, cls = _LAUNCHERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


#: The facts a launcher declares (class attributes), and what one that omits a fact is taken to say.
FACTS: dict[str, Any] = {"own_rendezvous": False, "references_on": None, "keeps_processes": False,
                         "multi_node": False, "restarts_groups": False, "delivers": frozenset()}


def facts(name: str) -> dict[str, Any]:
    """What launcher ``name`` declares about itself (``FACTS``), for the checks of a scenario."""
    cls = launcher_class(name)
    return {fact: getattr(cls, fact, default) for fact, default in FACTS.items()}


def make(name: str, ctx: LaunchContext) -> Launcher:
    return launcher_class(name).from_context(ctx)


def parse_port_range(text: str) -> tuple[int, int]:
    """``"20000-20500"`` -> (20000, 20500); the error says what is expected."""
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise ValueError(f"{Env.PORT_RANGE}={text!r}: expected LO-HI, e.g. 20000-20500") from None
    if not 1024 <= lo < hi <= 65536:
        raise ValueError(f"{Env.PORT_RANGE}={text!r}: need 1024 <= LO < HI <= 65536")
    return lo, hi


def free_port() -> int:
    """A loopback port nobody listens on right now, for another process to bind next.

    Under pytest-xdist each worker has its own range (``RESHARD_PORT_RANGE``, set by the plugin,
    see ``parallel.py``) below the kernel's ephemeral ports, so between our check and the other
    process's bind no other worker and no port-0 bind can take it. Elsewhere the kernel picks.
    """
    span = os.environ.get(Env.PORT_RANGE)
    if not span:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    lo, hi = parse_port_range(span)
    global _next_port
    for _ in range(hi - lo):
        port = lo + (_next_port % (hi - lo))
        _next_port += 1  # rotate: a port just released may linger in TIME_WAIT
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {Env.PORT_RANGE}={span}: every one is in "
                       "use; widen the range or run fewer scenarios at once")


_next_port = 0


def host_store(host: str, world_size: int | None = None, *, timeout_s: float = 60.0) -> Any:
    """A ``TCPStore`` server the harness hosts, listening on ``host`` only.

    Torch's store has no authentication, and its server listens on every interface of the
    machine whatever host it is given (``*:PORT``); a store on a socket bound here, handed over
    with ``master_listen_fd`` (the store owns and closes it), is reachable only where the ranks
    reach it: loopback for ranks on this machine, the allocation's interface for nodes."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    with socket.create_server((host, 0), backlog=1024) as sock:
        port = sock.getsockname()[1]
        store = TCPStore(host, port, world_size, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s), master_listen_fd=sock.fileno())
        sock.detach()  # the store's now
    return store


def wait_until(done: Callable[[], bool], timeout: float, what: str, poll: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} still alive {timeout:.0f} s after SIGKILL")
        time.sleep(poll)


def module_or_script(argv: Sequence[str]) -> list[str]:
    """A rank's argv as torchrun takes it (``-m module ...`` or ``script ...``)."""
    return ["-m", *argv[1:]] if argv[0] == "-m" else list(argv)


register("fork", "pytest_reshard.supervisor.launch.fork:ForkLauncher")
register("local", "pytest_reshard.supervisor.launch.local:LocalLauncher")
register("torchrun", "pytest_reshard.supervisor.launch.torchrun:TorchrunLauncher")
register("elastic", "pytest_reshard.supervisor.launch.elastic:ElasticLauncher")
register("slurm", "pytest_reshard.supervisor.launch.slurm:SlurmLauncher")
register("slurm-fork", "pytest_reshard.supervisor.launch.slurm_fork:SlurmForkLauncher")
