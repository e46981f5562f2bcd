"""A user's Lightning script that trains for a number of steps (``Trainer(max_steps=N)``): a
small regressor, synthetic data, ``strategy="ddp"`` on CPU, ``ModelCheckpoint(save_last=True,
every_n_epochs=1)`` and ``fit(ckpt_path="last")``, with the adapter's ``ReshardCallback``.

The bug (Lightning-AI/pytorch-lightning#19617): with ``max_steps`` set, the fit loop counts
every resume as a restart inside the saved epoch (``FitLoop.restarting`` is forced on for
iteration-based training), even from the checkpoint ``ModelCheckpoint`` wrote when that epoch
had ended. The resumed job runs one more batch of the finished epoch 0, from an iterator that
starts the epoch again (its first batch's samples, twice), and epoch 1 comes a batch short.
``--fixed``: the same length given as ``max_epochs``, with which an end-of-epoch checkpoint
resumes at the next epoch."""
import argparse
import os

import lightning.pytorch as L
import torch
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
                                       torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


L.seed_everything(0, verbose=False)
# The loader seeds its epochs from a generator of its own: training draws nothing from the
# global RNG, which a .ckpt does not hold (findings/lightning_checkpoint_holds_no_rng).
loader = torch.utils.data.DataLoader(Synthetic(), batch_size=GLOBAL_BATCH // world, shuffle=True,
                                     generator=torch.Generator().manual_seed(0))
length = ({"max_epochs": -(-args.steps // BATCHES_PER_EPOCH)} if args.fixed
          else {"max_steps": args.steps})
trainer = L.Trainer(strategy="ddp" if world > 1 else "auto", accelerator="cpu", devices=world,
                    logger=False, enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[reshard.ReshardCallback(sample_ids="sample_id"),
                               ModelCheckpoint(dirpath=reshard.output_dir("lightning-out"),
                                               save_last=True, every_n_epochs=1)],
                    **length)
trainer.fit(Regressor(), loader, ckpt_path="last")
