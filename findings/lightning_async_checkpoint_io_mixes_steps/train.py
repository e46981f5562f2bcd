"""A user's Lightning script with ``AsyncCheckpointIO`` (Lightning-AI/pytorch-lightning#20953):
2 DDP ranks on CPU, ``ModelCheckpoint(save_last=True, every_n_epochs=1)``,
``fit(ckpt_path="last")``, and the harness's callback.

Up to lightning 2.5.3 ``AsyncCheckpointIO.save_checkpoint`` handed the checkpoint dict to its
writer thread as it was: the model's and the optimizer's live tensors. Training goes on while
the thread writes, and ``optimizer.step()`` updates those tensors in place, so the file holds
the weights and Adam moments of a later step under the step counter, loops and LR schedule of
the step saved. 2.5.4 (#21079) clones every tensor on the caller's thread first. 2.6.6 is
installed: without ``--fixed`` the script uses 2.5.3's ``save_checkpoint`` put back (a subclass
that submits the dict uncloned); with ``--fixed`` the installed class as it is.

The storage is slower than a training step (a network file system, an object store): the write
waits until the step after the save has ended (its optimizer step done), and that step's end
waits until the write is done. A gate of events, not a timing, so both ways are deterministic.
"""
import argparse
import os
import random
import threading
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO

from pytest_reshard.adapters import lightning as reshard

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 12)))
p.add_argument("--batches-per-epoch", type=int, default=4)
args = p.parse_args()

world = int(os.environ.get("WORLD_SIZE", 1))
out = Path(reshard.output_dir("lightning-out"))
GLOBAL = 8
WAIT_S = 120      # a bound on every wait: a gate never opened is an error, not a hang


class PreFixAsyncCheckpointIO(AsyncCheckpointIO):
    """lightning 2.5.3's ``save_checkpoint``: the dict goes to the thread uncloned."""

    def save_checkpoint(self, *args, **kwargs):
        self._ensure_setup()

        def _save_checkpoint(*args, **kwargs):
            try:
                self.checkpoint_io.save_checkpoint(*args, **kwargs)
            except BaseException as ex:
                self._error = ex

        self._executor.submit(_save_checkpoint, *args, **kwargs)
        if self._error:
            raise self._error


class SlowStorage(TorchCheckpointIO):
    """Writes a checkpoint of global step g only once step g (the next one) has ended."""

    def __init__(self):
        super().__init__()
        self.cv = threading.Condition()
        self.open_through = -1            # saves of global steps up to this may be written

    def release(self, through):
        with self.cv:
            self.open_through = through
            self.cv.notify_all()

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        g = checkpoint["global_step"]
        with self.cv:
            if not self.cv.wait_for(lambda: self.open_through >= g, timeout=WAIT_S):
                raise TimeoutError(f"the write of global step {g} was never released")
        super().save_checkpoint(checkpoint, path, storage_options)


storage = SlowStorage()
async_io = AsyncCheckpointIO(storage) if args.fixed else PreFixAsyncCheckpointIO(storage)


class StorageClock(L.Callback):
    """The slow storage's clock: at each batch's end (the optimizer step done) the writes of
    earlier steps proceed, and the batch ends once they are on disk."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        storage.release(trainer.global_step - 1)
        if async_io._executor is not None:
            async_io._executor.submit(lambda: None).result(timeout=WAIT_S)

    def on_train_end(self, trainer, pl_module):
        storage.release(float("inf"))


def numpy_rng():
    """NumPy's global state as ``torch.load(weights_only=True)`` reads it back."""
    name, keys, *rest = np.random.get_state()
    return (name, torch.from_numpy(keys.copy()), *rest)


class RNGState(L.Callback):
    """A .ckpt holds no RNG state (a separate finding of the adapter's): kept here, both ways,
    so that only the asynchronous write is judged."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        checkpoint["rng"] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                             "numpy": numpy_rng()}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        if "rng" in checkpoint:
            torch.set_rng_state(checkpoint["rng"]["torch"])
            random.setstate(checkpoint["rng"]["python"])
            name, keys, *rest = checkpoint["rng"]["numpy"]
            np.random.set_state((name, keys.numpy(), *rest))


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
                                       torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


L.seed_everything(0, verbose=False)
data = Synthetic(GLOBAL * args.batches_per_epoch)
if world > 1:   # Lightning gives each rank a DistributedSampler (shuffle, seed 0)
    loader = torch.utils.data.DataLoader(data, batch_size=GLOBAL // world, shuffle=True)
else:
    loader = torch.utils.data.DataLoader(data, batch_size=GLOBAL, sampler=(
        torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)))
checkpoints = ModelCheckpoint(dirpath=out, save_last=True, save_top_k=-1, every_n_epochs=1)
trainer = L.Trainer(strategy="ddp" if world > 1 else "auto", accelerator="cpu", devices=world,
                    logger=False, max_epochs=-(-args.steps // args.batches_per_epoch),
                    enable_progress_bar=False, enable_model_summary=False,
                    num_sanity_val_steps=0, plugins=[async_io],
                    callbacks=[reshard.ReshardCallback(sample_ids="sample_id", state_each_step=True),
                               StorageClock(), RNGState(), checkpoints])
trainer.fit(Regressor(), loader, ckpt_path="last")
