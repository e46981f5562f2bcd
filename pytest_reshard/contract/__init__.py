"""The contract between a rank's probe, the supervisor and every reader of a run (standard library only).

Three things cross process boundaries, so each is spelled out once, here:

- **the environment** the launcher gives a rank (``Env``);
- **the run folder**: where the plan, the events, the heartbeats, the logs and the workload's own
  files live (``RunDir``);
- **the events**: one JSON object per line, ``{"ev": NAME, "t": seconds, ..., "#": CRC}``, the
  last member a CRC-32 of the line without it (``encode_event``, ``decode_event``), so that a line
  changed after it was written (a flipped bit, a partial write on a full disk, another writer) is
  reported rather than judged. A rank writes
  ``events/g{gen}-r{rank}.jsonl`` and every rank event carries ``gen`` and ``rank``; the supervisor
  writes ``events/supervisor.jsonl``. ``Ev`` names them; ``RANK_EVENTS``, ``STEP_EVENTS`` and
  ``SUPERVISOR_EVENTS`` say which file holds them and which need a ``step``.

The probe imports this module and nothing else of the harness: a training script that imports the
probe must not import the supervisor, torch or pytest.
"""
from __future__ import annotations

import binascii
import enum
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import sys
import time
import zlib
from array import array
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, Mapping

__all__ = ["Env", "Ev", "Cause", "DEVICE_CLASSES", "DeviceClass", "OWN_GPUS", "visible_gpus",
           "Detected", "MemberAction", "FileOp", "FileKill", "Refusal", "MUTATIONS", "OUTSIDE",
           "RunDir", "ADVICE", "GUARD", "FLIPPED", "LINK_CHANGED", "NOT_INJECTED", "STRETCHED",
           "STACK_SIGNAL", "PREEMPT_SIGNAL",
           "RANK_EVENTS", "STEP_EVENTS", "SUPERVISOR_EVENTS",
           "RANK_FILE", "RECORD_FILE", "record_file", "HUB_PROTOCOL",
           "hub_mac", "hub_secret", "hub_hello", "hub_line", "Torn", "Damaged", "read_jsonl",
           "write_json", "encode_event", "seal", "decode_event", "name_of", "lost_writes"]


class Env:
    """Environment variables a launcher sets for a rank (besides torchrun's own RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT)."""

    DIR = "RESHARD_DIR"                    # the run folder (``RunDir``); its presence activates the probe
    GENERATION = "RESHARD_GENERATION"      # the generation this launch belongs to
    SUPERVISOR_PID = "RESHARD_SUPERVISOR_PID"  # a rank whose supervisor is gone ends itself
    ELASTIC = "RESHARD_ELASTIC"            # "1": torchrun agents restart the ranks on their own
    BACKEND = "RESHARD_BACKEND"            # gloo | nccl, as the scenario asks
    STEPS = "RESHARD_STEPS"                # the scenario's step count
    ROLE = "RESHARD_ROLE"                  # this rank's role ("trainer", "target", "drafter", ...)
    PORT_RANGE = "RESHARD_PORT_RANGE"      # LO-HI: ports the harness may pick (one range per xdist worker)
    HUB = "RESHARD_HUB"                    # HOST:PORT: the rank is on another machine and reports over TCP
    HUB_SECRET = "RESHARD_HUB_SECRET"      # the run's secret for the hub's challenge (never on a command line)
    NODE = "RESHARD_NODE"                  # the node (agent) a rank runs under, when agents start the ranks
    SCHEDULER = "RESHARD_SCHEDULER"        # "slurm": the scheduler delivers preemptions, not the rank itself
    JOIN = "RESHARD_JOIN"                  # a rank started to join a live reshard: the generation it changes
    RECORD = "RESHARD_RECORD"              # record mode: a folder the probe records into, outside the harness
    RECORD_DIGESTS = "RESHARD_RECORD_DIGESTS"  # "1": record mode digests checkpoint state= too (off: cheap)
    PREFIX = "RESHARD_"                    # none of ours leaks from the harness's own environment


