"""A user's DDP training script (gloo) with five ways of saving a checkpoint, one correct and four
with a bug that only a crash at the wrong file event shows. ``--save MODE``:

- ``atomic`` (correct): every rank writes ``torch.distributed.checkpoint`` (DCP) into
  ``OUT/step_N.tmp/``; after a barrier rank 0 renames it to ``OUT/step_N/``, then points
  ``OUT/latest`` at it (temp file + ``os.replace``), then prunes all but the last 2 step dirs.
  The resume reads ``latest`` (none: a fresh start).
- ``inplace``: rank 0 ``torch.save``s the whole state straight over ``OUT/model.pt``: a kill in
  the middle of the write destroys the only copy (the non-atomic write of Lightning's
  two-move ``last.ckpt``, and of every ``torch.save(state, path)`` without a temp file).
- ``latest_first``: ``OUT/latest`` names ``step_N`` *before* the DCP save into ``OUT/step_N/``
  (no temp dir): a kill during the save leaves ``latest`` pointing at a checkpoint that is not
  there (KempnerForge#102: the latest pointer written before the async DCP save was durable).
- ``prune_first``: keep-last-1 rotation that deletes the previous step dir *before* the new one
  is written; the resume takes the newest ``step_*`` with DCP's ``.metadata``. A kill between
  the delete and the end of the save leaves no complete checkpoint at all.
- ``async_unawaited``: rank 0 ``dcp.async_save``s into ``OUT/step_N/`` and writes its
  ``.done`` marker only when it awaits that save's future, at the next save; a planned exit and
  the end of training return without awaiting it, so the last save is never marked and the
  resume silently starts from the one before (verl#7952). Its commit lags one interval, so its
  rewind budget for a crash is 2 intervals; a planned reshard must still cost nothing.

Three more write ``OUT/model.pt`` through a temporary file (rank 0, ``torch.save``), and are
judged by a power loss (``power_loss``):

- ``durable`` (correct): the temporary fsynced, renamed over ``model.pt``, the folder fsynced;
- ``rename_unsynced``: renamed and the folder fsynced, but the temporary's data never was: after
  a power loss ``model.pt`` is there and empty;
- ``dir_unsynced``: the temporary fsynced and renamed, but the folder never synced: the rename is
  undone by a power loss and ``model.pt`` goes back to the save before, one the job had already
  replaced.

``OUT/step_N`` holds the state after N steps (the steps 0..N-1); a resume from it prints
``resumed from step N``. At the end of training rank 0 writes the final weights to
``OUT/final.pt``. It runs under the harness, under torchrun, or as one plain process (gloo, world
size 1, a HashStore) and resumes from ``--out`` when run again.
"""
import argparse
import os
import re
import shutil
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

from pytest_reshard import probe

GLOBAL_BATCH = 24


class Job:
    """What the save and resume functions need: the output dir, the model, the probe."""

    def __init__(self, run, out: Path, net, opt) -> None:
        self.run, self.out, self.net, self.opt = run, out, net, opt
        self.rank = dist.get_rank()
        self.pending = None  # async_unawaited: (future, step dir, digests) of the unmarked save

    def digests(self) -> dict:
        return {"model": probe.digest(self.net.state_dict()),
                "optimizer": probe.digest(self.opt.state_dict())}

    def saved(self, n: int, digests=None) -> None:  # the state after step n-1 is on disk
        self.run.checkpoint_saved(n - 1, digests or self.digests())

    def dcp_state(self) -> dict:
        model, optim = get_state_dict(self.net, self.opt)
        return {"model": model, "optim": optim}

    def dcp_load(self, path: Path) -> int:
        state = self.dcp_state()
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.net, self.opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        return int(path.name.split("_")[1])


def step_dirs(out: Path, marker: str | None = None) -> list[Path]:
    """The ``step_N`` dirs (oldest first), only those holding ``marker`` if given."""
    found = [p for p in out.glob("step_*") if re.fullmatch(r"step_\d+", p.name)
             and (marker is None or (p / marker).exists())]
    return sorted(found, key=lambda p: int(p.name[5:]))


def prune(out: Path, keep: int) -> None:
    for old in step_dirs(out)[:-keep] if keep else step_dirs(out):
        shutil.rmtree(old)


def write_latest(out: Path, name: str) -> None:
    tmp = out / "latest.tmp"
    tmp.write_text(name)
    os.replace(tmp, out / "latest")


def rank0(job: Job, fn, *args) -> None:
    if job.rank == 0:
        fn(*args)
    dist.barrier()


# -- the five modes: save(job, n) writes the state after n steps; resume(job) -> n (0: fresh) --
def save_atomic(job: Job, n: int) -> None:
    final, tmp = job.out / f"step_{n}", job.out / f"step_{n}.tmp"
    rank0(job, lambda: tmp.exists() and shutil.rmtree(tmp))  # a crashed save's leftovers
    dcp.save(job.dcp_state(), checkpoint_id=tmp)
    dist.barrier()  # every rank's part is written

    def commit() -> None:
        if final.exists():  # left by a run that crashed before moving `latest` to it
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_latest(job.out, final.name)
        prune(job.out, keep=2)
    rank0(job, commit)
    job.saved(n)


def resume_latest(job: Job) -> int:
    latest = job.out / "latest"
    return job.dcp_load(job.out / latest.read_text().strip()) if latest.exists() else 0


