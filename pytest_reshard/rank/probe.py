"""The probe: the few calls a training script makes so the harness can see and break it (a contract).

    from pytest_reshard import probe

    run = probe.attach()                    # a no-op outside the harness
    start = load_checkpoint_if_any()
    run.resumed(step=start)
    for step in range(start, total_steps):
        with run.step(step) as s:
            s.record(samples=batch_ids)
            s.point("forward");   loss = model(batch)
            s.point("backward");  loss.backward()
            s.point("optimizer"); opt.step()
            s.record(loss=loss.item())
        if run.reshard_requested() or run.stop_requested():
            save_checkpoint(step); break
    run.close()

Why it is built this way:

- Every event is one JSON line written with a single ``os.write`` to an ``O_APPEND`` file, so it is
  in the kernel before the next line of training code runs: a SIGKILL loses at most the event that
  was being written, and readers tolerate a torn last line.
- It imports neither pytest nor torch (``digest`` imports torch only when handed tensors), and
  outside the harness every call returns at once, so the probe can stay in production code.
- In-process faults fire at fault points (``s.point(name)`` and the implicit ``begin``/``end``),
  which makes "mid-step" exact and replayable; the supervisor enforces deadlines from outside.
- A heartbeat thread touches a file every 0.1 s. A stopped (SIGSTOP) or dead rank stops beating;
  the thread also ends the rank if the supervisor that started it is gone, so no rank outlives
  its test.
- Record mode (``RESHARD_RECORD=DIR`` or ``attach(record=DIR)``, outside the harness) writes the
  same events on a production job, one file per process in ``DIR``, and does nothing else: no
  plan, no faults, no heartbeat, no supervisor to watch. Its one signal handler records a
  SIGTERM that lands (a scheduler's preemption) and then does what the signal did before: the
  job's own handler runs, or the process dies of SIGTERM. ``pytest-reshard judge DIR`` judges
  them.
- On another machine (``RESHARD_HUB`` set: the ``slurm`` launcher) the same lines and a blank
  line per heartbeat go over one TCP connection to the harness, and the plan comes back over it:
  nothing depends on a shared folder's file times or on the harness seeing this machine's
  processes. The connection closing is the process ending, whatever ended it.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import faulthandler
import functools
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from pytest_reshard import procfs
from pytest_reshard.contract import (ADVICE, GUARD, HUB_PROTOCOL, NOT_INJECTED, OWN_GPUS, PREEMPT_SIGNAL,
                                     STACK_SIGNAL, STRETCHED, Env, Ev, RunDir, encode_event, hub_hello,
                                     hub_line, hub_secret, name_of, read_jsonl, record_file, seal)

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.filewatch import Watcher


__all__ = ["attach", "digest", "Run", "Step", "ReshardNotice", "LiveChange", "InjectedFault",
           "FaultNotInjected"]

#: How long a rank restarted by elastic agents waits for its generation's plan.
PLAN_WAIT_S = 60.0
#: The heartbeat period: a rank silent for the supervisor's ``hang_s`` is suspect.
HEARTBEAT_S = 0.1
# Exit code of a rank that ends itself because its supervisor vanished.
ORPHAN_EXIT = 70
#: How long a rank on another machine waits for the hub's challenge and then its plan (the hub
#: refuses a hello not answered within its own deadline, ``hub.HELLO_DEADLINE_S``).
HELLO_S = 30.0
#: How long a rank on another machine keeps trying to reach the harness's hub.
CONNECT_S = 60.0
#: How long ``live_reshard`` waits for the harness's answer when the notice set no deadline.
LIVE_WAIT_S = 60.0


#: The start of each per-step event's line, built once from its ``Ev`` name (the hot path).
_STEP_HEAD_BEGIN, _STEP_HEAD_POINT, _STEP_HEAD_RECORD, _STEP_HEAD_END = (
    f'{{"ev":{json.dumps(ev.value)},"step":' for ev in (Ev.BEGIN, Ev.POINT, Ev.RECORD, Ev.END))


class InjectedFault(RuntimeError):
    """An error raised into the workload by a chaos injector (e.g. a simulated CUDA error)."""


class FaultNotInjected(InjectedFault):
    """An injector could not make its fault here (a tool missing, a launcher without nodes):
    raised into the workload so that the run fails loudly, and noted (``NOT_INJECTED``) so that
    what follows is never excused as the fault's doing."""


@dataclass(frozen=True)
class ReshardNotice:
    """A planned reshard: save a checkpoint and exit before ``deadline`` (``time.time()``).
    ``moves``: a migration's rank, whose shard moves to a new process (the world keeps its
    size); a workload that cannot migrate in place saves and exits as for any reshard."""

    to_world_size: int
    deadline: float
    kind: str = "shift_shards"
    moves: int | None = None


@dataclass(frozen=True)
class LiveChange:
    """The harness's answer to ``Run.live_reshard``: the world these processes form next.

    Old rank ``survivors[i]`` becomes new rank ``i``; the processes the harness started to join
    take the ranks after them, and in a migration the one rank whose entry is None (its old
    process leaves, a new one takes its place). ``master_addr:master_port`` is the new world's
    rendezvous store, fresh (a re-formed world's groups reuse the old one's names), hosted by
    the harness."""

    generation: int              # the new world's generation
    world_size: int
    old_world_size: int
    survivors: tuple[int | None, ...]
    master_addr: str
    master_port: int
    step: int                    # the old world's last step; the new one starts after it
    rank: int | None             # this process's rank in the new world; None: it leaves

    @property
    def moved(self) -> int | None:
        """The rank a migration moves to a new process (None: a reshard)."""
        return next((r for r, old in enumerate(self.survivors) if old is None), None)

    @classmethod
    def read(cls, path: Path, *, rank: int | None) -> "LiveChange":
        answer = json.loads(path.read_text())
        if answer.get("error"):
            raise RuntimeError(f"the harness cannot reshard in place: {answer['error']}")
        return cls(generation=int(answer["gen"]), world_size=int(answer["world_size"]),
                   old_world_size=int(answer["old_world_size"]),
                   survivors=tuple(answer["survivors"]), master_addr=str(answer["master_addr"]),
                   master_port=int(answer["master_port"]), step=int(answer["step"]), rank=rank)


