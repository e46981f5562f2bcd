"""Lightning-AI/pytorch-lightning#17543 without the harness, in one process: train a small model
with dropout for 2 epochs of 2 batches, with a checkpoint at each epoch's end, then resume a new
Trainer (seeded as a new process would be) from the checkpoint of epoch 0 and compare the losses
of epoch 1 with the uninterrupted run's. The ``.ckpt`` holds no random state (its keys are
printed), so the resumed run draws other dropout masks and its losses differ. Exits 1 when they
differ (the bug), or 0 with ``--fixed``: a callback that saves the Python, NumPy and torch RNG
states in ``on_save_checkpoint`` and sets them back in ``on_load_checkpoint``."""
import logging
import random
import sys
import tempfile
import warnings
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

fixed = "--fixed" in sys.argv
warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


class Samples(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.x[i].sum(0, keepdim=True)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
        self.losses: dict[int, float] = {}

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.losses[self.global_step] = loss.item()
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class RandomState(L.Callback):
    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        checkpoint["rng_states"] = {"python": random.getstate(), "torch": torch.get_rng_state(),
                                    "numpy": (kind, keys.tolist(), pos, has_gauss, gauss)}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        state = checkpoint["rng_states"]
        random.setstate(state["python"])
        torch.set_rng_state(state["torch"])
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))


def fit(folder: str, ckpt_path: str | None = None) -> dict[int, float]:
    L.seed_everything(0, verbose=False)
    model = Model()
    L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False,
              enable_progress_bar=False, enable_model_summary=False,
              callbacks=[ModelCheckpoint(dirpath=folder, every_n_epochs=1, save_top_k=-1),
                         *([RandomState()] if fixed else [])]
              ).fit(model, torch.utils.data.DataLoader(Samples(), batch_size=4),
                    ckpt_path=ckpt_path)
    return model.losses


with tempfile.TemporaryDirectory() as folder:
    whole = fit(folder)
    (epoch_0,) = Path(folder).glob("epoch=0-*.ckpt")
    keys = sorted(torch.load(epoch_0, weights_only=False))
    resumed = fit(tempfile.mkdtemp(dir=folder), str(epoch_0))
print(f"{epoch_0.name} holds {keys}")
for step, loss in resumed.items():
    print(f"step {step}: loss {loss:.6f} resumed, {whole[step]:.6f} uninterrupted")
same = all(whole[step] == loss for step, loss in resumed.items())
if not same:
    print("the resumed run drew other dropout masks than the run it resumed")
sys.exit(0 if same else 1)
