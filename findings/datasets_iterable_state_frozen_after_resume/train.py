"""A user's DDP loop over a Hugging Face ``datasets`` IterableDataset, split between the ranks
with ``split_dataset_by_node`` and read through torchdata's ``StatefulDataLoader``, whose
``state_dict()`` (the dataset's own state inside) each rank saves with every checkpoint, as
torchtitan's data loader does.

The bug (huggingface/datasets#8308, pytorch/torchtitan#3907; datasets 5.0.0): after
``load_state_dict`` the dataset resumes at the right example, but its ``state_dict()`` keeps
returning the position it started the load from, zero: ``_BaseExamplesIterable.load_state_dict``
rebinds the examples iterable's state to a new dict (#8194) while ``IterableDataset._state_dict``
still points at the old one. A job resumed once saves that zero in every checkpoint, so a second
resume restarts the stream. datasets 5.0.1 re-points the dataset's state at the live one (#8295)
and the installed datasets has that fix, so this script gives its dataset 5.0.0's resume (the
same calls, without the re-pointing line). ``--fixed``: the installed datasets as it is."""
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from datasets import Dataset, IterableDataset
from datasets.distributed import split_dataset_by_node
from torch.nn.parallel import DistributedDataParallel as DDP
from torchdata.stateful_dataloader import StatefulDataLoader

from pytest_reshard import probe

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 12)))
p.add_argument("--every", type=int, default=3)
args = p.parse_args()


class Datasets500IterableDataset(IterableDataset):
    """datasets 5.0.0's ``IterableDataset._prepare_ex_iterable_for_iteration`` (the path
    ``__iter__`` takes outside a DataLoader worker): the dataset's state is built from the fresh
    examples iterable, then the saved state is loaded into the iterable, and 5.0.0 stops there."""

    def _prepare_ex_iterable_for_iteration(self, batch_size=1, drop_last_batch=False):
        starting, self._starting_state_dict = self._starting_state_dict, None
        try:   # the installed code with nothing to resume: the state of a fresh iterable
            ex_iterable = super()._prepare_ex_iterable_for_iteration(batch_size, drop_last_batch)
        finally:
            self._starting_state_dict = starting
        if starting and self.epoch == starting["epoch"]:
            ex_iterable.load_state_dict(starting["examples_iterable"])
        return ex_iterable


run = probe.attach(max_rewind_steps=args.every)
run.stop_requested()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
N, PER_RANK = 64, 2                      # 64 samples, 2 a rank a step: one epoch covers the run
table = Dataset.from_dict({"sample_id": list(range(N)),
                           "x": torch.randn(N, 4, generator=torch.Generator().manual_seed(1))})
stream = split_dataset_by_node(table.to_iterable_dataset(num_shards=4), rank=rank,
                               world_size=world).with_format("torch")
if not args.fixed:
    stream.__class__ = Datasets500IterableDataset
loader = StatefulDataLoader(stream, batch_size=PER_RANK)
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
run.resumed(step=start, source="checkpoint" if saved else "fresh")
batches = iter(loader)
for step in range(start, args.steps):
    with run.step(step) as s:
        batch = next(batches)
        s.record(samples=batch["sample_id"].tolist(), epoch=0)
        s.point("forward")
        loss = ((model(batch["x"]).squeeze(1) - batch["x"].sum(1)) ** 2).mean()
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