class Ev(str, enum.Enum):
    """Event names. Rank events first (written by the probe), then the supervisor's. A str, so an
    event read back as text compares equal to its name."""

    START = "start"            # attached: world_size, role, pid, max_rewind_steps
    RESUMED = "resumed"        # the first step this generation runs: step, source, max_rewind_steps
    BEGIN = "begin"            # a step began: step
    POINT = "point"            # a fault point inside a step: step, phase
    RECORD = "record"          # what a step measured: step, loss, samples, epoch, tokens, ...
    END = "end"                # a step's body completed: step
    ERROR = "error"            # a step raised: step, phase, error
    FAULT = "fault"            # a fault fired here: step, phase, kind, id, params, node (under a node's agent)
    NOTICE = "notice"          # a planned reshard's notice reached the rank: kind, to_world_size, deadline
    SIGNAL = "signal"          # a signal the probe saw: signal
    REQUEST = "request"        # the workload asks to drain: to_world_size, reason, grace_s
    CKPT_SAVING = "ckpt_saving"  # a rank begins writing its part of a save: step, digest (of
                                 # what it is about to write)
    CKPT_SAVE = "ckpt_save"    # a completed save of the state after step: step, digest
    CKPT_LOAD = "ckpt_load"    # a completed load of that state: step, digest
    STATE = "state"            # the live state after a step's update: step, digest (of each
                               # component as a save of that step would hold it)
    MEMORY = "memory"          # the workload's device memory: peak, budget, reserved
    NOTE = "note"              # free-form: what, ... (the allocator's statistics, for one)
    EXIT = "exit"              # a clean exit (run.close()): code, peak_rss, memory (uss, pss, anon)
    FILE = "file"              # a file event under the work folder: op, path, n, at_step, ... (filewatch)
    LIVE = "live"              # the rank asks to reshard in place after step: step (``Run.live_reshard``)

    SCENARIO = "scenario"      # what the run was asked to do (the Scenario's fields, schedule_hash, replay)
    GEN_START = "gen_start"    # gen, world_size, roles, launcher, port
    GEN_END = "gen_end"        # gen, cause, planned, fault_id, detail
    DETECT = "detect"          # gen, kind, rank, step, phase, exit_code, latency_s, expected
    UNFIRED = "unfired"        # a scheduled fault that never fired: fault_id, detail
    ABORT = "abort"            # the supervisor gave up: detail
    RSS = "rss"                # gen, rank, peak_bytes, budget_bytes
    DELIVER = "deliver"        # a scheduler delivers a planned fault (SLURM's scancel): gen, fault_id, kind, grace_s
    MEMBER = "member"          # membership mode: action (a ``MemberAction``) and its fields
    DEVICES = "devices"        # a heterogeneous world's generation: gen, classes, speeds (relative to
                               # an H100, in every generation), mode, why, cpus (the caps enforced)
    NODES = "nodes"            # a multi-node launcher's machines: elastic's network; slurm's allocation
                               # (job, nodes), each step (gen, name, nodes)
    POWER_LOSS = "power_loss"  # what a power loss took (``supervisor/power.py``): gen, renames_undone,
                               # removed, cut, reasons, not_judged, problems
    HUB = "hub"                # what the hub kept out: refused (reason, host, count), dropped (peer,
                               # reason, count): lines of an authenticated peer it could not accept

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class DeviceClass:
    """A device class of a heterogeneous world (``Scenario.devices``)."""

    name: str
    speed: float        # dense BF16 throughput relative to an H100 SXM (the vendors' datasheets)
    memory_gib: int


#: H100 SXM 989 dense BF16 TFLOPS (an H200 the same, with more memory), A100 312, L40S 362;
#: memory as sold (A100 in its 80 GB form).
DEVICE_CLASSES = {c.name: c for c in (DeviceClass("h100", 1.0, 80), DeviceClass("a100", 0.32, 80),
                                      DeviceClass("l40s", 0.37, 48), DeviceClass("h200", 1.0, 141))}
#: ``devices="gpu"``: each rank's class is read from the GPU it computes on, and nothing slows it
#: (also the ``mode`` its ``devices`` event records).
OWN_GPUS = "gpu"


class Detected(str, enum.Enum):
    """What the supervisor noticed about a rank (``detect``'s ``kind``)."""

    DIED = "died"                  # exited non-zero (a signal, an exception)
    STOPPED = "stopped"            # alive, heartbeat silent, the kernel says stopped
    STALLED = "stalled"            # alive and beating, but no rank made progress
    EXITED_EARLY = "exited_early"  # exit code 0 before the last step, nothing planned
    OOM = "oom"                    # past the scenario's memory budget: killed
    PARTITIONED = "partitioned"    # its node was cut off the network: fenced (killed)

    def __str__(self) -> str:
        return self.value


