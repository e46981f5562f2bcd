"""A production DDP job in record mode: run by its launcher (torchrun, SLURM), not by the harness.

Two ranks over gloo, a checkpoint every ``--ckpt-every`` steps into ``--workdir``. With
``--crash-at N`` rank 1 kills itself (SIGKILL) when it begins step N in the job's first
launch (no restart counted by torchrun nor a requeue by SLURM, and SLURM's first ``srun`` step of
the job), as a real crash would; the launcher (or the batch script's ``srun`` retry loop) starts
the job again and it resumes from the checkpoint.
``--ignore-checkpoint`` is the planted bug: the restarted job loads the checkpoint's weights
but starts again from step 0.

The probe is attached as in production: it records only because ``RESHARD_RECORD`` is set.
"""
import argparse
import os
import signal
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from pytest_reshard import probe

GLOBAL_BATCH = 8


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--ckpt-every", type=int, default=3)
    p.add_argument("--workdir", required=True)
    p.add_argument("--crash-at", type=int, default=None)
    p.add_argument("--ignore-checkpoint", action="store_true")
    args = p.parse_args()

    run = probe.attach(max_rewind_steps=args.ckpt_every)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    first_launch = all(int(os.environ.get(name, "0")) == 0 for name in
                       ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT", "SLURM_STEP_ID"))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = workdir / "ckpt.pt"

    torch.manual_seed(0)
    inputs = torch.randn(GLOBAL_BATCH * args.steps, 4, generator=torch.Generator().manual_seed(1))
    targets = inputs.sum(dim=1, keepdim=True)
    net = torch.nn.Linear(4, 1)
    state = torch.load(ckpt, weights_only=False) if ckpt.exists() else None
    if state is not None:
        net.load_state_dict(state["model"])
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if state is not None:
        opt.load_state_dict(state["opt"])
        run.checkpoint_loaded(state["step"], {"step": probe.digest(state["step"])})
        start = 0 if args.ignore_checkpoint else state["step"] + 1
    run.resumed(step=start, source="checkpoint" if state is not None else "fresh")

    per_rank = GLOBAL_BATCH // world
    for step in range(start, args.steps):
        with run.step(step) as s:
            if rank == 1 and first_launch and step == args.crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
            lo = step * GLOBAL_BATCH + rank * per_rank
            ids = list(range(lo, lo + per_rank))
            s.record(samples=ids)
            loss = torch.nn.functional.mse_loss(model(inputs[ids]), targets[ids])
            opt.zero_grad()
            loss.backward()
            opt.step()
            s.record(loss=loss.item())
        if (step + 1) % args.ckpt_every == 0:
            if rank == 0:
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, ckpt)
                run.checkpoint_saved(step, {"step": probe.digest(step)})
            dist.barrier()
    run.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
