"""A user's loop shaped like verl's ``RayPPOTrainer.fit`` (verl-project/verl#5725): a
``StatefulDataLoader`` per rank over a ``DistributedSampler``, a 1-based ``global_steps`` counter,
a save every ``save_freq`` steps *inside* the batch loop (the loader's ``state_dict()`` included),
and at a resume ``current_epoch = global_steps // steps_per_epoch``, the loader's state loaded,
then ``for epoch in range(current_epoch, total_epochs)``.

A save at an exact epoch boundary is taken after the epoch's last batch, before the loader's
iterator has ended: torchdata records every sample of the epoch as yielded. The resume starts the
next epoch, and its first ``iter()`` applies that state: it skips a whole epoch and yields nothing,
so the loop ends and the process exits 0 with steps left to train.
``--fixed`` (#5725): the loader's state is not loaded when ``global_steps % steps_per_epoch == 0``."""
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
p.add_argument("--save-freq", type=int, default=4)
args = p.parse_args()

run = probe.attach(max_rewind_steps=args.save_freq)
run.stop_requested()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
N, PER_RANK = 16, 2                      # 16 samples, 2 a rank a step: 4 steps an epoch at 2 ranks
data = torch.randn(N, 4, generator=torch.Generator().manual_seed(1))
loader = StatefulDataLoader(list(range(N)), batch_size=PER_RANK, drop_last=True,
                            sampler=DistributedSampler(list(range(N)), shuffle=True, seed=0))
steps_per_epoch = len(loader)
total_epochs = -(-args.steps // steps_per_epoch)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
root = Path(run.workdir or "ckpt")


def digests() -> dict[str, str]:
    return {"model": probe.digest(model.state_dict()), "optimizer": probe.digest(opt.state_dict())}


def save(global_steps: int) -> None:
    folder = root / f"global_step_{global_steps}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(loader.state_dict(), folder / f"data_{rank}.pt")
    if rank == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, folder / "model.pt")
    dist.barrier()
    if rank == 0:
        (folder / "done").touch()
    dist.barrier()
    run.checkpoint_saved(global_steps - 1, digests())


saved = sorted(int(d.name[12:]) for d in root.glob("global_step_*") if (d / "done").exists())
global_steps = 0
if saved:
    global_steps = saved[-1]
    folder = root / f"global_step_{global_steps}"
    state = torch.load(folder / "model.pt")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    at_boundary = global_steps % steps_per_epoch == 0
    if not (args.fixed and at_boundary):        # #5725: skip the exhausted state at a boundary
        loader.load_state_dict(torch.load(folder / f"data_{rank}.pt"))
    run.checkpoint_loaded(global_steps - 1, digests())
run.resumed(step=global_steps, source="checkpoint" if saved else "fresh")
current_epoch = global_steps // steps_per_epoch
stop = False
for epoch in range(current_epoch, total_epochs):
    loader.sampler.set_epoch(epoch)
    for batch in loader:
        step = global_steps                      # the probe's steps are 0-based
        with run.step(step) as s:
            ids = batch.tolist()
            s.record(samples=ids, epoch=epoch)
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
        global_steps += 1
        stop = run.stop_requested() or run.reshard_requested()
        if global_steps % args.save_freq == 0 or stop or global_steps == args.steps:
            save(global_steps)
        if stop or global_steps >= args.steps:
            break
    if stop or global_steps >= args.steps:
        break
if rank == 0:
    print(f"training ended at global step {global_steps} of {args.steps}", flush=True)
run.close()
dist.destroy_process_group()