def digest(obj: Any) -> str:
    """A stable hex digest of nested dicts/lists of tensors, numbers, strings and bytes.

    Tensors hash by dtype, shape and exact bytes (DTensors must be gathered first: the digest of
    a shard is not the digest of the state). Equal digests mean bit-equal state.
    """
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()[:16]


def _feed(h: "hashlib._Hash", obj: Any) -> None:
    if isinstance(obj, Mapping):
        h.update(b"{")
        for key in sorted(obj, key=str):
            h.update(str(key).encode() + b":")
            _feed(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for item in obj:
            _feed(h, item)
        h.update(b"]")
    elif isinstance(obj, (bytes, bytearray)):
        h.update(b"b" + bytes(obj))
    elif type(obj).__module__.startswith("torch") and hasattr(obj, "detach"):

        t = obj.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        t = t.cpu().contiguous()
        h.update(f"t{t.dtype}{tuple(t.shape)}".encode())
        # Raw bytes without numpy (torch does not require it): a contiguous CPU tensor's memory.
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b"")
    elif type(obj).__module__ == "numpy" and hasattr(obj, "tobytes"):
        h.update(f"n{obj.dtype}{obj.shape}".encode() + obj.tobytes())
    else:
        h.update(repr(obj).encode())


class Step:
    """The context of one training step; ``point`` marks named phases inside it."""

    __slots__ = ("_run", "step", "phase", "t0")

    def __init__(self, run: "Run", step: int) -> None:
        self._run = run
        self.step = step
        self.phase = "begin"
        self.t0 = 0.0   # when it began (time.monotonic)

    def point(self, phase: str) -> None:
        """Mark entering ``phase``: recorded, and any fault planned here fires now."""
        self.phase = phase
        run = self._run
        if run.active:
            run._emit_step(_STEP_HEAD_POINT, self.step, ',"phase":' + _quoted(phase))
            if run._faults:
                run._fire(self.step, phase)

    def record(self, *, loss: float | None = None, samples: Sequence[int] | None = None,
               epoch: int | None = None, **metrics: Any) -> None:
        """Record the step's loss and/or the global sample ids this rank consumed.

        Record samples as soon as the batch is drawn (before the first fault point), so a rank
        killed mid-step still accounts for the samples it took. ``samples`` are global ids
        (the dataset index, the same on every rank and at every world size).

        ``epoch``: the pass over the data these samples belong to. A sample id seen again in a
        later epoch is a new consumption, not a duplicate: ``exactly_once_samples`` counts
        ``(epoch, sample)``. Without it, every sample is of epoch 0, and a repeat is judged
        against the clean reference run (a repeat it shows at the same step is an epoch).

        Other keywords (``tokens=``, ``grad_norm=``...) are recorded as they are.
        """
        run = self._run
        if not run.active:
            return
        extra = ""
        if loss is not None:
            extra += ',"loss":' + _number(float(loss))
        if samples is not None:
            extra += ',"samples":[' + ",".join([str(int(i)) for i in samples]) + "]"
        if epoch is not None:
            extra += ',"epoch":' + str(int(epoch))
        if metrics:
            extra += "," + json.dumps(metrics, separators=(",", ":"))[1:-1]
        run._emit_step(_STEP_HEAD_RECORD, self.step, extra)


