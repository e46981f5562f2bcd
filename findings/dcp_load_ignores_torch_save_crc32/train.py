"""A user's loop on DDP with AdamW, saved with DCP (``get_state_dict`` and ``dcp.save``) every 3
steps into ``step-N/``, resumed from the newest ``step-N/`` that has its ``.metadata``.

The bug (pytorch/pytorch#126952, open): every tensor in a ``.distcp`` file is a ``torch.save``
archive that carries a CRC-32, but torch's zip reader is built with its CRC checks off, and DCP
checks nothing else, so a byte flipped on disk after the save (a bad disk, a bad copy) is loaded
without a word: the job trains on from a state nobody saved. ``--fixed``: what users do about it,
a digest of the state written beside the checkpoint (``digest.json``, rank 0, after the save) and
checked after the load; a checkpoint whose load does not match it (or that has none) is passed
over for the one before it."""
import argparse
import hashlib
import json
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

# A checkpoint passed over costs one more interval (--fixed falls back past a corrupted one).
run = probe.attach(max_rewind_steps=2 * args.every)
run.stop_requested()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
GLOBAL, DIM = 8, 64
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.Tanh(), torch.nn.Linear(DIM, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
root = Path(run.workdir or "ckpt")
initial = {k: v.clone() for k, v in model.state_dict().items()}


def digests() -> dict[str, str]:
    o = opt.state_dict()
    return {"model": probe.digest(model.state_dict()),
            "optimizer": probe.digest([o["state"], [g["lr"] for g in o["param_groups"]]])}


def checkpoint() -> dict:
    m, o = get_state_dict(model, opt)
    return {"model": m, "optim": o}


def fingerprint(obj, path: str = "") -> dict[str, str]:
    """The user's digest of a state dict: sha256 of every tensor's bytes, repr of the rest."""
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in fingerprint(value, f"{path}/{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, value in enumerate(obj) for k, v in fingerprint(value, f"{path}/{i}").items()}
    if isinstance(obj, torch.Tensor):
        data = obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        return {path: hashlib.sha256(data).hexdigest()}
    return {path: repr(obj)}


def verified(folder: Path) -> bool:
    """--fixed: what was loaded matches the digest saved beside it, on every rank."""
    expected = folder / "digest.json"
    ok = expected.exists() and json.loads(expected.read_text()) == fingerprint(checkpoint())
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


start = 0
saved = sorted((int(d.name[5:]) for d in root.glob("step-*") if (d / ".metadata").exists()),
               reverse=True)
for last in saved:   # the newest first
    state = checkpoint()
    dcp.load(state, checkpoint_id=root / f"step-{last}")
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if args.fixed and not verified(root / f"step-{last}"):
        run.note("checkpoint_rejected", step=last, reason="does not match its digest.json")
        continue
    run.checkpoint_loaded(last, digests())
    start = last + 1
    break
else:
    if saved:   # every checkpoint was rejected: start over
        model.load_state_dict(initial)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
run.resumed(step=start)


def sample(i: int) -> torch.Tensor:
    return torch.randn(DIM, generator=torch.Generator().manual_seed(i))


for step in range(start, args.steps):
    with run.step(step) as s:
        ids = [step * GLOBAL + rank * (GLOBAL // world) + i for i in range(GLOBAL // world)]
        s.record(samples=ids)
        x = torch.stack([sample(i) for i in ids])
        s.point("forward")
        loss = ((model(x).squeeze(1) - x[:, :8].sum(1)) ** 2).mean()
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
        folder = root / f"step-{step}"
        state = checkpoint()
        expected = fingerprint(state)   # the state this checkpoint is for, in memory
        dcp.save(state, checkpoint_id=folder)
        if args.fixed and rank == 0:
            (folder / "digest.json.tmp").write_text(json.dumps(expected))
            os.replace(folder / "digest.json.tmp", folder / "digest.json")
        dist.barrier()
        run.checkpoint_saved(step, digests())
    if stop:
        break
run.close()
dist.destroy_process_group()
