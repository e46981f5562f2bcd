"""A user's own training loop on Accelerate (CPU, gloo): a tiny torch module, synthetic data,
``save_state`` every 3 steps, and the adapter's few calls (``reshard.instrument`` before
``prepare``, ``run.resume``, ``with run.step(step, batch) as s``, ``s.loss``,
``run.should_save``, ``run.stopping``, ``run.close``). Nothing downloads.
"""
import argparse
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from pytest_reshard import probe
from pytest_reshard.adapters import accelerate as reshard

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 8)))
p.add_argument("--dropout", type=float, default=0.0)
p.add_argument("--global-batch", type=int, default=8)
p.add_argument("--save-every", type=int, default=3)
args = p.parse_args()

root = Path(probe.attach().workdir or "accelerate-out")
# step_scheduler_with_optimizer=False: by default Accelerate steps a prepared scheduler once per
# process per step (a schedule counted in per-device batches), so at 2 ranks the LR decays twice
# as fast as at 1 and a reshard changes its pace; with the global batch held constant, step it once.
accelerator = Accelerator(cpu=True, step_scheduler_with_optimizer=False)
run = reshard.instrument(accelerator, sample_ids="sample_id", save_every=args.save_every)
set_seed(0)


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i], "sample_id": i}


model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(args.dropout),
                            torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
# The per-process batch keeps the global batch constant at any world size.
loader = torch.utils.data.DataLoader(Synthetic(args.global_batch * args.steps),
                                     batch_size=args.global_batch // accelerator.num_processes)
model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)

start = run.resume(root)
batches = iter(accelerator.skip_first_batches(loader, start))
for step in range(start, args.steps):
    batch = next(batches)
    with run.step(step, batch) as s:
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        s.loss(loss)
    if run.should_save(step):
        accelerator.save_state(run.folder(root, step))
    if run.stopping:
        break
run.close()
accelerator.end_training()
