"""A user's loop on DDP with AdamW, saved with ``dcp.async_save`` on CPU as the async checkpoint
recipe does it: the save gets a gloo group of its own, training goes on while it writes, and the
loop waits for the future one step later (before the next step can be cut short by a kill).

The bug (pytorch/pytorch#144657, torch <= 2.6): ``async_save`` "staged" the state dict with
``_offload_state_dict_to_cpu``, which returns a CPU tensor as it is, so the writing thread
serialised the live tensors, and the next ``opt.step()`` landed in the checkpoint. torch 2.7 copies
instead (#145408), and the installed torch does, so this script hands ``async_save`` torch 2.6's
staging (the one function it called) as ``async_stager``. ``--fixed``: the installed torch's own
staging, which copies the state before ``async_save`` returns."""
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._state_dict_utils import _offload_state_dict_to_cpu
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

from pytest_reshard import probe

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 12)))
p.add_argument("--every", type=int, default=3)
args = p.parse_args()


class Torch26Staging(BlockingAsyncStager):
    """torch 2.6's ``BlockingAsyncStager.stage`` (what ``FileSystemWriter`` staged with) and
    ``async_save``'s fallback: no copy for a tensor already on the CPU."""

    def stage(self, state_dict):
        return _offload_state_dict_to_cpu(state_dict, type_check=False)


run = probe.attach(max_rewind_steps=args.every)
run.stop_requested()
dist.init_process_group("gloo")
save_group = dist.new_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
GLOBAL = 8
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
root = Path(run.workdir or "ckpt")


def digests() -> dict[str, str]:
    o = opt.state_dict()
    return {"model": probe.digest(model.state_dict()),
            "optimizer": probe.digest([o["state"], [g["lr"] for g in o["param_groups"]]])}


def checkpoint() -> dict:
    m, o = get_state_dict(model, opt)
    return {"model": m, "optim": o}


saved = sorted(int(d.name[5:]) for d in root.glob("step-*") if (d / ".metadata").exists())
if saved:
    last = saved[-1]
    state = checkpoint()
    dcp.load(state, checkpoint_id=root / f"step-{last}")
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    run.checkpoint_loaded(last, digests())
    start = last + 1
else:
    start = 0
run.resumed(step=start)
pending = None   # (future, step, digest of the state at the save)


def finish() -> None:
    global pending
    if pending is not None:
        future, step, digest = pending
        future.result()
        run.checkpoint_saved(step, digest)
        pending = None


for step in range(start, args.steps):
    with run.step(step) as s:
        ids = [step * GLOBAL + rank * (GLOBAL // world) + i for i in range(GLOBAL // world)]
        s.record(samples=ids)
        x = torch.stack([torch.tensor([float(i % 7), float(i % 5), 1.0, float(i % 3)]) for i in ids])
        s.point("forward")
        loss = ((model(x).squeeze(1) - x.sum(1)) ** 2).mean()
        s.point("backward")
        opt.zero_grad()
        loss.backward()
        s.point("optimizer")
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        s.record(loss=float(total) / world)
    run.state_after(step, digests())   # so one_step_checkpoint can name the step a save holds
    finish()   # the previous save has had a whole step to write
    stop = run.stop_requested() or run.reshard_requested()
    if (step + 1) % args.every == 0 or stop or step == args.steps - 1:
        digest = digests()   # the state this checkpoint is for
        future = dcp.async_save(checkpoint(), checkpoint_id=root / f"step-{step}",
                                process_group=save_group,
                                async_stager=None if args.fixed else Torch26Staging())
        pending = (future, step, digest)
        if stop or step == args.steps - 1:
            finish()
    if stop:
        break
finish()
run.close()
dist.destroy_process_group()
