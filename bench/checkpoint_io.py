"""Checkpoint I/O of a production-shaped profile against the disk's own figures, in one run.

Each repeat measures, back to back so both see the same machine and disk state:

- write: the disk's sequential write of the same number of bytes (one stream, 16 MiB writes,
  fsync: what ``dd bs=16M conv=fdatasync`` measures), ``dcp.save`` at N ranks through the
  ``checkpoint_factory`` writer (fsync'd files), and ``torch.save`` of the same tensors from one
  process into one file (fsync'd);
- read, each from a cold page cache (the files are evicted first): the disk's sequential read of
  the DCP files, the resharded ``dcp.load`` at M ranks, and ``torch.load`` of the one-file copy.

It prints medians (min-max) and the paired ratios (each repeat's DCP figure over the disk figure
taken next to it, then the median), and checks the first load bit-exact. GB/s counts tensor
bytes (what the model holds), not file bytes.

    python bench/checkpoint_io.py --profile llama3-70b --scale 1/64 --save-ranks 4 --load-ranks 3
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pytest_reshard.fixtures.checkpoint_profiles import parse_scale, profile

from pytest_reshard.checkpoints import factory as C


def torch_save_gbps(tensors: dict, path: Path, nbytes: int) -> float:
    import torch

    start = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(tensors, f)
        f.flush()
        os.fsync(f.fileno())
    return nbytes / (time.perf_counter() - start) / 1e9


def torch_load_gbps(path: Path, nbytes: int) -> float:
    import torch

    C.evict_files([path])
    start = time.perf_counter()
    loaded = torch.load(path, weights_only=True)
    seconds = time.perf_counter() - start
    del loaded
    return nbytes / seconds / 1e9


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.3f} GB/s ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="llama3-70b")
    p.add_argument("--scale", default="1/64", help="fraction of the checkpoint's bytes: 1/64, 0.01")
    p.add_argument("--save-ranks", type=int, default=4)
    p.add_argument("--load-ranks", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=C.DEFAULT_THREADS,
                   help="FileSystemWriter I/O threads per rank")
    p.add_argument("--optimizer", action="store_true", help="add AdamW's two fp32 moments")
    p.add_argument("--crc32", action="store_true", help="let torch.save compute its zip CRCs "
                   "(torch's default; the factory skips them)")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder "
                   "under /tmp); must be on the disk you want to measure")
    p.add_argument("--json", default=None, help="also write the figures here")
    a = p.parse_args()
    scale = parse_scale(a.scale)
    prof = profile(a.profile)
    nbytes = prof.nbytes(scale, optimizer=a.optimizer)
    root = Path(tempfile.mkdtemp(prefix="ckpt-io-", dir=a.dir))
    print(f"{a.profile} at scale {a.scale}: {len(prof.tensors(scale, optimizer=a.optimizer))} "
          f"tensors, {nbytes / 1e9:.3f} GB; save at {a.save_ranks} ranks, load at "
          f"{a.load_ranks}; {a.repeats} repeats; {root} (cpu count {os.cpu_count()})", flush=True)
    fig: dict[str, list[float]] = {k: [] for k in (
        "disk_write", "dcp_save", "torch_save", "disk_read", "dcp_load", "torch_load")}
    launcher = C.fork_launcher()
    try:
        written = None
        tensors = C.full_tensors(a.profile, scale, optimizer=a.optimizer)
        for i in range(a.repeats):
            fig["disk_write"].append(C.disk_write_bandwidth(root, nbytes) / 1e9)
            if written is not None:
                shutil.rmtree(written.path)
            written = C.write(a.profile, scale, root / f"dcp{i}", a.save_ranks, launcher=launcher,
                              optimizer=a.optimizer, threads=a.threads, crc32=a.crc32,
                              digests=i == a.repeats - 1)  # the kept one is checked
            fig["dcp_save"].append(written.save_gbps)
            fig["torch_save"].append(torch_save_gbps(tensors, root / "torch.pt", nbytes))
            print(f"  write {i}: disk {fig['disk_write'][-1]:.3f}  dcp.save "
                  f"{fig['dcp_save'][-1]:.3f}  torch.save {fig['torch_save'][-1]:.3f} GB/s "
                  f"(dcp phases: {_phases(written.phases)})", flush=True)
        del tensors
        assert written is not None
        files = sorted(f for f in written.path.iterdir() if f.is_file())
        for i in range(a.repeats):
            fig["disk_read"].append(C.disk_read_bandwidth(files) / 1e9)
            loaded = written.load(a.load_ranks, cold=True, digests=i == 0)
            if i == 0:
                loaded.assert_bit_exact()
            fig["dcp_load"].append(loaded.load_gbps)
            fig["torch_load"].append(torch_load_gbps(root / "torch.pt", nbytes))
            print(f"  read {i}: disk {fig['disk_read'][-1]:.3f}  dcp.load "
                  f"{fig['dcp_load'][-1]:.3f}  torch.load {fig['torch_load'][-1]:.3f} GB/s",
                  flush=True)
    finally:
        launcher.close()
        shutil.rmtree(root, ignore_errors=True)

    def ratio(num: str, den: str) -> float:
        return statistics.median(n / d for n, d in zip(fig[num], fig[den], strict=True))

    print(f"\nbit-exact: {len(written.digests)} of {len(written.digests)} tensors after "
          f"{a.save_ranks} -> {a.load_ranks} ranks")
    print(f"write  disk sequential, fsync      {summary(fig['disk_write'])}")
    print(f"write  dcp.save, {a.save_ranks} ranks             {summary(fig['dcp_save'])}  "
          f"{ratio('dcp_save', 'disk_write'):.0%} of disk")
    print(f"write  torch.save, 1 process       {summary(fig['torch_save'])}  "
          f"{ratio('torch_save', 'disk_write'):.0%} of disk")
    print(f"read   disk sequential, cold       {summary(fig['disk_read'])}")
    print(f"read   dcp.load {a.save_ranks}->{a.load_ranks}, cold          {summary(fig['dcp_load'])}  "
          f"{ratio('dcp_load', 'disk_read'):.0%} of disk, "
          f"{ratio('dcp_load', 'torch_load'):.0%} of torch.load")
    print(f"read   torch.load, 1 process, cold {summary(fig['torch_load'])}  "
          f"{ratio('torch_load', 'disk_read'):.0%} of disk")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "nbytes": nbytes, "gbps": fig,
                                            "command": " ".join(sys.argv)}, indent=1))


def _phases(phases: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())


if __name__ == "__main__":
    main()
