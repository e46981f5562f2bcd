"""Lightning-AI/pytorch-lightning#18780 without the harness, in one process: train one epoch of 4
batches (8 samples in order, batch 2) with a checkpoint after every step, then resume a new
Trainer from the checkpoint written after step 2, mid-epoch, and list what each run trained at
each batch. Lightning restores its loops at batch 2, but a plain ``DataLoader`` has no
``state_dict``, so its iterator starts the epoch over: the resumed run trains samples [0, 1] and
[2, 3] again as batches 2 and 3, and never [4, 5] and [6, 7]. Exits 1 when the resumed batches
differ from the uninterrupted run's (the bug), or 0 with ``--fixed``: torchdata's
``StatefulDataLoader``, whose state Lightning (>= 2.2, #19361) saves in the checkpoint and loads
back."""
import logging
import sys
import tempfile
import warnings
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

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
        self.trained: list[tuple[int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.trained.append((batch_idx, batch["id"].tolist()))
        return self.net(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(folder: str, ckpt_path: str | None = None) -> list[tuple[int, list[int]]]:
    L.seed_everything(0, verbose=False)
    loader = (StatefulDataLoader if fixed else torch.utils.data.DataLoader)(Samples(),
                                                                            batch_size=2)
    model = Model()
    L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
              enable_progress_bar=False, enable_model_summary=False,
              callbacks=[ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=-1)]
              ).fit(model, loader, ckpt_path=ckpt_path)
    return model.trained


with tempfile.TemporaryDirectory() as folder:
    whole = fit(folder)
    (mid_epoch,) = Path(folder).glob("*step=2.ckpt")
    resumed = fit(tempfile.mkdtemp(dir=folder), str(mid_epoch))
print(f"{'StatefulDataLoader' if fixed else 'DataLoader'}: uninterrupted {whole}")
print(f"resumed from {mid_epoch.name} (mid-epoch): {resumed}")
if resumed == whole[2:]:
    sys.exit(0)
again = sorted({i for _, ids in resumed for i in ids} & {i for _, ids in whole[:2] for i in ids})
print(f"the resumed run trained samples {again} a second time in the same epoch, and "
      f"{sorted({i for _, ids in whole[2:] for i in ids} - {i for _, ids in resumed for i in ids})}"
      " not at all")
sys.exit(1)
