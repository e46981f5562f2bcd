"""A user's Lightning script: a tiny torch module, synthetic data, DDP on CPU (gloo), and the
one line ``callbacks=[reshard.ReshardCallback(sample_ids="sample_id"), ...]``. Nothing
downloads.

Options: ``--dropout P`` (0 by default), ``--batches-per-epoch N`` (the epoch length in steps),
``--every-n-train-steps K`` (a mid-epoch checkpoint every K steps; 0: at every epoch's end only),
``--ckpt-dir D`` (the ModelCheckpoint's folder; by default ``reshard.output_dir``),
``--max-steps`` (stop by ``max_steps`` instead of ``max_epochs``), ``--save-rng`` (a callback
keeps torch's and Python's RNG states in the checkpoint, which Lightning does not).
"""
import argparse
import os
import random
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from pytest_reshard.adapters import lightning as reshard

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 8)))
p.add_argument("--dropout", type=float, default=0.0)
p.add_argument("--global-batch", type=int, default=8)
p.add_argument("--batches-per-epoch", type=int, default=4)
p.add_argument("--every-n-train-steps", type=int, default=0)
p.add_argument("--ckpt-dir", default=None,
               help="ModelCheckpoint's dirpath (default: reshard.output_dir('lightning-out'))")
p.add_argument("--max-steps", action="store_true",
               help="stop by max_steps (iteration-based) instead of max_epochs")
p.add_argument("--save-rng", action="store_true",
               help="save and restore the RNG states in the checkpoint (a callback)")
args = p.parse_args()

world = int(os.environ.get("WORLD_SIZE", 1))
out = Path(args.ckpt_dir or reshard.output_dir("lightning-out"))


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i], "sample_id": i}


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Dropout(args.dropout), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class RNGState(L.Callback):
    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        checkpoint["rng"] = {"torch": torch.get_rng_state(), "python": random.getstate()}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        torch.set_rng_state(checkpoint["rng"]["torch"])
        random.setstate(checkpoint["rng"]["python"])


L.seed_everything(0, verbose=False)
model = Regressor()
data = Synthetic(args.global_batch * args.batches_per_epoch)
if world > 1:   # Lightning gives each rank a DistributedSampler (shuffle, seed 0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.global_batch // world, shuffle=True)
else:           # the same global order alone, so a step takes the same samples at any size
    loader = torch.utils.data.DataLoader(data, batch_size=args.global_batch, sampler=(
        torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)))
checkpoints = ModelCheckpoint(dirpath=out, save_last=True, save_top_k=-1,
                              every_n_train_steps=args.every_n_train_steps or None,
                              every_n_epochs=None if args.every_n_train_steps else 1)
trainer = L.Trainer(strategy="ddp" if world > 1 else "auto", accelerator="cpu", devices=world,
                    logger=False,
                    **({"max_steps": args.steps} if args.max_steps else
                       {"max_epochs": -(-args.steps // args.batches_per_epoch)}), enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0,
                    callbacks=[reshard.ReshardCallback(sample_ids="sample_id"), checkpoints,
                               *([RNGState()] if args.save_rng else [])])
trainer.fit(model, loader, ckpt_path="last")