class MemberAction(str, enum.Enum):
    """What a ``member`` event records (membership mode, ``supervisor/policies/membership.py``)."""

    GROUPS = "groups"                # the replica groups: groups, per
    LIGHTHOUSE = "lighthouse"        # the Lighthouse the supervisor hosts: address, settings
    RESTART = "restart"              # a group restarted: gen, group, ranks, incarnation, cause, codes, delay_s
    PREEMPT = "preempt"              # a preemption of some groups: gen, groups, grace_s
    GRACE_EXPIRED = "grace_expired"  # a preempted group outlived its grace: killed
    DROPPED = "dropped"              # a restart still pending when the others finished
    EXHAUSTED = "exhausted"          # the restart budget is spent: the death ends the generation

    def __str__(self) -> str:
        return self.value


class FileOp(str, enum.Enum):
    """A ``file`` event's ``op`` (``filewatch``): what the rank did to a file under the work folder."""

    MKDIR = "mkdir"
    OPEN = "open"
    WRITE = "write"
    FSYNC = "fsync"
    CLOSE = "close"
    RENAME = "rename"
    SYMLINK = "symlink"
    LINK = "link"
    TRUNCATE = "truncate"
    COPY = "copy"
    UNLINK = "unlink"
    RMDIR = "rmdir"
    RMTREE = "rmtree"
    READ = "read"      # a read of a file a save wrote (the load side)
    FLIP = "flip"      # a bit the harness flipped (``kill_at_file_event(mode="flip")``)

    def __str__(self) -> str:
        return self.value


class FileKill(str, enum.Enum):
    """How a file-event fault hits its event: a file event's ``killed`` (and a sweep point's
    mode). ``FLIP`` kills later, at the next save, after flipping a byte of the closed file."""

    BEFORE = "before"  # SIGKILL before the event happens
    TORN = "torn"      # a write cut after some of its bytes
    FLIP = "flip"      # a byte of a closed file flipped (``kill_at_file_event(mode="flip")``)
    POWER = "power"    # the machine's power cut before the event (``power_loss``)

    def __str__(self) -> str:
        return self.value


#: The path a file event records for a file outside the work folder (a copy's or rename's
#: other end).
OUTSIDE = "(outside)"

#: The file ops a kill may target, in the order a save usually does them.
MUTATIONS = (FileOp.MKDIR, FileOp.OPEN, FileOp.WRITE, FileOp.FSYNC, FileOp.CLOSE, FileOp.RENAME,
             FileOp.SYMLINK, FileOp.LINK, FileOp.TRUNCATE, FileOp.COPY, FileOp.UNLINK,
             FileOp.RMDIR, FileOp.RMTREE)


#: The signal on which a rank's Python dumps every thread's stack into its log (``faulthandler``,
#: registered by the probe where the workload left the signal alone): the supervisor sends it to
#: a stalled rank before it kills it, so the verdict shows where the rank was stuck.
STACK_SIGNAL = signal.SIGUSR2
#: The signal a scheduler preempts with (SLURM, Kubernetes, a spot reclaim); a rank's ``signal``
#: event names it (``PREEMPT_SIGNAL.name``) when it lands.
PREEMPT_SIGNAL = signal.SIGTERM

#: A rank's note (``run.advise``) that tells one checker's verdict what to do in the workload's
#: own terms: ``check`` (the checker's name) and ``text``.
ADVICE = "advice"
#: A rank's note (``run.detected``) that its own check caught corrupted state: ``kind`` (what the
#: check is: ``"sdc"``, ``"nan"``), ``step``, ``detail``.
GUARD = "guard"
#: A rank's note of what a ``bitflip`` changed: ``tensor``, ``name``, ``index``, ``bit``,
#: ``before``, ``after``.
FLIPPED = "flipped"
#: A rank's note that a fault changed its node's link (``partition``, ``slow_link``) and every
#: command went in: ``fault_id``, ``node``, ``duration_s`` (None: to the end of the run). Only
#: after it does the supervisor treat the node as cut off.
LINK_CHANGED = "link_changed"
#: A rank's note that a fault fired but its injector could not make it here
#: (``FaultNotInjected``): ``fault_id``, ``reason``. What follows is not the fault's doing.
NOT_INJECTED = "not_injected"
#: A rank's note that it could not join the cgroup that caps it to its device class and stretches
#: its steps instead (``supervisor/devices.py``): ``why``. Its compute time then hides its class.
STRETCHED = "device_stretched"


