"""A user's Accelerate loop on its default sampler (huggingface/accelerate#3242, #4233): 2
processes, ``DataLoader(shuffle=True)``, ``save_state`` every 3 steps, and the resume the
Accelerate docs show (``load_state``, then ``skip_first_batches`` for the rest of the epoch, the
plain loader after), with the adapter's one-call-at-a-time probe calls.

At more than one process ``prepare`` gives the ``RandomSampler`` a generator of its own
(``loader.synchronized_generator``), seeded from the global RNG at ``prepare``. ``save_state``
never saves it, so a resumed job starts it afresh: a resume inside epoch 1 or later finishes
that epoch in epoch 0's order (#3242, open in accelerate 1.15.0).

``--live-generator``: the generator saved as it is at the save (a ``register_for_checkpointing``
object, what #4232 made ``save_state`` do). Mid-epoch it has already drawn this epoch's
permutation, so the resume skips into one never trained on (#4233).
``--fixed``: #4233's rule, in the script: save the generator as it was when the epoch's
permutation was drawn (its state before the epoch's ``iter``), or, after the epoch's last batch,
as it is (the next epoch's)."""
import argparse
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from pytest_reshard.adapters import accelerate as reshard

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--live-generator", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 10)))
args = p.parse_args()

accelerator = Accelerator(cpu=True)
run = reshard.instrument(accelerator, sample_ids="sample_id", save_every=3)
root = run.workdir or Path("accelerate-out")


class Synthetic(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.x[i].sum(0, keepdim=True), "sample_id": i}


class ShuffleState:
    """The sampler's generator in the checkpoint (``register_for_checkpointing``)."""

    def __init__(self, generator: torch.Generator, live: bool):
        self.generator, self.live = generator, live
        self.drawn_from = generator.get_state()

    def epoch_begins(self) -> None:
        """Before an epoch's ``iter``: the state its permutation is drawn from."""
        self.drawn_from = self.generator.get_state()

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state() if self.live else self.drawn_from}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


set_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
# 16 samples, 4 a step (2 per process): an epoch is 4 steps.
loader = torch.utils.data.DataLoader(Synthetic(), batch_size=4 // accelerator.num_processes,
                                     shuffle=True)
model, opt, loader = accelerator.prepare(model, opt, loader)
shuffle = ShuffleState(loader.synchronized_generator, live=args.live_generator)
if args.fixed or args.live_generator:
    accelerator.register_for_checkpointing(shuffle)
start = run.resume(root)                     # load_state of the newest complete save
per_epoch = len(loader)
epoch, skip = divmod(start, per_epoch)
step = start
while step < args.steps and not run.stopping:
    loader.set_epoch(epoch)
    shuffle.epoch_begins()
    for batch in (accelerator.skip_first_batches(loader, skip) if skip else loader):
        with run.step(step, batch, epoch=epoch):
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        if (step + 1) % per_epoch == 0:
            # The epoch's last batch: the loader has run its sampler out, and the generator is
            # where the next epoch draws from (a save now resumes at the next epoch's start).
            shuffle.epoch_begins()
        if run.should_save(step):
            accelerator.save_state(run.folder(root, step))
        step += 1
        if step >= args.steps or run.stopping:
            break
    epoch, skip = epoch + 1, 0
run.close()
accelerator.end_training()
