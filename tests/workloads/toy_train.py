"""A user's own training script: plain torch.distributed data parallelism plus the probe.

It stands for "your train.py" in the tests: no bundled helpers, only ``pytest_reshard.probe``.
Flags plant the bugs the checkers must catch.
"""
import argparse
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from pytest_reshard import probe

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 20)))
p.add_argument("--ckpt-every", type=int, default=5)
p.add_argument("--restart-from-zero", action="store_true", help="bug: ignore the checkpoint")
p.add_argument("--drop-optimizer-state", action="store_true", help="bug: do not restore AdamW")
p.add_argument("--ignore-sigterm-flag", action="store_true",
               help="never asks run.stop_requested(): SIGTERM keeps its default action")
p.add_argument("--own-sigterm-handler", action="store_true",
               help="installs its own SIGTERM handler before attaching (it must still be called)")
p.add_argument("--slow-teardown-s", type=float, default=0.0,
               help="after run.close(), take this long to end (an interpreter's exit under load)")
p.add_argument("--bug-reshard-after-kill", action="store_true",
               help="bug: a planned reshard within 3 steps of resuming after an unplanned failure "
                    "saves the checkpoint one step short, so the next generation replays a step")
args = p.parse_args()

if args.own_sigterm_handler:
    import signal

    def note_sigterm(signum, frame):
        Path(os.environ.get("RESHARD_DIR", "."), f"sigterm-seen-{os.environ.get('RANK', 0)}").touch()

    signal.signal(signal.SIGTERM, note_sigterm)
run = probe.attach(max_rewind_steps=args.ckpt_every)


def stop_requested():
    return False if args.ignore_sigterm_flag else run.stop_requested()


stop_requested()  # SIGTERM sets a flag from here on (a preemption's notice)
dist.init_process_group("gloo", timeout=timedelta(seconds=20))
rank, world = dist.get_rank(), dist.get_world_size()
workdir = run.workdir or Path("toy-work")
workdir.mkdir(parents=True, exist_ok=True)
ckpt = workdir / "ckpt.pt"

GLOBAL_BATCH = 12
torch.manual_seed(run.seed)
data_gen = torch.Generator().manual_seed(1234)
inputs = torch.randn(GLOBAL_BATCH * args.steps, 8, generator=data_gen)
targets = inputs.sum(dim=1, keepdim=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=0.05)


def state_digest(step):
    return {"model": probe.digest(model.state_dict()), "optimizer": probe.digest(opt.state_dict()),
            "step": probe.digest(step)}


start = 0
if ckpt.exists() and not args.restart_from_zero:
    state = torch.load(ckpt, weights_only=False)
    model.load_state_dict(state["model"])
    if not args.drop_optimizer_state:
        opt.load_state_dict(state["opt"])
    start = state["step"] + 1
    run.checkpoint_loaded(state["step"], state_digest(state["step"]))
run.resumed(step=start, source="checkpoint" if start else "fresh")
# Generation markers: rank 0 writes gen-<g>.clean after its last save of a generation that ends
# on purpose (finished, planned reshard, preemption). A generation > 0 whose predecessor left no
# such marker resumed after an unplanned failure (a kill, a crash, a hang).
gen = run.generation if run.active else 0
after_failure = gen > 0 and not (workdir / f"gen-{gen - 1}.clean").exists()


def save(step):
    if rank == 0:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, ckpt)
        run.checkpoint_saved(step, state_digest(step))
    dist.barrier()


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
        loss.backward()
        for p_ in model.parameters():
            dist.all_reduce(p_.grad)
            p_.grad /= world
        s.point("optimizer")
        opt.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        s.record(loss=global_loss.item() / world)
    stop = torch.tensor(float(bool(run.reshard_requested() or stop_requested())))
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item() or (step + 1) % args.ckpt_every == 0:
        buggy = (args.bug_reshard_after_kill and after_failure and run.reshard_requested() is not None
                 and step - start < 3)
        save(step - 1 if buggy else step)  # bug: labels the state one step short
    if stop.item():
        break

if rank == 0:
    (workdir / f"gen-{gen}.clean").touch()

run.close()
dist.destroy_process_group()
if args.slow_teardown_s:
    import time

    time.sleep(args.slow_teardown_s)
