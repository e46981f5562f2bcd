"""A user's loop shaped like prime-rl's SFT ``train()`` before PrimeIntellect-ai/prime-rl#3332: a
torchdata ``StatefulDataLoader`` with a worker process (``num_workers=1``, prime-rl's default since
#3299), its ``state_dict()`` saved with every checkpoint, and at start-up ``iter(dataloader)``
called *before* the resume path loads the checkpoint into the loader.

``iter()`` starts the worker on the loader's initial state; the later ``load_state_dict`` only
stashes the state for the next ``iter()``, which never comes. Every resume trains the data from the
beginning again. ``--fixed`` (#3332): the iterator is created after the resume's load."""
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from pytest_reshard import probe

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 8)))
p.add_argument("--every", type=int, default=3)
args = p.parse_args()

run = probe.attach(max_rewind_steps=args.every)
run.stop_requested()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
N, PER_RANK = 64, 2                      # 64 samples, 2 a rank a step: one epoch covers the run
data = torch.randn(N, 4, generator=torch.Generator().manual_seed(1))
loader = StatefulDataLoader(list(range(N)), batch_size=PER_RANK, num_workers=1,
                            sampler=DistributedSampler(list(range(N)), shuffle=True, seed=0))
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
root = Path(run.workdir or "ckpt")


def digests() -> dict[str, str]:
    return {"model": probe.digest(model.state_dict()), "optimizer": probe.digest(opt.state_dict())}


def save(step: int) -> None:
    folder = root / f"step-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(loader.state_dict(), folder / f"dataloader_{rank}.pt")
    if rank == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, folder / "model.pt")
    dist.barrier()
    if rank == 0:
        (folder / "done").touch()
    dist.barrier()
    run.checkpoint_saved(step, digests())


if not args.fixed:
    batches = iter(loader)               # before the resume's load: the worker starts at row 0
saved = sorted(int(d.name[5:]) for d in root.glob("step-*") if (d / "done").exists())
start = 0
if saved:
    last = saved[-1]
    state = torch.load(root / f"step-{last}" / "model.pt")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    loader.load_state_dict(torch.load(root / f"step-{last}" / f"dataloader_{rank}.pt"))
    run.checkpoint_loaded(last, digests())
    start = last + 1
if args.fixed:
    batches = iter(loader)               # #3332: after the load, so the worker starts there
run.resumed(step=start, source="checkpoint" if saved else "fresh")
for step in range(start, args.steps):
    with run.step(step) as s:
        batch = next(batches)
        s.record(samples=batch.tolist(), epoch=0)
        x = data[batch]
        s.point("forward")
        loss = ((model(x).squeeze(1) - x.sum(1)) ** 2).mean()
        s.point("backward")
        opt.zero_grad()
        loss.backward()
        s.point("optimizer")
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        s.record(loss=float(total) / world)
    stop = run.stop_requested() or run.reshard_requested()
    if (step + 1) % args.every == 0 or stop or step == args.steps - 1:
        save(step)
    if stop:
        break
run.close()
dist.destroy_process_group()