class Refusal(str, enum.Enum):
    """Why the hub refused a connection, or dropped a line of a peer that passed its challenge
    (``Ev.HUB``). The value is the report's wording."""

    BAD_CREDENTIALS = "bad credentials"     # the answer to the challenge was wrong (a forged or replayed hello)
    NO_CREDENTIALS = "no credentials"       # no answer to the challenge (a peer without the run's secret)
    PROTOCOL = "another protocol"           # a hello of another ``HUB_PROTOCOL`` (another pytest-reshard)
    MALFORMED = "malformed line"            # not a JSON object, or a field of the wrong type
    TOO_LONG = "line too long"              # past the hub's line limit
    SLOW = "no hello in time"               # the challenge not answered within the hub's hello deadline
    TOO_MANY = "too many connections"       # past the hub's connection limit
    CLOSED = "closed before the hello"      # the peer went away before it answered the challenge

    def __str__(self) -> str:
        return self.value


class Cause(str, enum.Enum):
    """How a generation ended (``gen_end``'s ``cause``). A str, so it compares and serialises as
    its value."""

    COMPLETE = "complete"      # the last step ran
    RESHARD = "reshard"        # a planned reshard (shift_shards): notice, save, exit
    REBALANCE = "rebalance"    # a planned new placement at the same size
    PREEMPT = "preempt"        # SIGTERM with a grace period
    DRAIN = "drain"            # the workload asked to restart smaller (run.request_reshard)
    FAILURE = "failure"        # an unplanned death, or a planned end that missed its deadline
    HANG = "hang"              # a rank stopped or the generation stalled; the hung rank was killed
    TIMEOUT = "timeout"        # the scenario's timeout ran out

    def __str__(self) -> str:
        return self.value


RANK_EVENTS = frozenset({Ev.START, Ev.RESUMED, Ev.BEGIN, Ev.POINT, Ev.RECORD, Ev.END, Ev.ERROR,
                         Ev.FAULT, Ev.NOTICE, Ev.SIGNAL, Ev.REQUEST, Ev.CKPT_SAVING, Ev.CKPT_SAVE,
                         Ev.CKPT_LOAD, Ev.STATE, Ev.MEMORY, Ev.NOTE, Ev.EXIT, Ev.FILE, Ev.LIVE})
#: Rank events whose meaning needs a step number.
STEP_EVENTS = frozenset({Ev.BEGIN, Ev.POINT, Ev.END, Ev.RECORD, Ev.ERROR, Ev.FAULT,
                         Ev.CKPT_SAVING, Ev.CKPT_SAVE, Ev.CKPT_LOAD, Ev.STATE, Ev.RESUMED,
                         Ev.LIVE})
SUPERVISOR_EVENTS = frozenset({Ev.SCENARIO, Ev.GEN_START, Ev.GEN_END, Ev.DETECT, Ev.UNFIRED,
                               Ev.ABORT, Ev.RSS, Ev.NODES, Ev.DELIVER, Ev.MEMBER, Ev.HUB,
                               Ev.POWER_LOSS, Ev.DEVICES})
#: How a rank on another machine reports (``Env.HUB``; served by ``supervisor/hub.py``), one JSON
#: object per line over one TCP connection per process. A peer first says hello: a rank
#: ``{"hello": "rank", "protocol", "gen", "rank", "pid", "t"}`` (``t``: its clock, so the hub can
#: move its event times onto the harness's), a node's agent ``{"hello": "node", "protocol", "gen",
#: "node", "host"}``. The hub answers ``{"nonce": HEX}`` and the peer ``{"mac": HEX}``, the
#: HMAC-SHA256 under the run's secret (``Env.HUB_SECRET``) of the nonce and its hello line
#: (``hub_mac``): only a process the harness started holds the secret, and a captured answer is
#: worth nothing against the next nonce. A wrong answer closes the connection (``Refusal``).
#: Then a rank reads its generation's plan back as one line and writes its events exactly as it
#: would to its events file; a blank line is a heartbeat. An agent reports ``{"ranks": {rank:
#: {"pid", "state", "peak", "code"}}}`` (its ranks as its own kernel sees them) and ``{"bye":
#: code}`` when its agent ends; it reads commands ``{"signal": n, "rank": r}``. The connection
#: closing is the process ending.
HUB_PROTOCOL = 2


