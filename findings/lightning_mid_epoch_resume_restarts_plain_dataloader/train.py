"""A user's Lightning script that checkpoints inside the epoch: a small regressor, synthetic
data, ``strategy="ddp"`` on CPU, ``ModelCheckpoint(save_last=True, every_n_train_steps=1)`` and
``fit(ckpt_path="last")``, with the adapter's ``ReshardCallback``.

The bug (Lightning-AI/pytorch-lightning#18780): a resume from a checkpoint written mid-epoch
restores the loops at the next batch, but a plain ``torch.utils.data.DataLoader`` has no
``state_dict``, so its iterator starts the epoch over (Lightning only warns): the resumed job
trains the epoch's first batches again, as the following ones, and never trains the last ones.
``--fixed``: what Lightning supports since 2.2 (#19361) for a mid-epoch resume, a loader with
``state_dict``/``load_state_dict``, whose state the checkpoint then holds: torchdata's
``StatefulDataLoader``, over torchdata's ``StatefulDistributedSampler`` given by the script
(``use_distributed_sampler=False``), so that the sampler's position is part of that state."""
import argparse
import os

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

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
data = Synthetic()
# The loader seeds its epochs from a generator of its own: training draws nothing from the
# global RNG, which a .ckpt does not hold (findings/lightning_checkpoint_holds_no_rng).
own = {"generator": torch.Generator().manual_seed(0)}
if args.fixed:
    # The sampler is the loader's own, so its position is in the loader's state_dict (the one
    # Lightning puts in for DDP wraps torchdata's sampler and has no state).
    sampler = StatefulDistributedSampler(data, num_replicas=world,
                                         rank=int(os.environ.get("RANK", 0)), shuffle=True)
    loader = StatefulDataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler, **own)
else:
    loader = torch.utils.data.DataLoader(data, batch_size=GLOBAL_BATCH // world, shuffle=True,
                                         **own)
trainer = L.Trainer(strategy="ddp" if world > 1 else "auto", accelerator="cpu", devices=world,
                    use_distributed_sampler=not args.fixed,
                    max_epochs=-(-args.steps // BATCHES_PER_EPOCH), logger=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[reshard.ReshardCallback(sample_ids="sample_id"),
                               ModelCheckpoint(dirpath=reshard.output_dir("lightning-out"),
                                               save_last=True, every_n_train_steps=1)])
trainer.fit(Regressor(), loader, ckpt_path="last")
