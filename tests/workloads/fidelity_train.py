"""A user's training script whose loss depends on how it is trained: the loss_continuity tests.

Plain torch.distributed data parallelism plus the probe (like toy_train.py), with the training
choices that make the loss of a clean run depend on the world size, or make a resume at the same
size bit-exact only when every piece of state comes back:

- ``--lr-scaled``: the linear LR scaling rule, ``lr = base * world_size``.
- ``--dropout P``: dropout drawn from each rank's own RNG; the checkpoint keeps every rank's RNG
  state and a resume at the same size restores it (bit-exact). With ``--dropout-per-sample`` each
  sample's mask comes from its id instead, so the split between ranks no longer matters.
- ``--fp16``: a loss scaler as torch.amp.GradScaler runs it, simulated deterministically on CPU:
  each rank casts its scaled local gradient to float16 and the ranks all-reduce the float16 SUM
  (divided by the world size after unscaling), so float16 rounds every gradient, and whether a
  sum overflows depends on the world size. An overflow skips the update and halves the scale;
  ``--growth-interval`` good steps double it. The scale and its tracker are checkpointed.
- ``--per-device-batch B``: a fixed batch per rank, so the global batch is ``B * world_size``
  (the data position, in samples, is checkpointed).

Flags ``--bug-*`` plant the restore bugs loss_continuity must not pass.
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
p.add_argument("--ckpt-every", type=int, default=4)
p.add_argument("--lr", type=float, default=0.03, help="the base learning rate")
p.add_argument("--lr-scaled", action="store_true", help="lr = base * world_size")
p.add_argument("--dropout", type=float, default=0.0)
p.add_argument("--dropout-per-sample", action="store_true",
               help="draw each sample's dropout mask from its id, not from the rank's RNG: the "
                    "loss no longer depends on how samples are split between ranks")
p.add_argument("--fp16", action="store_true", help="simulated float16 gradients + loss scaler")
p.add_argument("--init-scale", type=float, default=32.0)
p.add_argument("--growth-interval", type=int, default=3)
p.add_argument("--per-device-batch", type=int, default=0, help="fixed batch per rank (0: a "
               "fixed global batch of 48)")
p.add_argument("--bug-skip-model-load", action="store_true",
               help="bug: the resume restores optimizer and step but never loads the model")
p.add_argument("--bug-no-rng-restore", action="store_true",
               help="bug: the resume does not restore the ranks' RNG states")
p.add_argument("--bug-drop-optimizer-state", action="store_true",
               help="bug: the resume does not restore AdamW's moments")
p.add_argument("--bug-adam-step", action="store_true",
               help="bug: the resume restores AdamW's moments but restarts its step count (a "
                    "state converter that copies exp_avg and exp_avg_sq only)")
args = p.parse_args()

run = probe.attach(max_rewind_steps=args.ckpt_every)
run.stop_requested()  # SIGTERM sets a flag from here on (a preemption's notice)
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
workdir = run.workdir or Path("fidelity-work")
workdir.mkdir(parents=True, exist_ok=True)
ckpt = workdir / "ckpt.pt"

GLOBAL_BATCH = 48
FEATURES = 8
per_rank = args.per_device_batch or GLOBAL_BATCH // world
global_batch = per_rank * world
torch.manual_seed(run.seed)
data_gen = torch.Generator().manual_seed(1234)
n_samples = max(GLOBAL_BATCH, 4 * (args.per_device_batch or 1)) * args.steps + 64
inputs = torch.randn(n_samples, FEATURES, generator=data_gen)
true_w = torch.linspace(-4.0, 4.0, FEATURES).reshape(FEATURES, 1)
targets = inputs @ true_w + torch.randn(n_samples, 1, generator=data_gen)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(FEATURES, 32)
        self.drop = torch.nn.Dropout(args.dropout)
        self.out = torch.nn.Linear(32, 1)
        self.skip = torch.nn.Linear(FEATURES, 1)

    def forward(self, x, ids):
        h = torch.relu(self.hidden(x))
        if args.dropout_per_sample and args.dropout > 0:
            keep = torch.stack([torch.rand(h.shape[1], generator=torch.Generator().manual_seed(
                1_000_003 * run.seed + i)) >= args.dropout for i in ids])
            h = h * keep / (1.0 - args.dropout)
        else:
            h = self.drop(h)
        return self.out(h) + self.skip(x)


torch.manual_seed(run.seed)           # the same initial weights on every rank and at every size
model = Net()
torch.manual_seed(run.seed + 1 + rank)  # each rank's own RNG stream (dropout)
lr = args.lr * (world if args.lr_scaled else 1)
opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
scaler = {"scale": args.init_scale, "good": 0}


def state_digest(step):
    return {"model": probe.digest(model.state_dict()), "step": probe.digest(step)}


start, position = 0, 0
if ckpt.exists():
    state = torch.load(ckpt, weights_only=False)
    if not args.bug_skip_model_load:
        model.load_state_dict(state["model"])
    if not args.bug_drop_optimizer_state:
        opt.load_state_dict(state["opt"])
        for group in opt.param_groups:
            group["lr"] = lr           # the rule at this world size
        if args.bug_adam_step:
            for st in opt.state.values():
                st["step"].zero_()
    if not args.bug_no_rng_restore and state["world_size"] == world:
        torch.set_rng_state(state["rng"][rank])
    scaler = dict(state["scaler"])
    start, position = state["step"] + 1, state["position"]
    run.checkpoint_loaded(state["step"], state_digest(state["step"]))
run.resumed(step=start, source="checkpoint" if start else "fresh")


def save(step):
    rngs = [torch.empty_like(torch.get_rng_state()) for _ in range(world)]
    dist.all_gather(rngs, torch.get_rng_state())
    if rank == 0:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "position": position, "scaler": dict(scaler), "rng": rngs,
                    "world_size": world}, tmp)
        run.point("checkpoint_commit", step=step)
        os.replace(tmp, ckpt)
        run.checkpoint_saved(step, state_digest(step))
    dist.barrier()


def reduce_gradients():
    """Average the gradients over the ranks; with --fp16, as a float16 loss-scaled sum. Returns
    False when the update must be skipped (the scaled sum overflowed)."""
    grads = [p_.grad for p_ in model.parameters()]
    if not args.fp16:
        for g in grads:
            dist.all_reduce(g)
            g /= world
        return True
    halves = [(g * scaler["scale"]).half() for g in grads]
    for h in halves:
        dist.all_reduce(h)
    finite = all(bool(torch.isfinite(h).all()) for h in halves)
    if not finite:
        scaler["scale"] /= 2.0
        scaler["good"] = 0
        return False
    for g, h in zip(grads, halves):
        g.copy_(h.float() / (scaler["scale"] * world))
    scaler["good"] += 1
    if scaler["good"] == args.growth_interval:
        scaler["scale"] *= 2.0
        scaler["good"] = 0
    return True


for step in range(start, args.steps):
    with run.step(step) as s:
        lo = position + rank * per_rank
        ids = list(range(lo, lo + per_rank))
        s.record(samples=ids)
        s.point("forward")
        loss = torch.nn.functional.mse_loss(model(inputs[ids], ids), targets[ids])
        s.point("backward")
        opt.zero_grad()
        loss.backward()
        s.point("optimizer")
        if reduce_gradients():
            opt.step()
        position += global_batch
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        s.record(loss=global_loss.item() / world)
    stop = torch.tensor(float(bool(run.reshard_requested() or run.stop_requested())))
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item() or (step + 1) % args.ckpt_every == 0:
        run.point("checkpoint", step=step)
        save(step)
    if stop.item():
        break

run.close()
dist.destroy_process_group()