def hub_mac(secret: str, nonce: str, hello: bytes) -> str:
    """The answer to the hub's challenge: HMAC-SHA256 under ``secret`` of ``nonce`` and the hello
    line exactly as sent (without its newline), in hex."""
    return hmac.new(secret.encode(), nonce.encode() + hello, hashlib.sha256).hexdigest()


def hub_line(sock: socket.socket, buf: bytearray, deadline: float, what: str) -> bytes:
    """The next line from ``sock`` (without its newline), reading with ``recv`` into ``buf``, which
    keeps what came after it: the one reader of the socket while the hello lasts. The socket's
    timeout is restored as it was, whatever happens."""
    before = sock.gettimeout()
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} from the harness's hub in time")
            sock.settimeout(left)
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError(f"the harness's hub closed the connection before sending "
                                      f"the {what}: it refused this process (a harness of another "
                                      f"pytest-reshard version, or not this run's "
                                      f"{Env.HUB_SECRET}; the harness's report says which)")
            buf += chunk
    finally:
        sock.settimeout(before)
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def hub_secret(env: Mapping[str, str]) -> str:
    """The run's secret from a process's environment, checked before it connects to the hub."""
    secret = env.get(Env.HUB_SECRET)
    if not secret:
        raise RuntimeError(f"{Env.HUB_SECRET} is not set: the harness gives its secret to every "
                           "process it starts on another machine; a process started by hand "
                           "cannot report to its hub")
    return secret


def hub_hello(sock: socket.socket, hello: Mapping[str, Any], secret: str,
              deadline: float) -> bytearray:
    """Say ``hello`` on a fresh connection to the hub and answer its challenge; returns what was
    read past the challenge (the start of the hub's next line, if any), for the caller's reader."""
    line = json.dumps(dict(hello), separators=(",", ":")).encode()
    sock.sendall(line + b"\n")
    buf = bytearray()
    challenge = json.loads(hub_line(sock, buf, deadline, "challenge"))
    nonce = challenge.get("nonce") if isinstance(challenge, dict) else None
    if not isinstance(nonce, str):
        raise RuntimeError(f"the harness's hub sent {challenge!r} where its challenge belongs: "
                           "run the same pytest-reshard on every node")
    sock.sendall(json.dumps({"mac": hub_mac(secret, nonce, line)}).encode() + b"\n")
    return buf

RANK_FILE = re.compile(r"g(\d+)-r(\d+)\.jsonl")
#: A file record mode writes (``Env.RECORD``): one per process (a rank's incarnation), named by
#: its rank, host, pid and start time in milliseconds, so that no two processes share one.
RECORD_FILE = re.compile(r"rec-r(\d+)-(.+)-(\d+)-(\d+)\.jsonl")


def visible_gpus(env: Mapping[str, str]) -> list[str] | None:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible, as it names them (indices or UUIDs);
    None when it is unset (every GPU of the machine), empty when it hides them all."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]


def record_file(rank: int, host: str, pid: int, t: float) -> str:
    """The name of the file a process records into in record mode (``RECORD_FILE``)."""
    host = re.sub(r"[^A-Za-z0-9_.]+", "_", host) or "host"
    return f"rec-r{int(rank)}-{host}-{int(pid)}-{int(t * 1000)}.jsonl"


