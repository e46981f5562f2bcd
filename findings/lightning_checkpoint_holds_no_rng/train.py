"""A user's Lightning script: a small regressor with dropout, synthetic data, ``strategy="ddp"``
on CPU, ``ModelCheckpoint(save_last=True, every_n_epochs=1)`` and ``fit(ckpt_path="last")``, with
the adapter's ``ReshardCallback``.

The bug (Lightning-AI/pytorch-lightning#17543): a Lightning ``.ckpt`` holds the model, optimizer,
schedulers, loops and callbacks' state but no random state. A job that resumes draws its dropout
masks from the RNG ``seed_everything`` left in the new process, not from where the saved run
was, so the resumed steps train on other masks than the uninterrupted run. ``--fixed``: a
callback that writes every rank's Python, NumPy and torch RNG states into the checkpoint
(``on_save_checkpoint``) and sets this rank's back (``on_load_checkpoint``)."""
import argparse
import os
import random

import lightning.pytorch as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint

from pytest_reshard.adapters import lightning as reshard

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 4)))
args = p.parse_args()

GLOBAL_BATCH, BATCHES_PER_EPOCH = 8, 2
world = int(os.environ.get("WORLD_SIZE", 1))


class Synthetic(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(GLOBAL_BATCH * BATCHES_PER_EPOCH, 8,
                             generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.x[i].sum(0, keepdim=True), "sample_id": i}


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class RandomStateCheckpoint(L.Callback):
    """Every rank's random state travels in the checkpoint (rank 0 writes the file, so the
    states are gathered), and each rank takes its own back."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        mine = {"python": random.getstate(), "torch": torch.get_rng_state(),
                # plain values: the resume loads the file with torch.load(weights_only=True)
                "numpy": (kind, keys.tolist(), pos, has_gauss, gauss)}
        states = [mine]
        if dist.is_available() and dist.is_initialized():
            states = [None] * dist.get_world_size()
            dist.all_gather_object(states, mine)
        checkpoint["rng_states"] = states

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        states = checkpoint.get("rng_states")
        if not states or len(states) != trainer.world_size:
            return   # saved at another world size: a rank's stream has no place to go
        mine = states[trainer.global_rank]
        random.setstate(mine["python"])
        kind, keys, pos, has_gauss, gauss = mine["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(mine["torch"])


L.seed_everything(0, verbose=False)
# The loader's per-epoch seed comes from a generator of its own, so the global RNG is the
# model's alone: Lightning builds the epoch's iterator before on_train_start, where the adapter
# takes its load digests, and a plain loader would draw that seed from the global RNG there.
loader = torch.utils.data.DataLoader(Synthetic(), batch_size=GLOBAL_BATCH // world, shuffle=True,
                                     generator=torch.Generator().manual_seed(0))
callbacks = [reshard.ReshardCallback(sample_ids="sample_id"),
             ModelCheckpoint(dirpath=reshard.output_dir("lightning-out"), save_last=True,
                             every_n_epochs=1)]
if args.fixed:
    callbacks.append(RandomStateCheckpoint())
trainer = L.Trainer(strategy="ddp" if world > 1 else "auto", accelerator="cpu", devices=world,
                    max_epochs=-(-args.steps // BATCHES_PER_EPOCH), logger=False,
                    enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
trainer.fit(Regressor(), loader, ckpt_path="last")
