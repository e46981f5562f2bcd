"""A user's DDP training script with a guard against silent data corruption, ``--guard``:

- ``replicas`` (correct): after each update every rank all-reduces a checksum of its parameters
  (their sum, and the sum of their bytes as integers); DDP replicas must agree to the bit, so a
  flipped bit on one rank shows at once. The guard records it (``run.detected``) and every rank
  exits 3 before the next save; the relaunch resumes from the last checkpoint, saved before the
  flip.
- ``nan``: only a non-finite loss stops it: a flip in the exponent (bit 30) is caught a step
  later, a low bit never.
- ``off``: no check at all.

Checkpoints: rank 0 ``torch.save``s model and optimizer to ``OUT/ckpt-N.pt`` every
``--ckpt-every`` steps (through a temporary and a rename); a relaunch resumes from the newest.
"""
import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from pytest_reshard import probe

GLOBAL_BATCH = 16
GUARD_EXIT = 3


def checksum(net: torch.nn.Module) -> torch.Tensor:
    """Two numbers every replica must share: the parameters' sum, and their bits' sum."""
    total, bits = 0.0, 0
    for p in net.parameters():
        total += float(p.detach().double().sum())
        bits += int(p.detach().view(-1).view(torch.int32).long().sum())
    return torch.tensor([total, float(bits % 2**52)], dtype=torch.float64)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 12)))
    p.add_argument("--ckpt-every", type=int, default=3)
    p.add_argument("--guard", choices=("replicas", "nan", "off"), default="replicas")
    args = p.parse_args()

    run = probe.attach(max_rewind_steps=args.ckpt_every)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = (run.workdir or Path(".")) / "sdc-train"
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    data = torch.randn(GLOBAL_BATCH * args.steps, 8, generator=torch.Generator().manual_seed(1))
    targets = data.sum(dim=1, keepdim=True)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    model = DDP(net)
    run.expose(model=net, optimizer=opt)

    saved = sorted(out.glob("ckpt-*.pt"), key=lambda f: int(f.stem[5:]))
    start = 0
    if saved:
        state = torch.load(saved[-1], weights_only=True)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["steps"]
        run.checkpoint_loaded(start - 1, state={"model": net, "optimizer": opt})
    run.resumed(step=start, source="checkpoint" if start else "fresh")

    per_rank = GLOBAL_BATCH // world
    for step in range(start, args.steps):
        with run.step(step) as s:
            ids = list(range(step * GLOBAL_BATCH + rank * per_rank,
                             step * GLOBAL_BATCH + (rank + 1) * per_rank))
            s.record(samples=ids)
            s.point("forward")
            loss = torch.nn.functional.mse_loss(model(data[ids]), targets[ids])
            s.point("backward")
            opt.zero_grad()
            loss.backward()
            s.point("optimizer")
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            s.record(loss=mean.item() / world)
        caught = None
        if args.guard == "replicas":
            mine = checksum(net)
            low, high = mine.clone(), mine.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if not torch.equal(low, high):
                caught = "the replicas' parameters differ"
        elif args.guard == "nan" and not torch.isfinite(mean):
            caught = "the loss is not finite"
        if caught:
            run.detected("sdc", step, caught)
            print(f"step {step}: {caught}; stopping before the next save", flush=True)
            sys.exit(GUARD_EXIT)
        if (step + 1) % args.ckpt_every == 0 and rank == 0:
            tmp = out / f".ckpt-{step + 1}.tmp"
            torch.save({"model": net.state_dict(), "optim": opt.state_dict(), "steps": step + 1}, tmp)
            os.replace(tmp, out / f"ckpt-{step + 1}.pt")
            run.checkpoint_saved(step, state={"model": net, "optimizer": opt})
    run.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
