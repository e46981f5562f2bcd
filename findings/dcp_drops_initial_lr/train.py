"""A user's loop on DDP with AdamW and a StepLR schedule, saved with DCP through
``get_state_dict``/``set_state_dict`` (torch's recommended path). At a resume it builds the
schedule at the restored step (``StepLR(..., last_epoch=step)``, the documented way to resume a
schedule), but the optimizer DCP restored has lost ``initial_lr``, and the constructor raises.
``--fixed``: the schedule's own ``state_dict`` goes into the checkpoint, and a schedule built
fresh loads it."""
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

from pytest_reshard import probe

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 8)))
p.add_argument("--every", type=int, default=3)
args = p.parse_args()

run = probe.attach(max_rewind_steps=args.every)
run.stop_requested()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
GLOBAL = 8
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
root = Path(run.workdir or "ckpt")


def schedule(last_epoch: int = -1) -> torch.optim.lr_scheduler.StepLR:
    return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5, last_epoch=last_epoch)


def digests(sched: torch.optim.lr_scheduler.StepLR) -> dict[str, str]:
    o = opt.state_dict()
    return {"model": probe.digest(model.state_dict()),
            "optimizer": probe.digest([o["state"], [g["lr"] for g in o["param_groups"]]]),
            "lr_scheduler": probe.digest({"last_epoch": sched.last_epoch,
                                          "last_lr": sched.get_last_lr()})}


def checkpoint(sched: torch.optim.lr_scheduler.StepLR | None = None) -> dict:
    m, o = get_state_dict(model, opt)
    return {"model": m, "optim": o, **({"sched": sched.state_dict()} if sched else {})}


saved = sorted(int(d.name[5:]) for d in root.glob("step-*") if (d / ".metadata").exists())
if saved:
    last = saved[-1]
    sched = schedule() if args.fixed else None
    state = checkpoint(sched)
    dcp.load(state, checkpoint_id=root / f"step-{last}")
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if sched is not None:
        sched.load_state_dict(state["sched"])
    else:
        sched = schedule(last_epoch=last + 1)   # KeyError: 'initial_lr' (DCP dropped it)
    run.checkpoint_loaded(last, digests(sched))
    start = last + 1
else:
    sched, start = schedule(), 0
run.resumed(step=start)
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
        sched.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        s.record(loss=float(total) / world)
    stop = run.stop_requested() or run.reshard_requested()
    if (step + 1) % args.every == 0 or stop or step == args.steps - 1:
        dcp.save(checkpoint(sched if args.fixed else None), checkpoint_id=root / f"step-{step}")
        run.checkpoint_saved(step, digests(sched))
    if stop:
        break
run.close()
dist.destroy_process_group()