@dataclass(frozen=True)
class RunDir:
    """The folder of one scenario run, and where everything in it goes."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def events(self) -> Path:
        return self.root / "events"

    @property
    def logs(self) -> Path:
        """Each rank's stdout and stderr, ``g{gen}-r{rank}.log``."""
        return self.root / "logs"

    @property
    def work(self) -> Path:
        """The workload's own files (checkpoints): the same folder in every generation."""
        return self.root / "work"

    @property
    def supervisor_events(self) -> Path:
        return self.events / "supervisor.jsonl"

    @property
    def scenario(self) -> Path:
        """The Scenario as JSON: ``pytest-reshard replay`` runs it again."""
        return self.root / "scenario.json"

    @property
    def verdict(self) -> Path:
        """Each checker's verdict, as JSON (written after the checks)."""
        return self.root / "verdict.json"

    @property
    def replay(self) -> Path:
        """The command that runs the scenario again."""
        return self.root / "replay.txt"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    def plan(self, gen: int) -> Path:
        """Which rank fires which fault where in generation ``gen`` (written before the launch)."""
        return self.root / f"plan-g{gen}.json"

    def live(self, gen: int) -> Path:
        """The harness's answer to generation ``gen``'s ranks asking to reshard in place: the
        next generation's size, who stays, its rendezvous store (or ``error``)."""
        return self.root / f"live-g{gen}.json"

    def rank_events(self, gen: int, rank: int) -> Path:
        return self.events / f"g{gen}-r{rank}.jsonl"

    def heartbeat(self, gen: int, rank: int) -> Path:
        """Touched by the rank every ``probe.HEARTBEAT_S``: its mtime is the last sign of life."""
        return self.events / f"g{gen}-r{rank}.hb"

    def log(self, gen: int, rank: int) -> Path:
        return self.logs / f"g{gen}-r{rank}.log"

    def stacks(self, gen: int, rank: int) -> Path:
        """Where the rank's Python writes every thread's stack on ``STACK_SIGNAL``: a file of
        its own, since under node agents its output shares its node's log."""
        return self.logs / f"g{gen}-r{rank}.stacks"

    def disk(self, gen: int) -> Path:
        """The work folder as generation ``gen`` left it (``filewatch.snapshot``), when the
        scenario records file events."""
        return self.events / f"disk-g{gen}.json"

    def replaced(self, gen: int) -> Path:
        """Hard links to the files renames replaced in generation ``gen`` (``power_loss``: an
        undone rename brings its file back); removed once the generation is over."""
        return self.root / f"replaced-g{gen}"

    def step_log(self, gen: int) -> Path:
        """Every rank's output of generation ``gen`` in one file, where a scheduler runs them as
        one job step (SLURM's ``srun``): torch prefixes a rank's lines with ``[rank<N>]:``."""
        return self.logs / f"g{gen}-slurm.log"

    @property
    def telemetry(self) -> Path:
        """The device-health counts the harness injects, ``g{gen}-r{rank}.json``
        (``telemetry.injected_path``)."""
        return self.root / "telemetry"

    def telemetry_counts(self, gen: int, rank: int) -> Path:
        return self.telemetry / f"g{gen}-r{rank}.json"

    def plot(self, name: str) -> Path:
        """A PNG plot beside the report (``loss``, ``timeline``)."""
        return self.root / f"{name}.png"


@dataclass(frozen=True)
class Torn:
    """A partial last line, left by a rank killed mid-write (tolerated, kept for the report)."""

    file: str
    line: int
    text: str


def name_of(event: Mapping[str, Any]) -> Ev | str:
    """An event's name as the contract's ``Ev`` (a name it does not know stays a string): the one
    place that reads the wire's ``ev`` field, for every reader of raw events."""
    name = event["ev"]
    try:
        return Ev(name)
    except ValueError:
        return name


def lost_writes(heartbeat: os.stat_result) -> int | None:
    """The errno of the events a rank could not write (ENOSPC, EROFS, EIO), or None.

    A rank whose events file refuses a write says so through its heartbeat file's access time,
    set to that errno (a moment in 1970 no real access has): an update of its inode, which a full
    file system still takes, and that nobody else sets."""
    return int(heartbeat.st_atime) if 0 < heartbeat.st_atime < 4096 else None


def write_json(path: Path, data: Any, *, indent: int | None = None) -> None:
    """Replace ``path`` with ``data`` all at once: a process reading it meanwhile (a rank
    attaching, another process's write) sees the old content or the new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent))
    os.replace(tmp, path)


#: An event line's last member: the CRC-32 (8 hex digits) of the line without it, under a name no
#: event field or user metric takes.
CHECKSUM = "#"
_SEAL = b',"#":"'


@dataclass(frozen=True)
class Damaged:
    """A line that is not what its writer wrote (bad JSON, a checksum that does not match, a
    missing field): its events are not trusted, so nothing is judged on the run."""

    file: str
    line: int
    why: str
    written: bool = True   # False: intact as written, but it contradicts the rest (two processes
                           # recorded as one rank): no disk to blame


def seal(body: str) -> bytes:
    """A compact JSON object's line, its checksum appended as the last member, and a newline."""
    raw = body.encode()
    return b"%s%s%08x\"}\n" % (raw[:-1], _SEAL if len(raw) > 2 else _SEAL[1:], zlib.crc32(raw))


def encode_event(fields: Mapping[str, Any]) -> bytes:
    """One event as the line every writer appends (the probe, the supervisor, the hub): compact
    JSON, sealed, for a single ``os.write`` on an ``O_APPEND`` file (a SIGKILL tears at most
    this line, which ``read_jsonl`` tolerates)."""
    return seal(json.dumps({k: v for k, v in fields.items() if k != CHECKSUM},
                           separators=(",", ":")))