def save_inplace(job: Job, n: int) -> None:
    state = {"model": job.net.state_dict(), "optim": job.opt.state_dict(), "steps": n}
    rank0(job, torch.save, state, job.out / "model.pt")  # BUG: straight over the only copy
    job.saved(n)


def resume_inplace(job: Job) -> int:
    path = job.out / "model.pt"
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    job.net.load_state_dict(state["model"])
    job.opt.load_state_dict(state["optim"])
    return state["steps"]


def save_latest_first(job: Job, n: int) -> None:
    rank0(job, write_latest, job.out, f"step_{n}")  # BUG: names a checkpoint not yet written
    dcp.save(job.dcp_state(), checkpoint_id=job.out / f"step_{n}")
    dist.barrier()
    rank0(job, prune, job.out, 2)
    job.saved(n)


def save_prune_first(job: Job, n: int) -> None:
    rank0(job, prune, job.out, 0)  # BUG: keep-last-1 drops the old one before the new exists
    dcp.save(job.dcp_state(), checkpoint_id=job.out / f"step_{n}")
    dist.barrier()
    job.saved(n)


def resume_newest(marker: str):
    def resume(job: Job) -> int:
        found = step_dirs(job.out, marker)
        return job.dcp_load(found[-1]) if found else 0
    return resume


def save_async(job: Job, n: int) -> None:
    if job.rank == 0:
        if job.pending is not None:  # the previous save: wait for it, then mark it
            future, path, digests = job.pending
            future.result()
            (path / ".done").touch()
            job.saved(int(path.name[5:]), digests)
        # Rank 0 alone (no_dist): the upload thread then runs no collective that could race
        # DDP's all-reduces on the default group, or outlive destroy_process_group().
        path = job.out / f"step_{n}"
        future = dcp.async_save(job.dcp_state(), checkpoint_id=path, no_dist=True)
        job.pending = (future, path, job.digests())  # BUG: the last one is never awaited


def sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_through_temporary(sync_data: bool, sync_folder: bool):
    def save(job: Job, n: int) -> None:
        def write() -> None:
            tmp = job.out / "model.pt.tmp"
            torch.save({"model": job.net.state_dict(), "optim": job.opt.state_dict(), "steps": n},
                       tmp)
            if sync_data:
                sync(tmp)
            os.replace(tmp, job.out / "model.pt")
            if sync_folder:
                sync(job.out)
        rank0(job, write)
        job.saved(n)
    return save


MODES = {"atomic": (save_atomic, resume_latest),
         "inplace": (save_inplace, resume_inplace),
         "latest_first": (save_latest_first, resume_latest),
         "prune_first": (save_prune_first, resume_newest(".metadata")),
         "async_unawaited": (save_async, resume_newest(".done")),
         "durable": (save_through_temporary(True, True), resume_inplace),
         "rename_unsynced": (save_through_temporary(False, True), resume_inplace),
         "dir_unsynced": (save_through_temporary(True, False), resume_inplace)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 20)))
    p.add_argument("--ckpt-every", type=int, default=2)
    p.add_argument("--out", type=Path, help="checkpoint dir (default: the harness's workdir "
                   "/ ckpt-train, or ./ckpt-train outside it)")
    p.add_argument("--save", choices=sorted(MODES), default="atomic")
    p.add_argument("--hidden", type=int, default=32)
    args = p.parse_args()

    lag = 2 if args.save == "async_unawaited" else 1  # intervals a crash may cost
    run = probe.attach(max_rewind_steps=lag * args.ckpt_every)
    run.stop_requested()  # SIGTERM sets a flag from here on
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun, the harness, ckpt-chaos
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    else:  # a plain `python ckpt_train.py`: one rank, nothing to rendezvous with
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = args.out or (run.workdir or Path(".")) / "ckpt-train"
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(run.seed)
    data_gen = torch.Generator().manual_seed(1234)
    inputs = torch.randn(GLOBAL_BATCH * args.steps, 16, generator=data_gen)
    targets = inputs.sum(dim=1, keepdim=True)
    net = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(),
                              torch.nn.Linear(args.hidden, 1))
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    job = Job(run, out, net, opt)
    save, resume = MODES[args.save]
    start = resume(job)
    if start:
        run.checkpoint_loaded(start - 1, job.digests())
    run.resumed(step=start, source="checkpoint" if start else "fresh")
    if rank == 0:
        print(f"resumed from step {start}", flush=True)

    per_rank = GLOBAL_BATCH // world
    finished = True
    for step in range(start, args.steps):
        with run.step(step) as s:
            lo = step * GLOBAL_BATCH + rank * per_rank
            ids = list(range(lo, lo + per_rank))
            s.record(samples=ids)
            s.point("forward")
            loss = torch.nn.functional.mse_loss(model(inputs[ids]), targets[ids])
            s.point("backward")
            opt.zero_grad()
            loss.backward()  # DDP all-reduces the gradients in its hooks
            s.point("optimizer")
            opt.step()
            global_loss = loss.detach().clone()
            dist.all_reduce(global_loss)
            s.record(loss=global_loss.item() / world)
        stop = torch.tensor(float(bool(run.reshard_requested() or run.stop_requested())))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() or (step + 1) % args.ckpt_every == 0:
            save(job, step + 1)
        if stop.item():
            finished = step + 1 == args.steps
            break
    if finished and rank == 0:
        torch.save(net.state_dict(), out / "final.pt")

    run.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
