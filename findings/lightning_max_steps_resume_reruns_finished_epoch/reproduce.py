"""Lightning-AI/pytorch-lightning#19617 without the harness, in one process: train 8 steps with
``Trainer(max_steps=8)`` over 2 epochs of 4 batches (8 samples in order, batch 2), with a
checkpoint at each epoch's end, then resume a new Trainer from the checkpoint of epoch 0 (what a
job killed in epoch 1 does) and list the (epoch, batch_idx, samples) of each step. With
``max_steps`` the fit loop treats the resume as a restart inside epoch 0: it runs a fifth batch
of that finished epoch, from an iterator that starts it again (samples [0, 1] twice), and
epoch 1 comes a batch short. Exits 1 when the resumed steps differ from the uninterrupted run's
(the bug), or 0 with ``--fixed``: the same length as ``max_epochs=2``."""
import logging
import sys
import tempfile
import warnings
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

fixed = "--fixed" in sys.argv
warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": torch.full((4,), float(i)), "id": i}


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.trained: list[tuple[int, int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.trained.append((self.current_epoch, batch_idx, batch["id"].tolist()))
        return self.net(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(folder: str, ckpt_path: str | None = None) -> list[tuple[int, int, list[int]]]:
    L.seed_everything(0, verbose=False)
    model = Model()
    L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
              enable_model_summary=False, **({"max_epochs": 2} if fixed else {"max_steps": 8}),
              callbacks=[ModelCheckpoint(dirpath=folder, every_n_epochs=1, save_top_k=-1)]
              ).fit(model, torch.utils.data.DataLoader(Samples(), batch_size=2),
                    ckpt_path=ckpt_path)
    return model.trained


with tempfile.TemporaryDirectory() as folder:
    whole = fit(folder)
    (epoch_0,) = Path(folder).glob("epoch=0-*.ckpt")
    resumed = fit(tempfile.mkdtemp(dir=folder), str(epoch_0))
print(f"{'max_epochs=2' if fixed else 'max_steps=8'}, (epoch, batch_idx, samples) of each step")
print(f"uninterrupted, steps 4-7: {whole[4:]}")
print(f"resumed from {epoch_0.name}: {resumed}")
if resumed == whole[4:]:
    sys.exit(0)
print(f"the resume ran {sum(e == 0 for e, _, _ in resumed)} more batch(es) of the finished "
      f"epoch 0 and {sum(e == 1 for e, _, _ in resumed)} of epoch 1's 4")
sys.exit(1)
