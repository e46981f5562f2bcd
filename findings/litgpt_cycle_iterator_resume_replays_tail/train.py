"""litgpt's ``pretrain`` resume (Lightning-AI/litgpt#1712), reduced to its data path: 2 gloo
ranks, a stateful streaming loader whose ``state_dict`` goes into the checkpoint, and litgpt's
``CycleIterator`` built *after* the loader's state is loaded, as ``pretrain.py`` does.

The loader is a stand-in for litdata's ``StreamingDataLoader`` (litdata and litgpt are not
installed): ``load_state_dict`` keeps the restored position and every new iterator resumes from
it. Before the fix of Lightning-AI/litData#316 (PR #330 describes it: the restored
``_state_dict`` was never cleared) that is what litdata did, so each epoch the CycleIterator
starts after the resume is the restored tail again; and the CycleIterator, not saved, counts
epochs from 0 again. ``--fixed``: the restored position is used once (litdata's fix), and the
CycleIterator's epoch is saved and restored (litgpt PR #2313)."""
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from pytest_reshard import probe

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 12)))
p.add_argument("--every", type=int, default=3)
args = p.parse_args()

run = probe.attach(max_rewind_steps=args.every)
run.stop_requested()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
N, GLOBAL = 16, 4          # 16 samples, 4 a step: an epoch is 4 steps


class StreamingLoader:
    """Yields this rank's share of each global batch; ``state_dict`` is the epoch and the
    batches consumed in it (litdata's ``StreamingDataLoader`` keeps the same two)."""

    def __init__(self, fixed: bool):
        self.fixed, self.epoch, self.batches, self.restored = fixed, 0, 0, None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.restored = dict(state)
        self.epoch, self.batches = state["epoch"], state["batches"]

    def __iter__(self):
        if self.restored is not None:
            self.epoch, start = self.restored["epoch"], self.restored["batches"]
            if self.fixed:
                self.restored = None       # litdata's fix: the restored position is used once
        else:
            start = 0
        for b in range(start, N // GLOBAL):
            self.batches = b + 1
            first = b * GLOBAL + rank * (GLOBAL // world)
            yield list(range(first, first + GLOBAL // world))
        self.epoch, self.batches = self.epoch + 1, 0


class CycleIterator:
    """litgpt.utils.CycleIterator (litgpt 0.5.x), as it is."""

    def __init__(self, iterable):
        self.iterable, self.epoch, self._iterator = iterable, 0, None

    def __next__(self):
        if self._iterator is None:
            self._iterator = iter(self.iterable)
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = iter(self.iterable)
            self.epoch += 1
            return next(self._iterator)


torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
loader = StreamingLoader(args.fixed)
root = Path(run.workdir or "ckpt")
root.mkdir(parents=True, exist_ok=True)


def digests(epoch: int) -> dict[str, str]:
    return {"model": probe.digest(model.state_dict()), "optimizer": probe.digest(opt.state_dict()),
            "data": probe.digest({"loader": loader.state_dict(), "epoch": epoch})}


saved = sorted(int(f.stem[5:]) for f in root.glob("step-*.pt"))
cycle_epoch = 0
if saved:
    last = saved[-1]
    state = torch.load(root / f"step-{last}.pt", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    loader.load_state_dict(state["train_dataloader"])
    cycle_epoch = state.get("cycle_epoch", 0)
    run.checkpoint_loaded(last, digests(cycle_epoch))
    start = last + 1
else:
    start = 0
train_iterator = CycleIterator(loader)   # built after the load, as litgpt's pretrain.py does
train_iterator.epoch = cycle_epoch       # 0 unless --fixed saved it (litgpt PR #2313)
run.resumed(step=start)
for step in range(start, args.steps):
    with run.step(step) as s:
        ids = next(train_iterator)
        s.record(samples=ids, epoch=train_iterator.epoch)
        x = torch.stack([torch.tensor([float(i % 7), float(i % 5), 1.0, float(i % 3)]) for i in ids])
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
        if rank == 0:
            state = {"model": model.state_dict(), "optim": opt.state_dict(),
                     "iter_num": step + 1, "train_dataloader": loader.state_dict(),
                     **({"cycle_epoch": train_iterator.epoch} if args.fixed else {})}
            torch.save(state, root / f"step-{step}.tmp")
            os.replace(root / f"step-{step}.tmp", root / f"step-{step}.pt")
            run.checkpoint_saved(step, digests(train_iterator.epoch))
        dist.barrier()
    if stop:
        break
run.close()
dist.destroy_process_group()
