"""torchtitan's final model-only save without the harness, in one gloo process: torchtitan 0.3.0's
own ``CheckpointManager`` (its defaults: ``last_save_model_only=True``), driven the way its Trainer
drives it: a small model, torchtitan's optimizer and LR-scheduler containers, its
``ParallelAwareDataloader``, the train state, ``save(step, last_step=step == steps)`` after each of
8 steps with interval 3. Then the job "runs again with the same command": everything is built
fresh and ``load()`` is called as the Trainer calls it at its start. The newest ``step-8/`` holds
the model alone, ``load`` takes it as a full checkpoint, and DCP raises "Missing key in
checkpoint state_dict". Exits 1 when the restart cannot load (the bug), or 0 with ``--fixed``
(``last_save_model_only=False``): the restart loads step 8 whole and has nothing left to train.
The Trainer itself does not run on CPU unpatched (see docs/guide/frameworks.md, torchtitan), so this
drives the component the bug is in."""
import os
import re
import socket
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw

fixed = "--fixed" in sys.argv
STEPS = 8
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")


class TrainState:
    """The Trainer's own entry in the checkpoint (``states={"train_state": self}``)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step, "ntokens_seen": 0}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


def job(folder: str) -> tuple[CheckpointManager, TrainState, torch.nn.Module, list]:
    """What one launch of the job builds, as the Trainer builds it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    config = default_adamw(lr=8e-4)   # the llama3 debug configuration's optimizer
    config.implementation = "for-loop"   # "fused" is CUDA only
    optimizers = config.build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers,
                                                                    training_steps=STEPS)
    data = ParallelAwareDataloader([torch.randn(8) for _ in range(64)], dp_rank=0,
                                   dp_world_size=1, batch_size=4)
    state = TrainState()
    manager = CheckpointManager.Config(enable=True, interval=3,
                                       last_save_model_only=not fixed).build(
        dataloader=data, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
        states={"train_state": state}, sd_adapter=None, base_folder=folder)
    return manager, state, model, [optimizers, schedulers, data]


with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
folder = tempfile.TemporaryDirectory()

manager, state, model, (optimizers, schedulers, data) = job(folder.name)
manager.load()   # a fresh start: nothing to load
batches = iter(data)
while state.step < STEPS:
    state.step += 1
    model(next(batches)).square().mean().backward()
    optimizers.step()
    optimizers.zero_grad()
    schedulers.step()
    manager.save(state.step, last_step=state.step == STEPS)
manager.close()
saved = sorted(os.listdir(os.path.join(folder.name, "checkpoint")))
print(f"first launch: trained steps 1..{STEPS}, saved {', '.join(saved)} "
      f"(last_save_model_only={not fixed})")

manager, state, model, _ = job(folder.name)   # the same command again
try:
    manager.load()
    outcome = f"the restart loaded step {state.step}: {STEPS - state.step} steps left to train"
    code = 0 if state.step == STEPS else 1
except CheckpointException as e:   # what DCP raises for its ranks' errors
    found = re.findall(r"RuntimeError: (.*)", str(e))
    outcome = f"the restart cannot start: {found[-1] if found else e}"
    code = 1
manager.close()
print(outcome)
dist.destroy_process_group()
folder.cleanup()
sys.exit(code)
