"""``local``: a cold interpreter per rank (what torchrun would start, without the agent)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence

from pytest_reshard.contract import Cause
from pytest_reshard.supervisor.launch import KILL_WAIT_S, LiveGeneration, LaunchContext, RankSpec
from pytest_reshard.supervisor.launch.forkserver import die_with_parent
from pytest_reshard.procfs import killpg


class PopenGeneration(LiveGeneration):
    def __init__(self, procs: dict[int, subprocess.Popen]) -> None:
        self._procs = procs

    def pids(self) -> dict[int, int]:
        return {r: p.pid for r, p in self._procs.items()}

    def exit_codes(self) -> dict[int, int | None]:
        return {r: p.poll() for r, p in self._procs.items()}

    def signal(self, rank: int, sig: int) -> None:
        killpg(self._procs[rank].pid, sig)

    def kill(self) -> None:
        for p in self._procs.values():
            killpg(p.pid)
        for p in self._procs.values():
            p.wait(timeout=KILL_WAIT_S)


class LocalLauncher:
    name = "local"
    own_rendezvous = False
    references_on = None
    keeps_processes = True
    multi_node = False
    restarts_groups = True
    delivers: frozenset[Cause] = frozenset()

    @classmethod
    def from_context(cls, ctx: LaunchContext) -> "LocalLauncher":
        return cls()

    def launch(self, specs: Sequence[RankSpec]) -> LiveGeneration:
        parent = os.getpid()
        procs = {}
        for spec in specs:
            with open(spec.log, "ab") as log:
                procs[spec.rank] = subprocess.Popen(
                    [sys.executable, *spec.argv], env=spec.env, cwd=spec.cwd, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=lambda: die_with_parent(parent))
        return PopenGeneration(procs)

    def close(self) -> None:
        pass
