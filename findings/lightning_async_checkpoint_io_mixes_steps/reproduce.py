"""Lightning-AI/pytorch-lightning#20953 without the harness: one process, no Trainer. A model
and its AdamW state go to ``AsyncCheckpointIO.save_checkpoint`` as the Trainer's checkpoint dict
does (their live tensors), the storage writes only after the next ``optimizer.step()`` (an
event, not a timing), and the file is compared with the state at the save.

2.6.6 is installed, which clones the tensors (2.5.4, #21079): without ``--fixed`` the script
uses lightning 2.5.3's ``save_checkpoint`` put back (the dict submitted uncloned). Exits 1 when
the file holds a later step's weights (the bug), or 0 (``--fixed``: the installed class)."""
import sys
import tempfile
import threading
from pathlib import Path

import lightning
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO

fixed = "--fixed" in sys.argv


class PreFixAsyncCheckpointIO(AsyncCheckpointIO):   # lightning 2.5.3's save_checkpoint
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
    def __init__(self):
        super().__init__()
        self.go = threading.Event()

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if not self.go.wait(timeout=60):
            raise TimeoutError("never released")
        super().save_checkpoint(checkpoint, path, storage_options)


torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.AdamW(model.parameters(), lr=0.1)


def train_step():
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


train_step()
storage = SlowStorage()
io = AsyncCheckpointIO(storage) if fixed else PreFixAsyncCheckpointIO(storage)
folder = tempfile.TemporaryDirectory()
path = Path(folder.name) / "step-1.ckpt"
at_save = {k: v.clone() for k, v in model.state_dict().items()}
io.save_checkpoint({"global_step": 1, "state_dict": model.state_dict(),
                    "optimizer_states": [opt.state_dict()]}, path)
train_step()                      # training goes on while the write is pending
storage.go.set()
io.teardown()                     # waits for the write
saved = torch.load(path, weights_only=True)
print(f"lightning {lightning.__version__}, {'installed' if fixed else '2.5.3'} save_checkpoint")
print(f"at the save: weight {at_save['weight'].tolist()}, step 1")
print(f"in the file: weight {saved['state_dict']['weight'].tolist()}, global_step "
      f"{saved['global_step']}, Adam step {float(saved['optimizer_states'][0]['state'][0]['step'])}")
folder.cleanup()
if all(torch.equal(saved["state_dict"][k], v) for k, v in at_save.items()):
    sys.exit(0)
print("the checkpoint of step 1 holds the weights and Adam state of step 2")
sys.exit(1)
