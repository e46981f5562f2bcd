"""A user's Accelerate loop (huggingface/accelerate#4071): 2 processes, a shuffled loader with
``DataLoaderConfiguration(use_seedable_sampler=True)`` (the permutation is seeded by the epoch),
``save_state`` every 3 steps, and the adapter's ``run.steps``, which resumes mid-epoch as the
Accelerate docs say: ``set_epoch(epoch)``, then ``skip_first_batches(loader, n)`` for the rest of
that epoch.

Up to accelerate 1.14.0 the loader ``skip_first_batches`` builds starts at ``iteration = 0``, and
its ``__iter__`` calls ``set_epoch(0)``: the rest of epoch 1 comes in epoch 0's order. 1.15.0
carries the loader's ``iteration`` over (#4071). The script pins either behaviour whatever is
installed: without ``--fixed`` the skipped loader's ``iteration`` is set back to 0 (1.14.0's
constructor), with it to the loader's own (1.15.0's)."""
import argparse
import os

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed

from pytest_reshard.adapters import accelerate as reshard

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 10)))
args = p.parse_args()

accelerator = Accelerator(cpu=True, step_scheduler_with_optimizer=False,
                          dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
run = reshard.instrument(accelerator, sample_ids="sample_id", save_every=3,
                         output_dir="accelerate-out")
skip = accelerator.skip_first_batches


def skip_first_batches(dataloader, num_batches=0):
    skipped = skip(dataloader, num_batches)
    # 1.15.0 (#4071): the epoch set on the loader carries over; 1.14.0: the new loader is at 0.
    skipped.iteration = dataloader.iteration if args.fixed else 0
    return skipped


accelerator.skip_first_batches = skip_first_batches


class Synthetic(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.x[i].sum(0, keepdim=True), "sample_id": i}


set_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
# 16 samples, 4 a step (2 per process): an epoch is 4 steps.
loader = torch.utils.data.DataLoader(Synthetic(), batch_size=4 // accelerator.num_processes,
                                     shuffle=True)
model, opt, loader = accelerator.prepare(model, opt, loader)
for _step, batch in run.steps(loader, args.steps):
    loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
accelerator.end_training()
