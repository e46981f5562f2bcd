"""A user's DDP training script: ``DistributedDataParallel`` over gloo plus the probe, ending the
ordinary way: ``run.close()``, ``dist.destroy_process_group()``, then ``main()`` returns and the
script falls off its end. No ``os._exit`` anywhere.

It stands for "your train.py" as most people write it, and the harness must see it exactly as
torchrun or a cold interpreter would (tests/scenarios/test_endings.py, bench/endings.py). When ``main()``
returns, its locals (the DDP model, whose reducer holds the last reference to the gloo process
group once ``destroy_process_group`` dropped the others) are freed in a live interpreter.
"""
import argparse
import functools
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from pytest_reshard import probe

GLOBAL_BATCH = 24


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 20)))
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--abort-after-close", action="store_true",
                   help="os.abort() right after run.close(): a teardown that dies of SIGABRT "
                        "once every step ended (as FSDP2 under torchrun sometimes does)")
    p.add_argument("--retry-comm-errors", action="store_true",
                   help="BUG: a failed all-reduce is retried forever, though its group is gone "
                        "(what a job that swallows a communicator abort does)")
    p.add_argument("--skip-comm-errors", action="store_true",
                   help="BUG: a failed collective is skipped and the step goes on with what the "
                        "rank has (what a job that swallows a communicator abort and trains on "
                        "alone does)")
    args = p.parse_args()

    run = probe.attach(max_rewind_steps=args.ckpt_every)
    run.stop_requested()  # SIGTERM sets a flag from here on
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))

    def collective(fn: Any, *a: Any) -> None:
        try:
            fn(*a)
        except (RuntimeError, ValueError) as e:
            if not args.skip_comm_errors:
                raise
            print(f"{getattr(fn, '__name__', 'a collective')} failed ({str(e)[:80]}); going on",
                  flush=True)

    rank, world = dist.get_rank(), dist.get_world_size()
    workdir = run.workdir or Path("ddp-work")
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = workdir / "ckpt.pt"

    torch.manual_seed(run.seed)
    data_gen = torch.Generator().manual_seed(1234)
    inputs = torch.randn(GLOBAL_BATCH * args.steps, 16, generator=data_gen)
    targets = inputs.sum(dim=1, keepdim=True)
    net = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(),
                              torch.nn.Linear(args.hidden, 1))
    state = torch.load(ckpt, weights_only=False) if ckpt.exists() else None
    if state is not None:
        net.load_state_dict(state["model"])
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    start = 0
    if state is not None:
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        run.checkpoint_loaded(state["step"], {"model": probe.digest(net.state_dict()),
                                              "step": probe.digest(state["step"])})
    run.resumed(step=start, source="checkpoint" if start else "fresh")

    def save(step: int) -> None:
        if rank == 0:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
            run.checkpoint_saved(step, {"model": probe.digest(net.state_dict()),
                                        "step": probe.digest(step)})
        collective(dist.barrier)

    per_rank = GLOBAL_BATCH // world
    for step in range(start, args.steps):
        with run.step(step) as s:
            lo = step * GLOBAL_BATCH + rank * per_rank
            ids = list(range(lo, lo + per_rank))
            s.record(samples=ids)
            s.point("forward")
            loss = torch.nn.functional.mse_loss(model(inputs[ids]), targets[ids])
            s.point("backward")
            opt.zero_grad()
            collective(loss.backward)  # DDP all-reduces the gradients in its hooks
            s.point("optimizer")
            opt.step()
            global_loss = loss.detach().clone()
            while True:
                try:
                    collective(dist.all_reduce, global_loss)
                    break
                except (RuntimeError, ValueError) as e:
                    if not args.retry_comm_errors:
                        raise
                    print(f"all_reduce failed ({str(e)[:80]}); retrying", flush=True)
                    time.sleep(0.5)
            s.record(loss=global_loss.item() / world)
        stop = torch.tensor(float(bool(run.reshard_requested() or run.stop_requested())))
        collective(functools.partial(dist.all_reduce, op=dist.ReduceOp.MAX), stop)
        if stop.item() or (step + 1) % args.ckpt_every == 0:
            save(step)
        if stop.item():
            break

    run.close()
    if args.abort_after_close:
        dist.barrier()  # every rank has closed: torchrun's agent may now stop the others
    collective(dist.destroy_process_group)
    if args.abort_after_close:
        # Stands for a teardown that aborts at interpreter exit, after the ranks closed.
        (workdir / f"aborted-g{run.generation}-r{rank}").touch()
        os.abort()


if __name__ == "__main__":
    main()
