"""``fork``: ranks forked from a warm server that has torch and the workload imported."""
from __future__ import annotations

from typing import Sequence

from pytest_reshard.contract import Cause
from pytest_reshard.supervisor.launch import (KILL_WAIT_S, LiveGeneration, LaunchContext, RankSpec,
                                              wait_until)
from pytest_reshard.supervisor.launch.forkserver import ForkServer
from pytest_reshard.procfs import killpg
from pytest_reshard.workloads import WARMUP


class ForkGeneration(LiveGeneration):
    def __init__(self, server: ForkServer, pids: dict[int, int]) -> None:
        self._server = server
        self._pids = pids

    def pids(self) -> dict[int, int]:
        return dict(self._pids)

    def exit_codes(self) -> dict[int, int | None]:
        exits = self._server.poll()
        return {r: exits.get(pid) for r, pid in self._pids.items()}

    def signal(self, rank: int, sig: int) -> None:
        killpg(self._pids[rank], sig)

    def kill(self) -> None:
        for pid in self._pids.values():
            killpg(pid)
        wait_until(lambda: all(c is not None for c in self.exit_codes().values()),
                   KILL_WAIT_S, "a forked rank")


class ForkLauncher:
    name = "fork"
    own_rendezvous = False
    references_on = None
    keeps_processes = True
    multi_node = False
    restarts_groups = True
    delivers: frozenset[Cause] = frozenset()

    def __init__(self, preload: Sequence[str] = (WARMUP,)) -> None:
        self.preload = tuple(preload)
        self._server: ForkServer | None = None
        self.closed = False  # closed for good: a run still using it gets an error, not a server

    @classmethod
    def from_context(cls, ctx: LaunchContext) -> "ForkLauncher":
        return cls(ctx.preload)

    def start(self) -> ForkServer:
        """The running server, started now if it is not. It dies when the *thread* that started
        it ends (Linux sends the parent-death signal then), so start it on the thread that
        outlives its use; a run on another thread uses ``borrowed()``."""
        if self.closed:
            raise RuntimeError("this fork launcher was closed; its ranks were ended with it")
        if self._server is None or not self._server.alive():
            self._server = ForkServer(self.preload)
        return self._server

    def running(self) -> bool:
        return not self.closed and self._server is not None and self._server.alive()

    def borrowed(self) -> "BorrowedFork":
        """This launcher as a run on another thread uses it (see ``BorrowedFork``)."""
        return BorrowedFork(self)

    def launch(self, specs: Sequence[RankSpec]) -> LiveGeneration:
        server = self.start()
        started = server.spawn_many([(s.argv, s.env, s.cwd, s.log) for s in specs])
        return ForkGeneration(server, dict(zip((s.rank for s in specs), started)))

    def close(self) -> None:
        self.closed = True
        if self._server is not None:
            self._server.close()
            self._server = None


class BorrowedFork:
    """A started ``ForkLauncher`` as a run on another thread uses it (a session's clean reference
    run beside its chaos run): it launches on the server already running, never starts one (a
    server started by a passing thread would die when that thread ends, with every rank on it,
    the other run's included) and never closes it; once the owner is closed or its server is
    gone, ``launch`` raises and that run ends."""

    name = ForkLauncher.name
    own_rendezvous = False
    references_on = None
    keeps_processes = True
    multi_node = False
    restarts_groups = True
    delivers: frozenset[Cause] = frozenset()

    def __init__(self, owner: ForkLauncher) -> None:
        self._owner = owner

    def launch(self, specs: Sequence[RankSpec]) -> LiveGeneration:
        if not self._owner.running():
            raise RuntimeError("the shared fork server is closed or gone; a run on another "
                               "thread does not start one")
        return self._owner.launch(specs)

    def close(self) -> None:
        pass
