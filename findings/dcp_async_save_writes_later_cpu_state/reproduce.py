"""pytorch/pytorch#144657 without the harness: one gloo process trains a CPU model with AdamW,
calls ``dcp.async_save`` after a step and takes the next optimizer step before the future
completes (what the async checkpoint recipe does), ten times; then it loads each checkpoint and
compares it with the state at the call. torch <= 2.6 staged with ``_offload_state_dict_to_cpu``
(no copy of a CPU tensor); the installed torch copies, so the bug is shown with 2.6's staging
handed in as ``async_stager``. Exits 1 when a checkpoint holds a later state (the bug), or 0
with ``--fixed`` (the installed torch's staging) when every checkpoint holds its own step."""
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._state_dict_utils import _offload_state_dict_to_cpu
from torch.distributed.checkpoint.staging import BlockingAsyncStager

fixed = "--fixed" in sys.argv


class Torch26Staging(BlockingAsyncStager):
    def stage(self, state_dict):
        return _offload_state_dict_to_cpu(state_dict, type_check=False)


with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
save_group = dist.new_group(backend="gloo")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.AdamW(model.parameters(), lr=0.1)


def train_step() -> None:
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


folder = tempfile.TemporaryDirectory()
later = 0
for n in range(10):
    train_step()
    at_save = {k: v.clone() for k, v in model.state_dict().items()}
    future = dcp.async_save({"model": model.state_dict()}, checkpoint_id=f"{folder.name}/{n}",
                            process_group=save_group,
                            async_stager=None if fixed else Torch26Staging())
    train_step()   # training goes on while the checkpoint is written
    after = {k: v.clone() for k, v in model.state_dict().items()}
    future.result()
    state = {"model": {k: torch.zeros_like(v) for k, v in at_save.items()}}
    dcp.load(state, checkpoint_id=f"{folder.name}/{n}")
    held = state["model"]
    if not all(torch.equal(held[k], at_save[k]) for k in at_save):
        later += 1
        newer = all(torch.equal(held[k], after[k]) for k in after)
        print(f"checkpoint {n}: bias at the save {at_save['bias'].tolist()}, in the checkpoint "
              f"{held['bias'].tolist()} ({'the next step' if newer else 'a mix'})")
staging = "its own" if fixed else "2.6's"
print(f"torch {torch.__version__}, {staging} staging: {later} of 10 "
      "checkpoints hold a later state than the one saved")
dist.destroy_process_group()
folder.cleanup()
sys.exit(1 if later else 0)
