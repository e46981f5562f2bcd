"""pytorch/pytorch#140900 without the harness: one gloo process saves an AdamW optimizer
stepped under a StepLR schedule with DCP, loads it into a fresh optimizer, and builds the
schedule at the restored step. Exits 1 with the KeyError (the bug), or 0 with ``--fixed``
(the schedule's own state_dict saved and loaded) when the resumed LR is the one the
uninterrupted schedule would use."""
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

fixed = "--fixed" in sys.argv
with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


model, opt = build()
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
for _ in range(3):
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    sched.step()
expected = sched.get_last_lr()
folder = tempfile.TemporaryDirectory()
m, o = get_state_dict(model, opt)
dcp.save({"model": m, "optim": o, "sched": sched.state_dict()}, checkpoint_id=folder.name)
print(f"saved: initial_lr {opt.param_groups[0]['initial_lr']}, lr {expected}")

model, opt = build()
m, o = get_state_dict(model, opt)
fresh = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
state = {"model": m, "optim": o, "sched": fresh.state_dict()}
dcp.load(state, checkpoint_id=folder.name)
set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
print(f"loaded: initial_lr {opt.param_groups[0].get('initial_lr')}")
code = 0
try:
    if fixed:
        fresh.load_state_dict(state["sched"])
        resumed = fresh.get_last_lr()
    else:
        resumed = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5,
                                                  last_epoch=3).get_last_lr()
    print(f"resumed lr {resumed}, uninterrupted {expected}")
    code = 0 if resumed == expected else 1
except KeyError as e:
    print(f"the schedule cannot resume: KeyError {e}")
    code = 1
dist.destroy_process_group()
folder.cleanup()
sys.exit(code)