class Run:
    """Handle returned by ``attach``. Inactive (every call a no-op) outside the harness, unless
    it records (record mode)."""

    def __init__(self, env: Mapping[str, str] | None = None, *, max_rewind_steps: int | None = None,
                 role: str | None = None, record: str | os.PathLike[str] | None = None,
                 digests: bool | None = None) -> None:
        env = os.environ if env is None else env
        self.active = Env.DIR in env
        self.rank = int(env.get("RANK", 0))
        self.world_size = int(env.get("WORLD_SIZE", 1))
        self.generation = generation_of(env)
        self._key = (self.generation, self.rank)   # what attach() compares to reuse this Run
        #: Record mode (``Env.RECORD`` or ``attach(record=DIR)``, outside the harness): the folder
        #: this process records into; None under the harness or when nothing is recorded.
        self.recording: Path | None = None
        self._digests = True   # checkpoint_*(state=...) digests the state (off in record mode)
        self._heartbeat: Path | None = None
        self.workdir: Path | None = None
        self.seed = 0
        self.role = role or "trainer"
        #: Every rank's role this generation (from the harness's plan); None outside the harness.
        self.roles: tuple[str, ...] | None = None
        self.device_map: list[int] | None = None
        self._stop = False
        self._open: Step | None = None  # the step begin_step began
        self._last_step: int | None = None  # the last step begun (a save after it belongs to it)
        self._files_watched = False         # filewatch records into this rank's events
        self._sigterm_handled = False   # set once stop_requested() installed the SIGTERM flag
        self._previous_sigterm: Any = None
        self._sigterm_recorder = False  # record mode: _on_sigterm records, then passes SIGTERM on
        self._notice: ReshardNotice | None = None
        self._faults: dict[tuple[int, str], list[dict[str, Any]]] = {}
        self._ballast: list[Any] = []  # what executors hold (``hold``)
        self._stacks: Any = None       # the file faulthandler writes stack dumps to
        self._exposed: dict[str, Any] = {}  # the model and optimizer a bitflip may corrupt
        self._stretch = 0.0   # a slower device class with no cgroup to cap it: sleep this x a step
        self._fd = -1
        self._write: Callable[[bytes], Any] = lambda data: None  # one event line, all at once
        #: The errno of an event the run folder refused (full, read-only), else 0.
        self.lost = 0
        self._hub: _HubLink | None = None
        self._attached = (max_rewind_steps, role)  # what rejoin attaches the next Run with
        self._beating = threading.Event()           # set: this Run's heartbeat stops
        #: The live reshard this process was started to join (``Env.JOIN``), else None.
        self.joining: LiveChange | None = None
        if not self.active:
            folder = record if record is not None else env.get(Env.RECORD)
            if folder:
                self._record(Path(folder), env, max_rewind_steps, digests)
            return
        run_dir = self._dir = RunDir(Path(env[Env.DIR]))
        self.workdir = run_dir.work
        if env.get(Env.JOIN):
            self.joining = LiveChange.read(run_dir.live(int(env[Env.JOIN])), rank=self.rank)
        if env.get(Env.HUB):
            self._hub = _HubLink(env[Env.HUB], self.generation, self.rank, hub_secret(env))
            plan = self._hub.plan
        else:
            plan = _read_plan(run_dir.plan(self.generation), elastic=env.get(Env.ELASTIC) == "1")
        self.seed = int(plan["seed"])
        self.roles = tuple(plan["roles"])
        self.role = role or self.roles[self.rank]
        #: device_map[r] is the device (local rank) rank r runs on this generation, None for
        #: r -> r. A rebalance moves some ranks' shards to other devices at the same world size;
        #: the launcher sets LOCAL_RANK to match.
        self.device_map = plan.get("device_map")
        for fault in plan["faults"]:
            if self.rank in fault["ranks"]:
                _executor(fault)  # imported now, so that firing at the point costs nothing
                self._faults.setdefault((fault["step"], fault["phase"]), []).append(fault)
        if self._hub is not None:
            self._write = self._hub.send
            beat: Callable[[], None] = self._hub.beat
        else:
            self._fd = os.open(run_dir.rank_events(self.generation, self.rank),
                               os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._write = self._append
            path = self._heartbeat = run_dir.heartbeat(self.generation, self.rank)
            path.touch()
            supervisor = int(env.get(Env.SUPERVISOR_PID, 0))
            beat = functools.partial(_touch, path, supervisor, self)
        threading.Thread(target=_beat, args=(beat, self._beating), name="reshard-heartbeat",
                         daemon=True).start()
        if signal.getsignal(STACK_SIGNAL) == signal.SIG_DFL:   # the workload's own stays
            self._stacks = None if self._hub is not None else self._open_stacks(run_dir)
            faulthandler.register(STACK_SIGNAL, file=self._stacks or sys.stderr, all_threads=True)
        self.emit(Ev.START, world_size=self.world_size, role=self.role, pid=os.getpid(),
                   max_rewind_steps=max_rewind_steps)
        if plan.get("devices"):
            self._take_device(plan["devices"])
        if plan.get("files"):
            self.watch_files()
        if plan.get("keep_replaced"):
            self.watch_files().keep_replaced(run_dir.replaced(self.generation))

    def _record(self, folder: Path, env: Mapping[str, str], max_rewind_steps: int | None,
                digests: bool | None) -> None:
        """Record mode: the same events into ``folder``, one file for this process, and nothing
        else. No plan, no faults, no heartbeat, no supervisor to outlive; a SIGTERM is recorded
        and passed on (``_record_sigterm``): the job behaves as without the probe. A folder that
        cannot be written turns recording off (said once on stderr) rather than failing the
        job."""
        launcher, restart = _restart_count(env)
        host = socket.gethostname()
        t0 = time.time()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(folder / record_file(self.rank, host, os.getpid(), t0),
                               os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            print(f"pytest-reshard: not recording into {folder}: {e}", file=sys.stderr, flush=True)
            return
        self.active = True
        self.recording = folder
        self.generation = restart or 0
        self._digests = bool(digests) if digests is not None else \
            env.get(Env.RECORD_DIGESTS) == "1"
        self._write = self._append
        job = env.get("TORCHELASTIC_RUN_ID") if launcher == "torchrun" else env.get("SLURM_JOB_ID")
        steps = env.get(Env.STEPS)
        self.emit(Ev.START, world_size=self.world_size, role=self.role, pid=os.getpid(),
                  max_rewind_steps=max_rewind_steps, record=True, host=host, launcher=launcher,
                  restart=restart, launch=_launch_order(env), job=job,
                  local_rank=_int_or_none(env.get("LOCAL_RANK")),
                  steps=_int_or_none(steps), script=os.path.basename(sys.argv[0] or ""))
        self._record_sigterm()

    def _record_sigterm(self) -> None:
        """Record mode: put ``_on_sigterm`` in front of SIGTERM's disposition, so that a
        scheduler's preemption is in the recording (else a job that handles it and closes reads
        as complete). It passes the signal on: to the job's own handler, installed before or
        since (each step begins by putting it back in front), or, where none is, the default:
        the process dies of SIGTERM as it would without the probe. A handler installed outside
        Python cannot be passed on to and is left alone, as is any thread but the main one."""
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current is None or current == self._on_sigterm:
            return
        self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._sigterm_recorder = True

    def _open_stacks(self, run_dir: RunDir) -> Any:
        """The file this rank's stack dumps go to (else its output, the log)."""
        path = run_dir.stacks(self.generation, self.rank)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return open(path, "w")
        except OSError:
            return None

    def _take_device(self, entry: Mapping[str, Any]) -> None:
        """This rank's device class in a heterogeneous world: join the cgroup that caps its CPU
        time, or, without one, stretch each step by the class's slowness; on its own GPU,
        nothing."""
        if entry.get("mode") == OWN_GPUS:
            return
        group = (entry.get("cgroups") or [None] * (self.rank + 1))[self.rank]
        if group is not None:
            try:
                Path(group, "cgroup.procs").write_text(str(os.getpid()))
                return
            except OSError as e:
                self.note(STRETCHED, why=f"joining {group} failed: {e}")
        self._stretch = 1.0 / float(entry["speeds"][self.rank]) - 1.0

    # -- recording -------------------------------------------------------------------------
    def _append(self, line: bytes) -> None:
        """One event onto the events file. A file system that refuses it (full, read-only) must
        not end the training it watches: the loss is kept in ``lost`` for the heartbeat to
        report (``contract.lost_writes``), and the harness stops the run unjudged."""
        try:
            if os.write(self._fd, line) == len(line):
                return
            lost = errno.ENOSPC
        except OSError as e:
            lost = e.errno or errno.EIO
        if not self.lost:   # said at once: the rank may end before its next beat
            self.lost = lost
            if self._heartbeat is None:   # record mode: nobody reads a heartbeat
                return
            with contextlib.suppress(OSError):
                os.utime(self._heartbeat, (lost, time.time()))

    def emit(self, ev: Ev, **fields: Any) -> None:
        """Write one event of this rank (the executors' way to record what they did)."""
        fields.update(ev=ev, t=time.time(), gen=self.generation, rank=self.rank)
        self._write(encode_event(fields))

    def _emit_step(self, head: str, step: int, extra: str = "") -> None:
        """The per-step hot path: the same JSON as ``emit``, without ``json.dumps`` (20 us);
        ``head`` is the event's ready-made start (``_STEP_HEAD_*``)."""
        self._write(seal(f'{head}{int(step)}{extra},"t":{time.time()!r},'
                         f'"gen":{self.generation},"rank":{self.rank}}}'))

    def resumed(self, step: int, *, source: str = "checkpoint",
                max_rewind_steps: int | None = None) -> None:
        """Declare the first step this generation will run (0 for a fresh start).

        ``source`` says where the state came from, for the report (free text: ``"fresh"``,
        ``"checkpoint"``, ``"emergency"`` for a snapshot taken after a failure, ...); the
        checkers judge the step, not the source. ``max_rewind_steps`` may be declared here instead
        of at ``attach`` when the budget depends on what the workload found (a pipeline's count of
        replicated ranks, say)."""
        if self.active:
            self.emit(Ev.RESUMED, step=int(step), source=source, max_rewind_steps=max_rewind_steps)

    @contextmanager
    def step(self, step: int) -> Iterator[Step]:
        """Wrap one training step; its end is recorded only if the body completes."""
        s = self.begin_step(step)
        try:
            yield s
        except BaseException as e:
            self.end_step(error=e)
            raise
        self.end_step()

    def begin_step(self, step: int) -> Step:
        """Begin ``step`` without a ``with`` block, for frameworks that call back at a step's
        edges (``on_step_begin``); end it with ``end_step``. Faults planned at ``begin`` fire."""
        s = self._open = Step(self, step)
        s.t0 = time.monotonic()
        self._last_step = step
        if self.active:
            if self.recording is not None:   # the job may have installed its own since
                self._record_sigterm()
            self._emit_step(_STEP_HEAD_BEGIN, step)
            if self._faults:
                self._fire(step, "begin")
        return s

    def end_step(self, error: BaseException | str | None = None) -> None:
        """End the step ``begin_step`` began: recorded as ended (faults planned at ``end`` fire
        first), or, with ``error``, as failed at the phase it had reached."""
        s, self._open = self._open, None
        if s is None:
            raise RuntimeError("end_step() without begin_step(): begin each step first")
        if not self.active:
            return
        if error is not None:
            text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            self.emit(Ev.ERROR, step=s.step, phase=s.phase, error=text[:500])
            return
        if self._stretch:   # the slower device's extra time, before the step ends
            time.sleep(self._stretch * (time.monotonic() - s.t0))
        if self._faults:
            self._fire(s.step, "end")
        self._emit_step(_STEP_HEAD_END, s.step)

    def point(self, phase: str, *, step: int) -> None:
        """Mark a fault point of ``step`` outside its ``with`` block: a save between two steps
        (``run.point("checkpoint", step=step)`` before writing, ``"checkpoint_commit"`` before
        the commit), where ``kill_during_save`` and any fault planned at that phase fire."""
        Step(self, step).point(phase)

    def checkpoint_saved(self, step: int, state_digest: Mapping[str, str] | None = None, *,
                         per_rank: Sequence[str] | str = (), state: Mapping[str, Any] | None = None,
                         **info: Any) -> None:
        """Record a completed save of the state after ``step``.

        ``state_digest``: ``{component: probe.digest(obj)}`` of what was written (model,
        optimizer, step, lr_schedule, data, rng, ema, ...), taken of exactly the objects saved.
        Or ``state={component: obj}``: the probe digests each object now (a module or optimizer
        by its ``state_dict()``). Ranks that hold nothing of their own may record no digest.

        ``per_rank``: the components that are this rank's own and differ between ranks (its RNG
        stream, its data-loader worker position, a ZeRO optimizer shard): each rank's load of
        one is compared with what *that* rank saved. Every other component is replicated: a
        rank's load is compared with what any rank (the lowest that recorded it) saved, so rank
        0 alone may save and record it. ``info``: anything else worth keeping (``seconds``,
        ``bytes``, ``world_size``...)."""
        self._checkpoint(Ev.CKPT_SAVE, step, state_digest, per_rank, state, info)

    def checkpoint_saving(self, step: int, state_digest: Mapping[str, str] | None = None, *,
                          per_rank: Sequence[str] | str = (), state: Mapping[str, Any] | None = None,
                          **info: Any) -> None:
        """Record that this rank begins writing its part of a save of the state after ``step``,
        with the digests of what it is about to write (as for ``checkpoint_saved``). A rank
        killed inside the save never records the save itself; with this record
        ``state_equivalence`` can still judge what a resume restored of that rank's own
        (``per_rank``) state, instead of saying unknown."""
        self._checkpoint(Ev.CKPT_SAVING, step, state_digest, per_rank, state, info)

    def checkpoint_loaded(self, step: int, state_digest: Mapping[str, str] | None = None, *,
                          per_rank: Sequence[str] | str = (), state: Mapping[str, Any] | None = None,
                          **info: Any) -> None:
        """Record a completed load of the state saved after ``step``.

        Call it right after the restore returns (every ``load_state_dict`` and
        ``set_rng_state`` done) and before anything else touches that state: before building the
        data iterator (``iter(dataloader)`` draws from the RNG), a warm-up forward, the LR
        scheduler's first step, or the first ``run.step``. A digest taken later measures what
        followed the restore: ``state_equivalence`` says ``unknown`` (never fail) for a digest
        recorded after the rank began a step, or for an RNG that differs at a resume that starts
        an epoch (``s.record(epoch=...)``), but fails anything else that changed in between. The
        first digest a rank records for a step and component counts.

        ``state_digest``/``state``: as for ``checkpoint_saved``, of the same components under
        the same names; ``state={...}`` lets the probe take the digest itself at this call, of
        the live objects. ``per_rank``: as for ``checkpoint_saved`` (declared at either end).
        A component saved but not loaded back, or loaded but never saved, fails the check:
        record only what was really restored. ``expected=``: the digest of what was read, when
        no save of this step was recorded. ``digest_at="restore"``: the workload vouches that the
        digest was taken at the restore itself (the framework adapters do), so an RNG that
        differs at an epoch's start is a fail, not an unknown."""
        self._checkpoint(Ev.CKPT_LOAD, step, state_digest, per_rank, state, info)

    def state_after(self, step: int, state_digest: Mapping[str, str] | None = None, *,
                    state: Mapping[str, Any] | None = None) -> None:
        """Record the live state after ``step``'s update, as a save of that step would hold it
        (the same components, digested the same way as for ``checkpoint_saved``).

        With these records ``one_step_checkpoint`` names the step each loaded component really
        belongs to: a save that copies the state while training goes on (an asynchronous
        writer given live tensors) holds the weights of a later step under the counters of the
        step it was saved at. A digest each step costs a pass over the state: record it in
        runs that judge asynchronous or multi-call saves."""
        self._checkpoint(Ev.STATE, step, state_digest, (), state, {})

    def _checkpoint(self, ev: Ev, step: int, state_digest: Mapping[str, str] | None,
                    per_rank: Sequence[str] | str, state: Mapping[str, Any] | None,
                    info: dict[str, Any]) -> None:
        """A save's or load's event: the digests given, and those of ``state`` taken now."""
        if not self.active:
            return
        digests = dict(state_digest or {})
        # a module or optimizer: its state, not its repr (record mode: only when asked)
        for name, obj in (state or {}).items() if self._digests else ():
            if not isinstance(obj, Mapping) and callable(getattr(obj, "state_dict", None)):
                obj = obj.state_dict()
            digests[str(name)] = digest(obj)
        if state and not self._digests:   # said, so a verdict can say why it has no digest
            info["undigested"] = sorted(str(name) for name in state)
        names = [per_rank] if isinstance(per_rank, str) else list(per_rank)
        if names:
            info["per_rank"] = sorted({str(n) for n in names})
        self.emit(ev, step=int(step), digest=digests, **info)

    def request_reshard(self, to_world_size: int, *, reason: str, grace_s: float = 30.0) -> None:
        """Ask the harness to restart at ``to_world_size`` once this generation exits: a drain
        the workload decided on (its health monitor saw an ECC error, say). Any rank may call it
        (once is enough); the harness drops ranks from the end of the rank order, keeping each
        role's last rank. Checkpoint, then exit cleanly within ``grace_s``; it counts as planned,
        so it must cost zero committed steps."""
        if self.active:
            self.emit(Ev.REQUEST, kind="reshard", to_world_size=int(to_world_size),
                       reason=reason, grace_s=float(grace_s))

    def live_reshard(self, step: int) -> LiveChange | None:
        """Ask the harness to do the pending planned reshard in these processes, after ``step``
        (every rank of the world asks, at the same step; ``reshard_requested()`` said there is
        one). It answers with the new world: who stays at which rank, a fresh rendezvous store,
        and it starts the processes that join (they find the change in ``run.joining``). Then
        hand the state over: a survivor calls ``rejoin``, a leaver ``close`` and exits.

        Waits until the notice's deadline at most. Raises RuntimeError with the harness's
        reason when it cannot (a launcher that does not keep processes across generations).
        None outside the harness, which has no reshard to do."""
        if not self.active or self.recording is not None:
            return None
        if self._hub is not None:
            raise RuntimeError("a live reshard needs the ranks on this machine (launcher fork or "
                               "local), not on another one")
        self.emit(Ev.LIVE, step=int(step))
        path = self._dir.live(self.generation)
        deadline = self._notice.deadline if self._notice else time.time() + LIVE_WAIT_S
        while not path.exists():
            if time.time() > deadline:
                raise RuntimeError(f"no answer from the harness to the live reshard after step "
                                   f"{step} before the notice's deadline ({path} missing)")
            time.sleep(0.002)
        answer = LiveChange.read(path, rank=None)
        survivors = answer.survivors
        return replace(
            answer, rank=survivors.index(self.rank) if self.rank in survivors else None)

    def rejoin(self, change: LiveChange) -> "Run":
        """Go on as rank ``change.rank`` of the new world, in this process: record that this
        rank handed over (its part of this generation ended, the process did not), point the
        environment at the new world (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
        ``MASTER_PORT``, the generation) and return the new generation's Run. Call it after
        the old process group is destroyed and before the new one is formed."""
        if not self.active:
            return self
        if change.rank is None:
            raise ValueError(f"rank {self.rank} leaves in this change: call run.close() and exit")
        self.emit(Ev.EXIT, code=0, peak_rss=procfs.peak_rss("self"),
                   moved_to={"gen": change.generation, "rank": change.rank})
        self.active = False
        self._beating.set()
        if self._fd >= 0 and not self._files_watched:
            os.close(self._fd)  # its number may be the next Run's file: nothing writes here now
            self._fd = -1
            self._write = lambda data: None
        os.environ.update({"RANK": str(change.rank), "WORLD_SIZE": str(change.world_size),
                           "LOCAL_WORLD_SIZE": str(change.world_size),
                           "MASTER_ADDR": change.master_addr,
                           "MASTER_PORT": str(change.master_port),
                           Env.GENERATION: str(change.generation)})
        os.environ.pop(Env.JOIN, None)
        max_rewind_steps, role = self._attached
        new = attach(max_rewind_steps=max_rewind_steps, role=role)
        if self._sigterm_handled:
            new.stop_requested()
        new._stop = new._stop or self._stop  # a SIGTERM that landed during the handover
        return new

    def note(self, what: str, **fields: Any) -> None:
        """Record a free-form event (shown in the timeline, ignored by checkers)."""
        if self.active:
            self.emit(Ev.NOTE, what=what, **fields)

    def expose(self, *, model: Any = None, optimizer: Any = None) -> None:
        """Name the model and optimizer whose tensors a ``bitflip`` fault may corrupt (a
        parameter, its gradient, an optimizer moment). Without it a bitflip cannot fire."""
        self._exposed = {"model": model, "optimizer": optimizer}

    def exposed(self) -> dict[str, Any]:
        """What ``expose`` named (executors: ``bitflip``)."""
        return dict(self._exposed)

    def detected(self, kind: str, step: int, detail: str = "") -> None:
        """Record that the workload's own check caught corrupted state at ``step`` (a replica
        checksum that disagrees, a NaN loss): ``kind`` names the check. A rank that then stops
        the job is judged as stopped by its guard, not as an unexplained death, and a save it
        records after this is not "unnoticed" (``silent_corruption``)."""
        if self.active:
            self.emit(Ev.NOTE, what=GUARD, kind=str(kind), step=int(step), detail=str(detail))

    def advise(self, check: str, text: str) -> None:
        """Tell the verdict of ``check`` (a checker's name) what to do in this workload's own
        terms: a framework adapter that knows why a resume went wrong says how to fix it in that
        framework. The checker's message then gives it instead of its generic advice."""
        if self.active:
            self.emit(Ev.NOTE, what=ADVICE, check=str(check), text=str(text))

    def memory(self, peak_bytes: int, *, budget_bytes: int | None = None,
               reserved_bytes: int | None = None) -> None:
        """The workload's device memory: its peak allocated (``torch.cuda.max_memory_allocated``),
        the device's size, and the allocator's peak reserved (``max_memory_reserved``)."""
        if self.active:
            self.emit(Ev.MEMORY, peak=int(peak_bytes), budget=budget_bytes,
                      **({"reserved": int(reserved_bytes)} if reserved_bytes is not None else {}))

    def close(self) -> None:
        """Record a clean exit. Call it last, after the final save, then end the script as
        you normally would. A rank that recorded it after its last step is a clean exit whatever
        happens next: a teardown that aborts at interpreter exit (FSDP2's "terminate called
        without an active exception") is not a failure."""
        if self.active:
            # The rank's own peak: the supervisor samples it every 20 ms only while it lives. A
            # SIGTERM flag that something replaced since would not have recorded a SIGTERM.
            replaced = ((self._sigterm_handled or self._sigterm_recorder)
                        and signal.getsignal(signal.SIGTERM) != self._on_sigterm)
            self.emit(Ev.EXIT, code=0, peak_rss=procfs.peak_rss("self"),
                       memory=procfs.memory_sets("self"),
                       **({"sigterm_replaced": True} if replaced else {}))
            self.active = False
            # An async save's last files are still recorded when files are watched; a hub's
            # connection stays open until the process ends (its closing is the end).
            if self._fd >= 0 and not self._files_watched:
                os.close(self._fd)
                self._fd = -1
                self._write = lambda data: None
            if self._sigterm_recorder and not self._sigterm_handled and not replaced \
                    and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._previous_sigterm)   # as it was before
                self._sigterm_recorder = False

    def watch_files(self) -> "Watcher":
        """Record the file events under the work folder from now on (``filewatch``) and return
        the watcher, which an executor may arm (``kill_at_file_event``). Idempotent."""
        from pytest_reshard.rank.filewatch import install

        assert self.workdir is not None, "watch_files needs an active Run"
        self._files_watched = True
        return install(self.workdir, self._emit_file, lambda: self._last_step)

    def _emit_file(self, **fields: Any) -> None:
        self.emit(Ev.FILE, **fields)  # after close(), too: an async save may finish at exit

    # -- planned events --------------------------------------------------------------------
    def reshard_requested(self) -> ReshardNotice | None:
        """The pending planned reshard, if any: checkpoint and exit before its deadline."""
        return self._notice

    def stop_requested(self) -> bool:
        """True once SIGTERM arrived (a preemption): checkpoint and exit within the grace period.

        The first call installs the SIGTERM flag, in the harness and in production alike: from
        then on SIGTERM sets it (and still calls a handler of your own installed before) instead
        of ending the process. A script that never asks keeps the default, and dies on SIGTERM
        exactly as it would on a spot node. Ask once before the training loop to be covered from
        the first step."""
        if not self._sigterm_handled and threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            if previous != self._on_sigterm:   # record mode's: what it passes on to stays
                self._previous_sigterm = previous
            self._sigterm_handled = True
            if self.active:  # from here on a SIGTERM that lands is recorded (liveness asks)
                self.emit(Ev.SIGNAL, signal=PREEMPT_SIGNAL.name, armed=True)
        return self._stop

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._stop = True
        if self.active:
            line = encode_event({"signal": PREEMPT_SIGNAL.name, "ev": Ev.SIGNAL, "t": time.time(),
                                 "gen": self.generation, "rank": self.rank})
            if self._hub is not None:  # the interrupted code may hold the connection's lock
                self._hub.send_soon(line)
            else:
                self._write(line)
        if callable(self._previous_sigterm):
            self._previous_sigterm(signum, frame)
        elif (self._sigterm_recorder and not self._sigterm_handled
              and self._previous_sigterm == signal.SIG_DFL):
            # record mode only records: nobody asked for the flag, so it ends the process as
            # the default would have, by this same signal
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    # -- the executors' interface: what a fault kind's ``execute(run, fault)`` may use -------
    def power_off(self) -> None:
        """A power cut of this machine: every rank of the generation dies at once (SIGKILL,
        the peers found by the pids their start events recorded), this one last."""
        if self._hub is not None:
            raise FaultNotInjected("power_off needs the ranks' events in the run folder: a "
                                   "single-node launcher (fork, local or torchrun)")
        for rank in range(self.world_size):
            path = self._dir.rank_events(self.generation, rank)
            if rank == self.rank or not path.exists():
                continue
            pids = [e["pid"] for _, e in read_jsonl(path)[0] if name_of(e) == Ev.START]
            for pid in pids[-1:]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def hold(self, obj: Any) -> None:
        """Keep ``obj`` alive as long as this Run (``memory_pressure``'s allocation), so the
        memory it takes stays taken."""
        self._ballast.append(obj)

    def notify_reshard(self, notice: ReshardNotice) -> None:
        """Deliver a planned reshard's notice: ``reshard_requested()`` returns it from now on,
        and the ``notice`` event tells the supervisor its deadline."""
        self._notice = notice
        self.emit(Ev.NOTICE, kind=notice.kind, to_world_size=notice.to_world_size,
                  deadline=notice.deadline)

    def repeat_fault(self, fault: Mapping[str, Any], *, step: int,
                     params: Mapping[str, Any]) -> None:
        """Fire ``fault`` again at ``step`` (same phase) with ``params``: silently, since the
        repeat is part of the fault that already fired (``slow_rank`` over several steps)."""
        again = {**fault, "step": int(step), "repeat": True, "params": dict(params)}
        self._faults.setdefault((int(step), fault["phase"]), []).append(again)

    # -- in-process faults -----------------------------------------------------------------
    def _fire(self, step: int, phase: str) -> None:
        for fault in self._faults.pop((step, phase), ()):
            if not fault.get("repeat"):
                node = os.environ.get(Env.NODE)
                self.emit(Ev.FAULT, step=step, phase=phase, kind=fault["kind"], id=fault["id"],
                           params=fault["params"], **({} if node is None else {"node": int(node)}))
            try:
                _executor(fault)(self, fault)
            except FaultNotInjected as e:
                self.emit(Ev.NOTE, what=NOT_INJECTED, step=step, fault_id=fault["id"],
                          reason=str(e))
                raise


def _beat(beat: Callable[[], None], stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        beat()


def _touch(path: Path, supervisor: int, run: Run) -> None:
    """A local heartbeat: the file's mtime, and its atime the errno of events it could not write
    (``contract.lost_writes``); a rank whose supervisor is gone ends itself."""
    if supervisor and not procfs.alive(supervisor):
        os._exit(ORPHAN_EXIT)
    try:
        os.utime(path, (run.lost, time.time()) if run.lost else None)
    except OSError:
        pass


class _HubLink:
    """A rank's connection to a harness on another machine (``contract.HUB_PROTOCOL``)."""

    def __init__(self, address: str, gen: int, rank: int, secret: str) -> None:
        host, _, port = address.rpartition(":")
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=10)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{Env.HUB}={address}: no harness answered there within "
                                       f"{CONNECT_S:.0f} s ({e}); is that address reachable "
                                       "from this node?") from None
                time.sleep(0.1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()
        self._soon: collections.deque[bytes] = collections.deque()  # from signal handlers
        self._forked = False
        hello = {"hello": "rank", "protocol": HUB_PROTOCOL, "gen": gen, "rank": rank,
                 "pid": os.getpid(), "t": time.time()}
        deadline = time.monotonic() + HELLO_S
        try:  # one reader of the socket (``hub_line``) until the plan is in
            buf = hub_hello(self._sock, hello, secret, deadline)
            reply = hub_line(self._sock, buf, deadline, f"plan of generation {gen}")
        except (OSError, ValueError, RuntimeError) as e:
            self._sock.close()
            raise RuntimeError(f"{Env.HUB}={address}: {e}") from None
        self.plan: dict[str, Any] = json.loads(reply)
        self._sock.settimeout(None)  # blocking from here on: each send goes out whole
        os.register_at_fork(after_in_child=self._in_child)

    def send(self, data: bytes) -> None:
        if self._forked:
            return  # a forked child (a data-loader worker) is not the rank
        try:
            with self._lock:  # the heartbeat thread writes too: whole lines only
                while self._soon:
                    self._sock.sendall(self._soon.popleft())
                self._sock.sendall(data)
        except OSError:
            os._exit(ORPHAN_EXIT)  # the harness is gone, as a local rank's supervisor can be

    def send_soon(self, data: bytes) -> None:
        """From a signal handler: the code it interrupted may be inside ``send``, holding the
        lock, so the line goes with the next send or heartbeat (within 0.1 s), never mid-line."""
        self._soon.append(data)

    def beat(self) -> None:
        """A blank line; the harness gone (end of file) ends the rank."""
        try:
            if self._sock.recv(1, socket.MSG_DONTWAIT) == b"":
                os._exit(ORPHAN_EXIT)
        except BlockingIOError:
            pass
        except OSError:
            os._exit(ORPHAN_EXIT)
        self.send(b"\n")

    def _in_child(self) -> None:
        """A forked child must not hold the connection open: its closing is the rank's end."""
        self._forked = True
        os.close(self._sock.detach())


_QUOTED: dict[str, str] = {}


def _quoted(text: str) -> str:
    q = _QUOTED.get(text)
    if q is None:
        q = _QUOTED[text] = json.dumps(text)
    return q


def _number(x: float) -> str:
    """A JSON number; NaN and infinities as Python's json module writes (and reads) them."""
    return repr(x) if x == x and x not in (float("inf"), float("-inf")) else json.dumps(x)


# Each fault's executor runs inside the rank at the exact fault point; the plan names it as
# "module:function" (a kind's declaration in pytest_reshard.chaos, or a user's), with the file to
# load it from when its module is not importable here. The supervisor sees the `fault` event
# written just before and enforces what must come from outside (deadlines, SIGKILL after grace).
_EXECUTORS: dict[str, Callable[[Run, Mapping[str, Any]], None]] = {}


def _executor(fault: Mapping[str, Any]) -> Callable[[Run, Mapping[str, Any]], None]:
    name = fault.get("execute") or f"pytest_reshard.chaos.{fault['kind']}:execute"
    fn = _EXECUTORS.get(name)
    if fn is None:
        import importlib
        import importlib.util

        module_name, _, attr = name.partition(":")
        path = fault.get("execute_file")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            if not path:
                raise
            module = None
        if path and (module is None or os.path.realpath(getattr(module, "__file__", "") or "")
                     != os.path.realpath(path)):
            # Not importable here under that name (a conftest, a script's __main__), or another
            # module of that name: load the file the kind was declared in.
            spec = importlib.util.spec_from_file_location(f"_reshard_fault_{fault['kind']}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"fault kind {fault['kind']!r}: cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        target: Any = module
        for part in attr.split("."):
            target = getattr(target, part)
        fn = _EXECUTORS[name] = target
    return fn


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (``procfs.children``; kept here for executors)."""
    return procfs.children(pid)


_RUN: Run | None = None


def generation_of(env: Mapping[str, str]) -> int:
    """The generation a rank belongs to: the launcher's, plus torch's restart count when elastic
    agents restart the ranks on their own (each restart is a new rendezvous round)."""
    gen = int(env.get(Env.GENERATION, 0))
    if env.get(Env.ELASTIC) == "1":
        gen += int(env.get("TORCHELASTIC_RESTART_COUNT", 0))
    return gen


def _restart_count(env: Mapping[str, str]) -> tuple[str | None, int | None]:
    """The launcher that restarts this job's processes and how often it has (record mode):
    torchrun's agent (``TORCHELASTIC_RESTART_COUNT``), else SLURM's requeue
    (``SLURM_RESTART_COUNT``); ``(None, None)`` when neither says."""
    for launcher, name, present in (("torchrun", "TORCHELASTIC_RESTART_COUNT",
                                     "TORCHELASTIC_RUN_ID"),
                                    ("slurm", "SLURM_RESTART_COUNT", "SLURM_JOB_ID")):
        if name in env or present in env:
            return launcher, _int_or_none(env.get(name, "0"))
    return None, None


def _launch_order(env: Mapping[str, str]) -> list[int] | None:
    """Where this launch falls in its job (record mode): SLURM's requeue count, then its job
    step (each ``srun`` of a retry loop in one batch job is a step of its own), then torchrun's
    restart count (its agent restarts inside one step); None where no launcher says."""
    if "SLURM_JOB_ID" not in env and "TORCHELASTIC_RUN_ID" not in env:
        return None
    return [_int_or_none(env.get(name)) or 0 for name in
            ("SLURM_RESTART_COUNT", "SLURM_STEP_ID", "TORCHELASTIC_RESTART_COUNT")]


def _int_or_none(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _read_plan(path: Path, *, elastic: bool) -> dict[str, Any]:
    """The generation's plan. An elastic restart can start its ranks before the supervisor has
    seen the previous generation end and written this plan: wait for it (bounded)."""
    deadline = time.monotonic() + (PLAN_WAIT_S if elastic else 0.0)
    while True:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def attach(*, max_rewind_steps: int | None = None, role: str | None = None,
           record: str | os.PathLike[str] | None = None, digests: bool | None = None) -> Run:
    """Connect to the harness (from the environment the launcher set); a no-op Run outside it.

    ``max_rewind_steps``: how many committed steps an *unplanned* failure may cost this workload
    (0 for in-memory redundancy, the checkpoint interval otherwise). Planned reshards and
    preemptions must always cost zero.

    ``record``: outside the harness, record this process's events into that folder (record
    mode, as ``RESHARD_RECORD=DIR`` does) for ``pytest-reshard judge DIR``; nothing else of the
    harness happens (no plan, no faults, no heartbeat; a SIGTERM is recorded and passed on as
    it was). ``digests``: in record mode, digest the ``state=`` given to ``checkpoint_saved``/
    ``checkpoint_loaded`` (default off: a digest is a pass over the state;
    ``RESHARD_RECORD_DIGESTS=1`` turns it on).
    """
    global _RUN
    if _RUN is None or _RUN._key != (generation_of(os.environ), int(os.environ.get("RANK", 0))) \
            or (record is not None and not _RUN.active):   # an adapter attached first, unrecorded
        _RUN = Run(max_rewind_steps=max_rewind_steps, role=role, record=record, digests=digests)
    return _RUN
