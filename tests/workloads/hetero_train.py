"""A user's data-parallel script whose steps are compute-bound: each rank works through its share
of a global batch of samples (a fixed number of matrix products per sample), then all-reduces.
It records, per step, its samples, the seconds it computed (``compute_s``) and the seconds it
waited at the all-reduce for the others (``wait_s``).

``--shares even`` splits every batch evenly. ``--shares measured`` (correct on mixed devices)
splits the first step evenly; after each step the ranks all-gather their speed so far (samples
per second of compute, over every step) and split the next batch in proportion to it.

On a planned change's notice (``run.reshard_requested()``) it records the next step in its work
folder and exits; a relaunch goes on from there, measuring its new ranks afresh."""
import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from pytest_reshard import probe

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 8)))
p.add_argument("--shares", choices=("even", "measured"), default="measured")
p.add_argument("--batch", type=int, default=96, help="samples per step, over all ranks")
args = p.parse_args()

run = probe.attach(max_rewind_steps=0)
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
progress = run.workdir / "hetero-step" if run.workdir else None
first = int(progress.read_text()) if progress and progress.exists() else 0
if first:
    run.checkpoint_loaded(first - 1, state={"data": torch.tensor([first])})
run.resumed(step=first, source="checkpoint" if first else "fresh")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
a = torch.randn(192, 192)
for _ in range(20):   # warm up (allocations, kernels' first calls) before any step is timed
    torch.tanh(a @ a)
counts = [args.batch // world + (r < args.batch % world) for r in range(world)]
done, busy = 0, 0.0   # this rank's samples and seconds of compute so far


def proportional(speeds: list[float]) -> list[int]:
    """Largest remainders: shares of the batch in proportion to ``speeds``, every rank >= 1."""
    exact = [args.batch * s / sum(speeds) for s in speeds]
    out = [max(1, int(x)) for x in exact]
    for r in sorted(range(world), key=lambda r: int(exact[r]) - exact[r]):
        if sum(out) >= args.batch:
            break
        out[r] += 1
    while sum(out) > args.batch:
        out[out.index(max(out))] -= 1
    return out


for step in range(first, args.steps):
    with run.step(step) as s:
        start = step * args.batch + sum(counts[:rank])
        mine = list(range(start, start + counts[rank]))
        s.record(samples=mine)
        s.point("forward")
        t0 = time.perf_counter()
        x = a
        for _ in range(10 * len(mine)):
            x = torch.tanh(x @ a)
        t1 = time.perf_counter()
        total = torch.tensor([float(sum(i % 7 for i in mine))])   # the same however split
        dist.all_reduce(total)
        s.record(loss=float(total) / args.batch, compute_s=round(t1 - t0, 6),
                 wait_s=round(time.perf_counter() - t1, 6))
        s.point("optimizer")
    done, busy = done + len(mine), busy + (t1 - t0)
    if args.shares == "measured":
        rates = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(rates, torch.tensor([done / busy]))
        counts = proportional([float(r) for r in rates])
    if run.reshard_requested() is not None:   # every rank got the notice at the same point
        if rank == 0 and progress is not None:
            progress.write_text(str(step + 1))
        run.checkpoint_saved(step, state={"data": torch.tensor([step + 1])})
        break
run.close()
dist.destroy_process_group()
