"""A user's FSDP2 loop with AdamW, saved with DCP (``get_state_dict``, ``dcp.save``) every 3 steps
and whenever the scheduler gives notice of a move; the device mesh lists the ranks in the order of
the devices they run on (``LOCAL_RANK``, gathered), so that neighbours on the mesh are neighbours
on the machine: what a topology-aware placement does. When the scheduler moves the ranks to other
devices, the mesh of the next run is a permutation, ``DeviceMesh("cpu", [1, 0])``.

The bug (torch 2.13): ``fully_shard`` cuts each parameter by the rank in the mesh dimension's
process group, and that group lists its ranks in ascending order (``new_group`` sorts them, and a
dimension as large as the world reuses the default group), while DTensor, and so DCP, places a
shard by its mesh coordinate. On a permuted mesh rank 1 holds rows 8..15 and says they are rows
0..7: training and full state dicts look right (the gathers use the same group), but DCP loads
rows 0..7 of the checkpoint into rank 1, and the resumed model has its shards swapped.
``--fixed``: the mesh in ascending rank order (``init_device_mesh``), the devices as they are."""
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

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
device = torch.tensor([int(os.environ.get("LOCAL_RANK", rank))])
devices = [torch.zeros_like(device) for _ in range(world)]
dist.all_gather(devices, device)
by_device = sorted(range(world), key=lambda r: int(devices[r]))   # the ranks, device by device
if args.fixed:
    mesh = init_device_mesh("cpu", (world,))
else:
    mesh = DeviceMesh("cpu", torch.tensor(by_device))
run.note("mesh", ranks=mesh.mesh.tolist(), coordinate=mesh.get_coordinate())

GLOBAL = 8
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
fully_shard(model[0], mesh=mesh)
fully_shard(model[2], mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
root = Path(run.workdir or "ckpt")


def digests() -> dict[str, str]:
    """The full (gathered) state: probe.digest gathers each DTensor."""
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


def sample(i: int) -> torch.Tensor:
    return torch.tensor([float(i % 7), float(i % 5), 1.0, float(i % 3)])


for step in range(start, args.steps):
    with run.step(step) as s:
        ids = [step * GLOBAL + rank * (GLOBAL // world) + i for i in range(GLOBAL // world)]
        s.record(samples=ids)
        x = torch.stack([sample(i) for i in ids])
        s.point("forward")
        loss = ((model(x) - x.flip(1)) ** 2).mean()
        s.point("backward")
        opt.zero_grad()
        loss.backward()
        s.point("optimizer")
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        s.record(loss=float(total) / world)
    stop = run.stop_requested() or run.reshard_requested()
    if (step + 1) % args.every == 0 or stop or step == args.steps - 1:
        dcp.save(checkpoint(), checkpoint_id=root / f"step-{step}")
        run.checkpoint_saved(step, digests())
    if stop:
        break
run.close()
dist.destroy_process_group()
