"""``slurm``: each generation is one ``srun`` job step of an allocation, one torchrun agent per node.

Inside ``salloc``/``sbatch`` (``SLURM_JOB_ID`` set) the launcher uses that allocation and only
ever cancels the steps it started; elsewhere it takes ``nodes`` nodes itself (``salloc
--no-shell``, with a time limit so that SLURM ends it even if the harness is killed) and cancels
it at the end. A generation is ``srun -N k`` on the fewest usable nodes that hold its ranks (at
most the first generation's ranks per node, the same number on each), each task the node agent
below, which runs torch's own agent (``torch.distributed.run.main``: c10d rendezvous on a store
the harness hosts, ``--max-restarts=0``): a new world size is a new step on more or fewer nodes.

The ranks run on other machines, so nothing here reads this machine's ``/proc`` or file times:
the ranks report over the harness's hub (``supervisor/hub.py``), and each node's agent reports
what its own kernel sees of its ranks (state, peak memory, and exit codes: the agent is torch's
agent, the ranks' parent, and reads each exit with ``waitid(WNOWAIT)`` before torch reaps it).

Faults map to what SLURM does:

- ``kill_node``: the rank kills its node's agent and every rank on it (SIGKILL); that node is
  lost for the rest of the run, and the next step runs on the nodes left;
- ``preempt``: SLURM's own signal path: ``scancel --signal=TERM`` of the step (slurmstepd
  signals every process of the step on every node), then ``scancel --signal=KILL`` after the
  cluster's ``KillWait``: the grace SLURM gives, whatever the fault's ``grace_s``;
- ``shift_shards``/``drain`` to fewer ranks: ``scontrol update NodeName=... State=DRAIN`` of the
  nodes the next step no longer needs (``State=RESUME`` again when the launcher closes); a step
  runs only on nodes that are not drained or down;
- a hung rank is killed alone through its node's agent; the end of a generation is ``scancel
  --signal=KILL`` of its step, and the step is gone from ``squeue`` when ``kill`` returns.

``python -m pytest_reshard.supervisor.launch.slurm agent --hub H:P --gen G -- TORCHRUN_ARGS`` is
the per-node entry point.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from pytest_reshard.contract import HUB_PROTOCOL, Env, RunDir
from pytest_reshard.supervisor import procfs
from pytest_reshard.supervisor.launch import (KILL_WAIT_S, LaunchContext, LiveGeneration, RankSpec,
                                              module_or_script)
from pytest_reshard.supervisor.launch.elastic import _UNSET_FOR_AGENTS
from pytest_reshard.supervisor.launch.forkserver import die_with_parent

__all__ = ["SlurmLauncher", "SlurmGeneration", "slurm_unavailable"]

#: c10d rendezvous settings: every agent of a step joins at once (``--nnodes=k``), nobody waits
#: past 60 s; the harness hosts the store, so no node's loss takes it down.
RDZV_CONF = "is_host=false,join_timeout=60,last_call_timeout=1,close_timeout=10"
#: How often a node agent reports its ranks (its own heartbeat, too).
REPORT_S = 0.02
#: States in which a node takes no new step (``scontrol show node``'s State, before any ``+``).
_UNUSABLE = ("DRAIN", "DOWN", "FAIL", "MAINT", "REBOOT", "POWER", "RESERVED", "UNKNOWN")
#: A rank gone (its connection closed) whose code its agent has not reported yet: wait this long.
_CODE_WAIT_S = 1.0


def slurm_unavailable() -> str | None:
    """Why this machine cannot reach a SLURM cluster, or None."""
    missing = [c for c in ("srun", "salloc", "scancel", "scontrol", "squeue") if not shutil.which(c)]
    if missing:
        return f"no SLURM client commands on PATH ({', '.join(missing)} missing)"
    done = _slurm("scontrol", "ping", check=False)
    if done.returncode != 0 or "UP" not in done.stdout:
        return f"no SLURM controller answers `scontrol ping`: {(done.stdout + done.stderr).strip()}"
    return None


def _slurm(*cmd: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()}")
    return done


class Allocation:
    """The nodes generations run on: the caller's allocation, or one taken (and given back) here."""

    def __init__(self, nodes: int, *, minutes: int, note: Callable[[str, dict[str, Any]], None]):
        self.own = "SLURM_JOB_ID" not in os.environ
        if self.own:
            done = _slurm("salloc", "--no-shell", f"--nodes={nodes}", "--job-name=pytest-reshard",
                          f"--time={minutes}", "--immediate=120", timeout=150)
            found = re.search(r"Granted job allocation (\d+)", done.stderr + done.stdout)
            if not found:
                raise RuntimeError(f"salloc gave no allocation: {(done.stderr + done.stdout).strip()}")
            self.job = found.group(1)
        else:
            self.job = os.environ["SLURM_JOB_ID"]
        node_list = _field(_slurm("scontrol", "show", "job", "-o", self.job).stdout, "NodeList")
        self.nodes = _slurm("scontrol", "show", "hostnames", node_list).stdout.split()
        if len(self.nodes) < nodes:
            self.release()
            raise ValueError(f"the allocation {self.job} has {len(self.nodes)} nodes "
                             f"({' '.join(self.nodes)}), the scenario asks for nodes={nodes}")
        self.lost: set[str] = set()      # nodes whose step tasks died (kill_node)
        self.drained: set[str] = set()   # nodes this launcher drained (resumed at release)
        config = _slurm("scontrol", "show", "config").stdout
        #: The grace SLURM gives between a step's SIGTERM and its SIGKILL.
        self.kill_wait_s = float(re.search(r"KillWait\s*=\s*(\d+)", config).group(1))  # type: ignore[union-attr]
        note("nodes", {"launcher": "slurm", "job": self.job, "own_allocation": self.own, "nodes": self.nodes,
                       "kill_wait_s": self.kill_wait_s})

    def usable(self) -> list[str]:
        """Nodes of the allocation a new step may use: not lost, not drained or down."""
        out = []
        for node in self.nodes:
            state = _field(_slurm("scontrol", "show", "node", "-o", node).stdout, "State")
            if node not in self.lost and not any(s in state for s in _UNUSABLE):
                out.append(node)
        return out

    def drain(self, nodes: Sequence[str], reason: str) -> None:
        for node in nodes:
            _slurm("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
            self.drained.add(node)

    def steps(self, prefix: str) -> list[str]:
        """This allocation's steps whose name starts with ``prefix`` (``job.step`` ids)."""
        out = _slurm("squeue", "--steps", "--noheader", f"--jobs={self.job}", "--format=%i %j",
                     check=False).stdout
        return [line.split()[0] for line in out.splitlines()
                if len(line.split()) == 2 and line.split()[1].startswith(prefix)]

    def release(self) -> None:
        """Resume what we drained; cancel our allocation and wait (bounded) until it is gone."""
        for node in sorted(self.drained):
            _slurm("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        self.drained.clear()
        if self.own:
            _slurm("scancel", self.job, check=False)
            _wait(lambda: not _slurm("squeue", "--noheader", f"--jobs={self.job}",
                                     check=False).stdout.strip(), 30.0,
                  f"SLURM job {self.job} after scancel")


def _field(line: str, name: str) -> str:
    found = re.search(rf"\b{name}=(\S+)", line)
    if not found:
        raise RuntimeError(f"no {name}= in SLURM's answer: {line.strip()[:300]}")
    return found.group(1)


def _wait(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} still there {timeout:.0f} s later")
        time.sleep(0.1)


def head_address(first_node: str) -> str:
    """The address the nodes reach this machine at: ``RESHARD_SLURM_HEAD``, else the local end
    of the route to the first node (no packet is sent)."""
    if os.environ.get("RESHARD_SLURM_HEAD"):
        return os.environ["RESHARD_SLURM_HEAD"]
    addr = _field(_slurm("scontrol", "show", "node", "-o", first_node).stdout, "NodeAddr")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return s.getsockname()[0]


class SlurmLauncher:
    """Generations as job steps of one allocation of ``nodes`` nodes."""

    name = "slurm"
    own_rendezvous = True
    references_on = "fork"  # a clean run needs no cluster

    @classmethod
    def from_context(cls, ctx: LaunchContext) -> "SlurmLauncher":
        sc = ctx.scenario
        return cls(sc.nodes if sc else 1, timeout_s=sc.timeout_s if sc else 600.0, note=ctx.note)

    def __init__(self, nodes: int, *, timeout_s: float = 600.0,
                 note: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        if nodes < 1:
            raise ValueError(f"nodes={nodes}: need at least one node")
        why = slurm_unavailable()
        if why is not None:
            raise RuntimeError(f"launcher='slurm' needs a SLURM cluster: {why}")
        self.nodes = nodes
        self._note = note or (lambda what, fields: None)
        self._minutes = int(timeout_s // 60) + 5
        self.allocation: Allocation | None = None
        self.per_node: int | None = None
        self._hub: Any = None
        self._store: Any = None
        self._tag = uuid.uuid4().hex[:8]  # our steps' names: pytest-reshard-<tag>-g<gen>

    def launch(self, specs: Sequence[RankSpec]) -> SlurmGeneration:
        from datetime import timedelta

        from torch.distributed import TCPStore

        from pytest_reshard.supervisor.hub import Hub

        first, world = specs[0], len(specs)
        gen = int(first.env[Env.GENERATION])
        if self.allocation is None:
            self.allocation = Allocation(self.nodes, minutes=self._minutes, note=self._note)
            if world % self.nodes:
                raise ValueError(f"world size {world} does not split into {self.nodes} nodes")
            self.per_node = world // self.nodes
        run_dir = RunDir(Path(first.env[Env.DIR]))
        if self._hub is None or self._hub.dir != run_dir:
            if self._hub is not None:
                self._hub.close()
            head = head_address(self.allocation.nodes[0])
            self._hub = Hub(run_dir, head)
            self._store = TCPStore(head, 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=60))
        assert self.per_node is not None
        count = -(-world // self.per_node)  # the fewest nodes that hold it, as evenly as torchrun needs
        if world % count:
            raise ValueError(f"world size {world} needs {count} nodes of at most {self.per_node} "
                             f"ranks, but does not split evenly over {count} (torchrun starts "
                             "the same number on every node)")
        usable = self.allocation.usable()
        if len(usable) < count:
            raise RuntimeError(f"generation {gen} needs {count} nodes of {self.per_node} ranks, "
                               f"but only {len(usable)} of the allocation's are usable "
                               f"({', '.join(usable) or 'none'}; lost: "
                               f"{', '.join(sorted(self.allocation.lost)) or 'none'})")
        nodes = usable[:count]
        endpoint = f"{self._hub.address.rpartition(':')[0]}:{self._store.port}"
        env = {k: v for k, v in first.env.items() if k not in _UNSET_FOR_AGENTS and
               not (k.startswith("SLURM_") and k != "SLURM_CONF")}
        env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # pytorch#135712
                   **{Env.HUB: self._hub.address, Env.SCHEDULER: "slurm"})
        if os.environ.get("RESHARD_SLURM_IFNAME"):
            env["GLOO_SOCKET_IFNAME"] = os.environ["RESHARD_SLURM_IFNAME"]
        name = f"pytest-reshard-{self._tag}-g{gen}"
        cmd = ["srun", f"--jobid={self.allocation.job}", f"--job-name={name}",
               f"--nodes={count}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}",
               "--kill-on-bad-exit=0", "--label", "--unbuffered",
               sys.executable, "-m", "pytest_reshard.supervisor.launch.slurm", "agent",
               "--hub", self._hub.address, "--gen", str(gen), "--",
               f"--nnodes={count}", f"--nproc-per-node={world // count}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint={endpoint}", f"--rdzv-id={name}", f"--rdzv-conf={RDZV_CONF}",
               "--max-restarts=0", "--monitor-interval=0.1", *module_or_script(first.argv)]
        parent = os.getpid()
        with open(first.log.with_name(f"g{gen}-slurm.log"), "ab") as log:
            srun = subprocess.Popen(cmd, env=env, cwd=first.cwd, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=lambda: die_with_parent(parent))
        self._note("nodes", {"launcher": "slurm", "gen": gen, "name": name, "nodes": nodes,
                                  "world_size": world, "hub": self._hub.address,
                                  "rendezvous": endpoint})
        return SlurmGeneration(self, srun, gen, world, nodes, name)

    def close(self) -> None:
        if self._hub is not None:
            self._hub.close()
            self._hub = None
        self._store = None
        if self.allocation is not None:
            self.allocation.release()
            self.allocation = None


class SlurmGeneration(LiveGeneration):
    """One job step, seen through the hub: its ranks' connections and its agents' reports."""

    def __init__(self, launcher: SlurmLauncher, srun: subprocess.Popen, gen: int,
                 world_size: int, nodes: list[str], name: str) -> None:
        self._launcher, self._srun = launcher, srun
        self._hub = launcher._hub
        self._alloc: Allocation = launcher.allocation  # type: ignore[assignment]
        self.gen, self.world_size, self.nodes, self.name = gen, world_size, nodes, name
        self._killed = False
        self._term_at: float | None = None  # when SLURM was asked to SIGTERM the step

    def _ranks(self) -> dict[int, dict[str, Any]]:
        return {r: info for r in range(self.world_size)
                if (info := self._hub.rank_of(self.gen, r)) is not None}

    def pids(self) -> dict[int, int]:
        """The ranks' pids on their own nodes (not this machine's processes)."""
        return {r: int(info["pid"]) for r, info in self._ranks().items()}

    def exit_codes(self) -> dict[int, int | None]:
        """A rank has ended when its connection closed; its code is what its agent saw, or
        SIGKILL when its agent is gone too (its node was killed)."""
        self._enforce_kill_wait()
        now = time.time()
        srun_done = self._srun.poll() is not None
        codes: dict[int, int | None] = {}
        for rank in range(self.world_size):
            key = (self.gen, rank)
            if key not in self._hub.beats:  # never connected: starting, or never will
                codes[rank] = None if not srun_done else -signal.SIGKILL
                continue
            ended = self._hub.ended.get(key)
            if ended is None:
                codes[rank] = None
                continue
            info = self._hub.rank_of(self.gen, rank) or {}
            view = self._hub.node_of(self.gen, rank)
            if info.get("code") is not None:
                codes[rank] = int(info["code"])
            elif (view is None or view.gone is not None or srun_done
                  or now - ended > _CODE_WAIT_S):
                codes[rank] = -signal.SIGKILL
            else:
                codes[rank] = None  # its agent's report is on its way
        return codes

    def signal(self, rank: int, sig: int) -> None:
        if not self._hub.command(self.gen, rank, signal=int(sig)) and sig == signal.SIGKILL:
            self._cancel("KILL")  # its agent is unreachable: the step goes

    def state(self, rank: int) -> str | None:
        info = self._hub.rank_of(self.gen, rank)
        return None if info is None or info.get("code") is not None else info.get("state")

    def peak_rss(self, rank: int) -> int | None:
        info = self._hub.rank_of(self.gen, rank)
        return None if info is None else info.get("peak")

    def last_beat(self, rank: int) -> float | None:
        return self._hub.beats.get((self.gen, rank))

    def deliver(self, fault: dict[str, Any]) -> float | None:
        """What SLURM does for a planned fault: a preemption's SIGTERM (then SIGKILL after
        KillWait, which is returned as the grace), a drain of the nodes a smaller world leaves."""
        if fault["kind"] == "preempt":
            self._cancel("TERM")
            self._term_at = time.monotonic()
            return self._alloc.kill_wait_s
        size = fault["params"].get("to_world_size")
        per_node = self._launcher.per_node or 1
        if fault["kind"] == "shift_shards" and size is not None and size < self.world_size:
            drained = self.nodes[-(-int(size) // per_node):]
            self._alloc.drain(drained, f"pytest-reshard:{self.name}:drain-to-{size}")
            self._launcher._note("nodes", {"launcher": "slurm", "gen": self.gen,
                                           "drained": drained, "fault_id": fault["id"]})
        return None

    def capacity(self) -> int | None:
        """Ranks the next step can have: nodes whose agent vanished without a word are lost."""
        for (gen, _), view in list(self._hub.nodes.items()):
            if gen == self.gen and view.gone is not None and view.bye is None:
                self._alloc.lost.add(view.host)
        return len([n for n in self._alloc.nodes if n not in self._alloc.lost]) * \
            (self._launcher.per_node or 1)

    def kill(self) -> None:
        """The step is cancelled (SIGKILL on every node) and gone from squeue; srun has exited."""
        if self._killed:
            return
        self._killed = True
        if self._srun.poll() is None:
            self._cancel("KILL")
        try:
            self._srun.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            procfs.killpg(self._srun.pid)
            self._srun.wait(timeout=KILL_WAIT_S)
        _wait(lambda: not self._alloc.steps(self.name), 30.0, f"SLURM step {self.name}")

    def _cancel(self, sig: str) -> None:
        steps = self._alloc.steps(self.name)
        for step in steps:
            _slurm("scancel", f"--signal={sig}", step, check=False)
        if sig != "KILL":  # the end of every step is recorded by gen_end; a signal is news
            self._launcher._note("nodes", {"launcher": "slurm", "gen": self.gen,
                                           "scancel": sig, "steps": steps})

    def _enforce_kill_wait(self) -> None:
        if self._term_at is not None and time.monotonic() - self._term_at > \
                self._alloc.kill_wait_s:
            self._term_at = None
            self._cancel("KILL")


# -- the node agent --------------------------------------------------------------------------
class _Reporter:
    """Runs beside torch's agent in its process: reports the ranks (its children) to the hub."""

    def __init__(self, hub: str, gen: int) -> None:
        host, _, port = hub.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.node = int(os.environ.get("SLURM_NODEID", "0"))
        self.host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.sock.sendall(json.dumps({"hello": "node", "protocol": HUB_PROTOCOL, "gen": gen,
                                      "node": self.node, "host": self.host}).encode() + b"\n")
        self.sock.setblocking(False)
        self.lock = threading.Lock()
        self.ranks: dict[int, int] = {}        # pid -> rank
        self.codes: dict[int, int] = {}        # pid -> exit code (negative: a signal)
        self.peaks: dict[int, int] = {}
        self._buf = b""

    def send(self, obj: dict[str, Any] | None = None) -> None:
        """Send ``obj``, or (None) a report of every rank as the kernel sees it now."""
        with self.lock:
            if obj is None:
                obj = {"ranks": self._ranks()}
            self.sock.setblocking(True)
            try:
                self.sock.sendall(json.dumps(obj).encode() + b"\n")
            except OSError:
                self.orphaned()
            finally:
                self.sock.setblocking(False)

    def _ranks(self) -> dict[int, dict[str, Any]]:
        ranks = {}
        for pid, rank in list(self.ranks.items()):
            peak = procfs.peak_rss(pid)
            if peak is not None:
                self.peaks[pid] = max(peak, self.peaks.get(pid, 0))
            ranks[rank] = {"pid": pid, "state": procfs.state(pid), "peak": self.peaks.get(pid),
                           "code": self.codes.get(pid)}
        return ranks

    def orphaned(self) -> None:
        """The harness is gone: so is everything it started on this node."""
        for pid in self.ranks:
            procfs.killpg(pid)
        os._exit(70)

    def report_forever(self) -> None:
        while True:
            for pid in procfs.children(os.getpid()):
                if pid not in self.ranks:
                    rank = _rank_of(pid)
                    if rank is not None:
                        self.ranks[pid] = rank
            self.send()
            self._commands()
            time.sleep(REPORT_S)

    def _commands(self) -> None:
        try:
            chunk = self.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.orphaned()
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        for line in lines:
            cmd = json.loads(line)
            pid = next((p for p, r in self.ranks.items() if r == cmd["rank"]), None)
            if pid is not None and "signal" in cmd:
                procfs.killpg(pid, int(cmd["signal"]))

    def reap_watch_forever(self) -> None:
        """Read each child's exit as the kernel reports it, leaving it for torch to reap."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                time.sleep(0.01)  # no child yet
                continue
            if info is None:
                continue
            pid = info.si_pid
            self.codes[pid] = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            if pid in self.ranks:
                self.send()  # at once: the harness is waiting for this code
            # Until torch reaps it, waitid(P_ALL) returns this one again: watch the others alone.
            while _zombie_of_ours(pid):
                for other in list(self.ranks):
                    if other != pid and other not in self.codes:
                        try:
                            seen = os.waitid(os.P_PID, other, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                        except ChildProcessError:
                            continue
                        if seen is not None:
                            self.codes[other] = seen.si_status if seen.si_code == os.CLD_EXITED \
                                else -seen.si_status
                            self.send()
                time.sleep(0.001)


def _zombie_of_ours(pid: int) -> bool:
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False  # reaped


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _agent(argv: Sequence[str]) -> int:
    """``agent --hub H:P --gen G -- TORCHRUN_ARGS``: report to the hub, run torch's agent."""
    if len(argv) < 5 or argv[0] != "--hub" or argv[2] != "--gen" or argv[4] != "--":
        raise SystemExit("usage: python -m pytest_reshard.supervisor.launch.slurm agent "
                         "--hub HOST:PORT --gen G -- TORCHRUN_ARGS...")
    reporter = _Reporter(argv[1], int(argv[3]))
    os.environ[Env.NODE] = str(reporter.node)
    threading.Thread(target=reporter.reap_watch_forever, daemon=True).start()
    threading.Thread(target=reporter.report_forever, daemon=True).start()
    from torch.distributed.run import main

    code = 1
    try:
        main(list(argv[5:]))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        time.sleep(2 * REPORT_S)  # the last exit codes reach the hub before the goodbye
        reporter.send({"bye": code})
    return code


if __name__ == "__main__":
    if sys.argv[1:2] != ["agent"]:
        raise SystemExit("usage: python -m pytest_reshard.supervisor.launch.slurm agent ...")
    sys.exit(_agent(sys.argv[2:]))
