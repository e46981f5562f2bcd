"""``fork``: ranks forked from a warm server that has torch and the workload imported."""
from __future__ import annotations

from typing import Sequence

from pytest_reshard.supervisor.launch import (KILL_WAIT_S, LiveGeneration, LaunchContext, RankSpec,
                                              wait_until)
from pytest_reshard.supervisor.launch.forkserver import ForkServer
from pytest_reshard.supervisor.procfs import killpg
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

    def __init__(self, preload: Sequence[str] = (WARMUP,)) -> None:
        self.preload = tuple(preload)
        self._server: ForkServer | None = None

    @classmethod
    def from_context(cls, ctx: LaunchContext) -> "ForkLauncher":
        return cls(ctx.preload)

    def launch(self, specs: Sequence[RankSpec]) -> LiveGeneration:
        if self._server is None or not self._server.alive():
            self._server = ForkServer(self.preload)
        pids = self._server.spawn_many([(s.argv, s.env, s.cwd, s.log) for s in specs])
        pids = dict(zip((s.rank for s in specs), pids))
        return ForkGeneration(self._server, pids)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
