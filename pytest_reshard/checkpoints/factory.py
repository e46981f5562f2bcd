"""Write a production-shaped sharded DCP checkpoint, load it resharded, and prove it bit-exact.

    written = write(profile("llama3-70b"), scale=1/1024, path=tmp, world_size=4, launcher=...)
    loaded = written.load(world_size=3)      # N -> M ranks, uneven dim-0 splits
    loaded.assert_bit_exact()                # per-tensor digests of the full tensors

Both sides are real: ``world_size`` processes in a gloo group (forked from a warm server or cold),
each holding its rows of every tensor as a ``DTensor`` with ``Shard(0)`` on a CPU mesh, calling
``torch.distributed.checkpoint.save``/``load`` with fsync'd files. Timings are measured inside the
ranks between barriers, so process start and data generation are not counted as I/O.

Content is a cheap deterministic pattern, not random numbers: byte ``b`` of tensor ``name`` is
``BASE[(b + crc32(name)) % PERIOD]`` of one seeded random block. Filling is a memcpy (GB/s, where
``torch.randn`` runs at a few hundred MB/s), every row of every tensor differs, and a row that
lands at the wrong place, on the wrong rank or in the wrong tensor changes the digest. On a
mismatch, the pattern also names the first differing row and the rank that held it.

Digests are ``probe.digest`` of each *full* tensor, assembled on rank 0 from every rank's shard
(point-to-point, one tensor at a time, so memory stays at one tensor).

Run as ``python -m pytest_reshard.checkpoints.factory save|load ...``: that is a rank.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_reshard.supervisor.launch import RankSpec, host_store
from pytest_reshard.supervisor.launch.fork import ForkLauncher
from pytest_reshard.supervisor.launch.local import LocalLauncher
from pytest_reshard.workloads import WARMUP

__all__ = [
    "BitExactError",
    "CheckpointFactory",
    "Loaded",
    "WrittenCheckpoint",
    "disk_read_bandwidth",
    "disk_write_bandwidth",
    "evict",
    "write",
]

PERIOD = 1_048_573  # a prime number of bytes: rows of power-of-two widths never repeat in step
RUN_TIMEOUT_S = 600.0
DEFAULT_THREADS = 1  # FileSystemWriter threads per rank; bench/checkpoint_io.py --threads compares


class BitExactError(AssertionError):
    """A loaded tensor differs from the one written."""


# -- results ----------------------------------------------------------------------------------
@dataclass
class WrittenCheckpoint:
    """A checkpoint on disk, what was written into it, and how fast."""

    path: Path
    profile: str
    scale: float
    world_size: int
    optimizer: bool
    tensors: int
    nbytes: int                 # tensor bytes (what a GB/s figure divides)
    file_bytes: int             # bytes on disk, metadata and per-tensor framing included
    save_s: float               # dcp.save, barrier to barrier
    phases: dict[str, float]    # rank 0's other seconds: init, generate (the fill), digest
    digests: dict[str, str]     # tensor name -> probe.digest of the full tensor as written
    threads: int = 1
    launcher: Any = field(default=None, repr=False, compare=False)

    @property
    def save_gbps(self) -> float:
        return self.nbytes / self.save_s / 1e9

    def load(self, world_size: int, *, corrupt: str | None = None, timeout: float = RUN_TIMEOUT_S,
             cold: bool = True, digests: bool = True) -> Loaded:
        """Load this checkpoint at ``world_size`` ranks (``Shard(0)``, any split) and gather
        per-tensor digests. ``cold`` evicts the files from the page cache first, so the load
        really reads the disk; ``digests=False`` skips gathering them (a timing-only load).
        ``corrupt="name"`` flips one bit of that tensor in the last
        non-empty shard after the load (a planted fault for tests of the check itself)."""
        if cold:
            evict(self.path)
        args = ["load", "--dir", str(self.path), "--profile", self.profile,
                "--scale", repr(self.scale)]
        if self.optimizer:
            args.append("--optimizer")
        if corrupt:
            args += ["--corrupt", corrupt]
        if not digests:
            args.append("--no-digests")
        expect = self.path.parent / f"{self.path.name}.digests.json"
        expect.write_text(json.dumps(self.digests))
        args += ["--expect", str(expect)]
        result = _run_ranks(args, world_size, self.path.parent, self.launcher, timeout, "load")
        return Loaded(written=self, world_size=world_size, load_s=result["seconds"],
                      digests=result["digests"], located=result["located"], cold=cold,
                      phases=result["phases"])


@dataclass
class Loaded:
    written: WrittenCheckpoint
    world_size: int
    load_s: float
    digests: dict[str, str]
    located: dict[str, str]  # tensor -> where it first differs from the pattern (mismatches only)
    cold: bool = True
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def load_gbps(self) -> float:
        return self.written.nbytes / self.load_s / 1e9

    def mismatches(self) -> list[str]:
        w = self.written.digests
        return sorted(n for n in w.keys() | self.digests.keys() if w.get(n) != self.digests.get(n))

    def assert_bit_exact(self) -> None:
        if not self.digests or not self.written.digests:
            raise ValueError("no digests to compare: write and load with digests=True")
        bad = self.mismatches()
        if not bad:
            return
        shown = [f"  {n}: written {self.written.digests.get(n)}, loaded {self.digests.get(n)}"
                 + (f"; {self.located[n]}" if n in self.located else "") for n in bad[:10]]
        more = f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise BitExactError(
            f"{len(bad)} of {len(self.written.digests)} tensors differ after loading the "
            f"{self.written.world_size}-rank {self.written.profile} checkpoint (scale "
            f"{self.written.scale:g}) at {self.world_size} ranks:\n" + "\n".join(shown) + more
            + f"\ncheckpoint: {self.written.path}")


# -- orchestration (the test process) ---------------------------------------------------------
def write(profile: str, scale: float, path: Path, world_size: int, *, launcher: Any = None,
          optimizer: bool = False, threads: int = DEFAULT_THREADS, crc32: bool = False,
          digests: bool = True, timeout: float = RUN_TIMEOUT_S) -> WrittenCheckpoint:
    """Write ``profile`` at ``scale`` as a ``world_size``-rank DCP checkpoint into ``path``
    (created; must be empty). ``threads``: FileSystemWriter I/O threads per rank.

    ``crc32=False`` (the default) skips the zip CRC that ``torch.save`` computes for every
    tensor record: CPU the save does not need when the cores are shared (on 2 busy cores the CRC
    halved the save rate; on idle ones the disk is the limit and it costs little). The files load
    the same, and DCP's loader never verifies the CRC anyway: the digests here catch a bad byte.
    ``digests=False`` skips gathering the written tensors' digests (benchmarks' extra saves).
    """
    from pytest_reshard.fixtures.checkpoint_profiles import profile as lookup

    specs = lookup(profile).tensors(scale, optimizer=optimizer)  # validates name and scale
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise FileExistsError(f"{path} is not empty: give write() a fresh folder")
    args = ["save", "--dir", str(path), "--profile", profile, "--scale", repr(scale),
            "--threads", str(threads)]
    if crc32:
        args.append("--crc32")
    if not digests:
        args.append("--no-digests")
    if optimizer:
        args.append("--optimizer")
    result = _run_ranks(args, world_size, path.parent, launcher, timeout, "save")
    files = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return WrittenCheckpoint(path=path, profile=profile, scale=scale, world_size=world_size,
                   optimizer=optimizer, tensors=len(specs), nbytes=sum(s.nbytes for s in specs),
                   file_bytes=files, save_s=result["seconds"], phases=result["phases"],
                   digests=result["digests"], threads=threads, launcher=launcher)


class CheckpointFactory:
    """What the ``checkpoint_factory`` fixture returns.

    ``factory("llama3-70b", scale=1/1024, world_size=4)`` writes that profile's checkpoint into a
    fresh folder and returns a ``WrittenCheckpoint``; ``scale=None`` takes the session's default
    (``--reshard-checkpoint-scale``: small in CI, ``1`` on a runner with the disk for it)."""

    def __init__(self, root: Path, launcher: Any, default_scale: float) -> None:
        self.root = Path(root)
        self.launcher = launcher
        self.default_scale = default_scale
        self._count = 0

    def __call__(self, profile: str, scale: float | str | None = None, world_size: int = 4,
                 **options: Any) -> WrittenCheckpoint:
        from pytest_reshard.fixtures.checkpoint_profiles import parse_scale

        self._count += 1
        value = self.default_scale if scale is None else parse_scale(scale)
        return write(profile, value, self.root / f"{profile}-w{world_size}-{self._count}",
                     world_size, launcher=self.launcher, **options)


def _run_ranks(args: Sequence[str], world_size: int, workdir: Path, launcher: Any,
               timeout: float, what: str) -> dict[str, Any]:
    """Start ``world_size`` ranks of this module, wait (bounded) for all of them, return rank 0's
    result. Any failure kills every rank and raises with the log tail."""
    launcher = launcher or LocalLauncher()
    tag = f"{what}-w{world_size}-{os.getpid()}-{time.monotonic_ns()}"
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    out = workdir / f"{tag}.json"
    # Like the supervisor, host the store here so ranks never race rank 0 for it.
    store = host_store("127.0.0.1", world_size)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RESHARD_", "PYTEST_"))}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(world_size),
                LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1",
                TORCHELASTIC_USE_AGENT_STORE="True", PYTHONUNBUFFERED="1",
                RESHARD_SUPERVISOR_PID=str(os.getpid()))  # the leak checks find our ranks
    specs = [RankSpec(rank=r, argv=["-m", "pytest_reshard.checkpoints.factory", *args, "--out", str(out)],
                      env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=str(workdir),
                      log=logs / f"{tag}-r{r}.log") for r in range(world_size)]
    gen = launcher.launch(specs)
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = gen.exit_codes()
            failed = {r: c for r, c in codes.items() if c not in (None, 0)}
            if failed or time.monotonic() > deadline:
                why = (f"rank(s) {sorted(failed)} exited with {sorted(set(failed.values()))}"
                       if failed else f"not done after {timeout:.0f} s")
                raise RuntimeError(f"checkpoint {what} at {world_size} ranks failed: {why}\n"
                                   + _tail(specs[min(failed or {0: 0})].log))
            if all(c == 0 for c in codes.values()):
                break
            time.sleep(0.02)
    finally:
        gen.kill()
        del store
    result = json.loads(out.read_text())
    out.unlink()
    return result


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return f"--- {log} (last {lines} lines) ---\n" + "\n".join(
            log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {log})"


def fork_launcher() -> ForkLauncher:
    """A warm server with torch's DCP imported: each save or load then costs a fork per rank."""
    return ForkLauncher((WARMUP,))