def decode_event(raw: bytes) -> dict[str, Any]:
    """The event of one line, its checksum checked and removed; ``ValueError`` says what is wrong.
    A line without a checksum (written by hand) is taken as it is."""
    raw = raw.strip()
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object per line, got {type(obj).__name__}")
    crc = obj.pop(CHECKSUM, None)
    if crc is not None:
        at = raw.rfind(_SEAL)
        body = raw[:at] + b"}" if at > 0 else b"{}"
        if not isinstance(crc, str) or crc != f"{zlib.crc32(body):08x}":
            raise ValueError("its checksum does not match: the line changed after it was written")
    return obj


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def _read_sealed(lines: list[bytes]) -> list[dict[str, Any]] | None:
    """The events of ``lines`` as ``decode_event`` reads them, when every line is sealed as the
    harness writes it and its checksum matches; else None (read line by line, to say which line
    is wrong). Each step a loop in C over the whole file, and one JSON parse of it: a file of a
    long run holds hundreds of thousands of lines, and Python code per line would cost more
    than parsing them."""
    if not lines:
        return []
    if {*map(_SEAL_AT, lines)} != {_SEAL} or {*map(_LINE_END, lines)} != {b'"}'}:
        return None
    heads = list(map(_HEAD, lines))   # each line up to its checksum: its body, less the "}"
    written = b"".join(map(_CRC_AT, lines))
    if written.translate(None, b"0123456789abcdef"):   # the seal writes lowercase hex only
        return None
    crcs = array("I", binascii.unhexlify(written))
    if sys.byteorder == "little":   # written big-endian (most significant digit first)
        crcs.byteswap()
    if crcs != array("I", map(zlib.crc32, repeat(b"}"), map(zlib.crc32, heads))):
        return None
    try:   # each body is a whole object (its checksum says so): joined, they are an array
        events = _parse_array(b"[" + b"},".join(heads) + b"}]")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if len(events) != len(lines) or {*map(type, events)} != {dict}:
        return None
    return events


def _parse_array(raw: bytes) -> Any:
    """``json.loads``, by orjson where it is installed (two thirds of the time on a file of
    millions of events); by json where orjson refuses what json takes (NaN, integers past 64
    bits)."""
    try:
        import orjson
        return orjson.loads(raw)
    except (ImportError, ValueError):   # orjson.JSONDecodeError is a ValueError
        return json.loads(raw)


_SEAL_AT, _LINE_END = itemgetter(slice(-16, -10)), itemgetter(slice(-2, None))
_HEAD, _CRC_AT = itemgetter(slice(None, -16)), itemgetter(slice(-10, -2))


def read_jsonl(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[Torn], list[Damaged]]:
    """``(line number, event)`` pairs of a finished file, its torn last line if any, and its
    damaged lines.

    Only the last line may be torn (one ``os.write`` per event, so a SIGKILL tears at most the
    line being written); a bad line elsewhere, or one without a checksum in a file whose other
    lines have one, is damaged.
    """
    lines = Path(path).read_bytes().split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    whole = _read_sealed(lines)
    if whole is not None:
        return list(zip(range(1, len(lines) + 1), whole)), [], []
    numbered = [(i + 1, raw) for i, raw in enumerate(lines) if raw.strip()]
    events: list[tuple[int, dict[str, Any]]] = []
    torn: list[Torn] = []
    damaged: list[Damaged] = []
    sealed: list[bool] = []
    for k, (lineno, raw) in enumerate(numbered):
        try:
            obj = decode_event(raw)
        except ValueError as e:
            if k == len(numbered) - 1 and not _parses(raw):
                torn.append(Torn(str(path), lineno, raw.decode("utf-8", "replace")[:200]))
            else:
                damaged.append(Damaged(str(path), lineno, str(e)))
            continue
        sealed.append(_SEAL in raw)
        events.append((lineno, obj))
    if any(sealed) and not all(sealed):
        unsealed = {n for (n, _), was in zip(events, sealed) if not was}
        damaged += [Damaged(str(path), n, "it has no checksum, unlike the other lines of its "
                            "file: it was not written by the harness") for n in sorted(unsealed)]
        events = [(n, e) for n, e in events if n not in unsealed]
    return events, torn, damaged