# -- the disk's own figures -------------------------------------------------------------------
CHUNK = 16 << 20


def disk_write_bandwidth(folder: Path, nbytes: int) -> float:
    """Sequential write of ``nbytes`` to a fresh file in ``folder`` with fsync, like
    ``dd bs=16M conv=fdatasync``: bytes per second. The file is removed afterwards."""
    buf = os.urandom(1 << 20) * (CHUNK >> 20)
    path = Path(folder) / f".disk-write-{os.getpid()}.bin"
    try:
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = nbytes
            while left > 0:
                left -= os.write(fd, buf[:min(left, CHUNK)])
            os.fsync(fd)
        finally:
            os.close(fd)
        return nbytes / (time.perf_counter() - start)
    finally:
        path.unlink(missing_ok=True)


def disk_read_bandwidth(files: Sequence[Path]) -> float:
    """Sequential read of ``files`` after evicting them from the page cache: bytes per second."""
    evict_files(files)
    total = 0
    buf = bytearray(CHUNK)
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total / (time.perf_counter() - start)


def evict(folder: Path) -> None:
    evict_files([p for p in Path(folder).iterdir() if p.is_file()])


def evict_files(files: Sequence[Path]) -> None:
    """Drop these files' pages from the page cache (no root needed: they are written back)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- the ranks --------------------------------------------------------------------------------
def _base_block() -> Any:
    import torch

    g = torch.Generator().manual_seed(0x5EED)
    block = torch.randint(0, 256, (PERIOD,), dtype=torch.uint8, generator=g)
    return torch.cat([block, block])  # any PERIOD-long window is one slice


def _rows(n: int, world: int, rank: int) -> tuple[int, int]:
    """DTensor's Shard(0) split (torch.chunk): ceil(n / world) rows each, the last ones short."""
    chunk = -(-n // world)
    start = min(n, rank * chunk)
    return start, min(n, start + chunk)


def fill(local: Any, name: str, row0: int, base: Any) -> None:
    """Write the pattern of tensor ``name`` into ``local``, its rows from ``row0`` on."""
    if local.numel() == 0:
        return
    import torch

    flat = local.reshape(-1).view(torch.uint8)
    row_bytes = flat.numel() // local.shape[0]
    pos = (row0 * row_bytes + zlib.crc32(name.encode())) % PERIOD
    done, n = 0, flat.numel()
    while done < n:
        step = min(PERIOD, n - done)
        flat[done:done + step].copy_(base[pos:pos + step])
        pos = (pos + step) % PERIOD
        done += step


def full_tensors(profile: str, scale: float, *, optimizer: bool = False) -> dict[str, Any]:
    """The whole checkpoint as plain tensors in one process (what the ranks write, unsharded):
    for comparisons with ``torch.save``/``torch.load`` of the same bytes."""
    import torch

    from pytest_reshard.fixtures.checkpoint_profiles import profile as lookup

    base = _base_block()
    out = {}
    for spec in lookup(profile).tensors(scale, optimizer=optimizer):
        out[spec.name] = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
        fill(out[spec.name], spec.name, 0, base)
    return out


def _state(specs: Sequence[Any], mesh: Any, world: int, rank: int, *, pattern: bool,
           base: Any) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor import empty as dt_empty

    state = {}
    for spec in specs:
        dt = dt_empty(spec.shape, dtype=getattr(torch, spec.dtype), device_mesh=mesh,
                      placements=[Shard(0)])
        local = dt.to_local()
        start, stop = _rows(spec.shape[0], world, rank)
        if tuple(local.shape) != (stop - start, *spec.shape[1:]):
            raise RuntimeError(f"{spec.name}: DTensor gave rank {rank} a {tuple(local.shape)} "
                               f"shard; expected rows {start}:{stop} (torch.chunk split)")
        if pattern:
            fill(local, spec.name, start, base)
        else:
            local.zero_()  # a tensor the load never wrote then cannot match by chance
        state[spec.name] = dt
    return state


BATCH_BYTES = 64 << 20


def _digests(state: dict[str, Any], world: int, rank: int, base: Any,
             expected: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Rank 0: ``probe.digest`` of every full tensor, assembled from every rank's shards; for a
    tensor whose digest is not the ``expected`` one, where it first differs from the pattern.

    Shards travel in batches of about ``BATCH_BYTES`` (one message per rank and batch: a
    message per tensor costs more in latency than the bytes do), so rank 0 holds one batch."""
    digests, located = {}, {}
    names = list(state)
    while names:
        batch: list[str] = []
        size = 0
        while names and (not batch or size < BATCH_BYTES):
            batch.append(names.pop(0))
            dt = state[batch[-1]]
            size += dt.numel() * dt.element_size()  # global: every rank cuts the same batches
        for name, full in _gather_rows(state, batch, world, rank):
            from pytest_reshard.probe import digest

            digests[name] = digest(full)
            if expected and expected.get(name) != digests[name]:
                located[name] = _locate(full, name, world, base)
    return digests, located


def _gather_rows(state: dict[str, Any], names: list[str], world: int,
                 rank: int) -> list[tuple[str, Any]]:
    """Rank 0 receives every rank's shards of ``names`` (one message per rank) and returns the
    full tensors; the other ranks send theirs and return nothing."""
    import torch
    import torch.distributed as dist

    mine = [state[n].to_local().contiguous().reshape(-1).view(torch.uint8) for n in names]
    if rank != 0:
        flat = torch.cat(mine) if mine else torch.empty(0, dtype=torch.uint8)
        if flat.numel():
            dist.send(flat, dst=0)
        return []
    parts: dict[str, list[Any]] = {n: [state[n].to_local()] for n in names}
    for r in range(1, world):
        shapes = []
        for n in names:
            dt = state[n]
            start, stop = _rows(dt.shape[0], world, r)
            shapes.append((n, (stop - start, *dt.shape[1:]), dt.dtype))
        sizes = [torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
                 for _, shape, dtype in shapes]
        flat = torch.empty(sum(sizes), dtype=torch.uint8)
        if flat.numel():
            dist.recv(flat, src=r)
        offset = 0
        for (n, shape, dtype), size in zip(shapes, sizes, strict=True):
            piece = flat[offset:offset + size]
            if offset % 8:  # a view as a wider dtype needs an aligned start
                piece = piece.clone()
            parts[n].append(piece.view(dtype).reshape(shape))
            offset += size
    return [(n, torch.cat(parts[n])) for n in names]


def _locate(full: Any, name: str, world: int, base: Any) -> str:
    """Where a gathered tensor first departs from its pattern, and which rank held that row."""
    import torch

    expect = torch.empty_like(full)
    fill(expect, name, 0, base)
    n = full.shape[0]
    rows = (full.reshape(n, -1).view(torch.uint8) != expect.reshape(n, -1).view(torch.uint8)
            ).any(dim=1).nonzero().flatten().tolist()
    if not rows:
        return "every row matches the pattern (the written tensor was wrong, not the load)"
    owner = next(r for r in range(world) if _rows(n, world, r)[0] <= rows[0] < _rows(n, world, r)[1])
    return (f"{len(rows)} of {n} rows differ from the pattern, the first row {rows[0]} "
            f"(on rank {owner} of {world})")


def _main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pytest_reshard.checkpoints.factory",
                                description="one rank of a checkpoint save or resharded load")
    p.add_argument("op", choices=("save", "load"))
    p.add_argument("--dir", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--scale", type=float, required=True)
    p.add_argument("--optimizer", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-digests", action="store_true", help="skip the digests (timing only)")
    p.add_argument("--crc32", action="store_true", help="let torch.save compute zip CRCs")
    p.add_argument("--corrupt", default=None, help="flip a bit of this tensor after the load")
    p.add_argument("--expect", default=None, help="JSON digests the load must reproduce")
    p.add_argument("--out", required=True, help="rank 0 writes its JSON result here")
    a = p.parse_args(argv)

    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    from pytest_reshard.fixtures.checkpoint_profiles import profile

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    phases = {}
    started = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    mesh = init_device_mesh("cpu", (world,))
    specs = profile(a.profile).tensors(a.scale, optimizer=a.optimizer)
    base = _base_block()
    phases["init"] = time.perf_counter() - started

    started = time.perf_counter()
    state = _state(specs, mesh, world, rank, pattern=a.op == "save", base=base)
    phases["generate"] = time.perf_counter() - started
    dist.barrier()
    started = time.perf_counter()
    torch.serialization.set_crc32_options(a.crc32)
    if a.op == "save":
        writer = dcp.FileSystemWriter(a.dir, thread_count=a.threads, sync_files=True)
        dcp.save(state, storage_writer=writer)
    else:
        dcp.load(state, storage_reader=dcp.FileSystemReader(a.dir))
    dist.barrier()
    seconds = time.perf_counter() - started
    if a.corrupt:
        _flip_bit(state, a.corrupt, world, rank)
    started = time.perf_counter()
    expected = json.loads(Path(a.expect).read_text()) if a.expect and rank == 0 else {}
    digests, located = ({}, {}) if a.no_digests else _digests(state, world, rank, base, expected)
    phases["digest"] = time.perf_counter() - started
    seconds_all = [0.0] * world
    dist.all_gather_object(seconds_all, seconds)
    if rank == 0:
        Path(a.out).write_text(json.dumps({"seconds": max(seconds_all), "phases": phases,
                                           "digests": digests, "located": located}))
    dist.destroy_process_group()
    return 0


def _flip_bit(state: dict[str, Any], name: str, world: int, rank: int) -> None:
    """Flip the lowest bit of the middle byte of ``name``'s last non-empty shard."""
    import torch

    if name not in state:
        raise SystemExit(f"--corrupt {name!r}: no such tensor")
    n = state[name].shape[0]
    owner = max(r for r in range(world) if _rows(n, world, r)[1] > _rows(n, world, r)[0])
    if rank == owner:
        flat = state[name].to_local().reshape(-1).view(torch.uint8)
        flat[flat.numel() // 2] ^= 1


if __name__ == "__main__":
    sys.stdout.flush()
    code = _main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # after dcp.save a normal interpreter exit sometimes aborts (SIGABRT)
