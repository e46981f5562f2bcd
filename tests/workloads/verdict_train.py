"""A user's data-parallel training script for the verdict-fidelity tests (tests/scenarios/test_verdict_fidelity.py).

Plain torch.distributed (gloo) plus the probe, as a user writes it, with what trips checkers
that only look at simple scripts:

- a small dataset (``--dataset`` samples) read in epochs, shuffled per epoch from a seed the
  "framework" draws from its RNG when it builds the epoch's iterator (before the epoch's first
  step), and sample ids that repeat every epoch; ``--record-epoch`` passes ``epoch=`` to
  ``s.record``, without it the repeats are left for the checker to tell from duplicates;
- that RNG (replicated: every rank draws the same noise) and, with ``--per-rank-rng``, a
  per-rank RNG stream saved in one file per rank (``rng-{rank}.pt``, declared ``per_rank``);
- ``--per-rank-cursor``: each rank's own count of the samples it consumed, saved in one file per
  rank (``cursor-{rank}.pt``, declared ``per_rank``) and restored from its own file: at a shrink
  the leaving ranks' cursors are loaded by nobody;
- ``--ema``: an exponential moving average of the weights, saved with the checkpoint;
- checkpoints saved *inside* the step (``s.point("checkpoint")`` before writing,
  ``"checkpoint_commit"`` before the commit), so ``kill_during_save`` lands in them; a
  checkpoint is a folder ``step-N`` committed by rank 0 writing ``COMMITTED`` into it, and the
  resume takes the newest committed one.

The load digest is recorded right after the restore, before the epoch iterator is built.
Flags ``--bug-*`` plant the bugs; ``--digest-late`` and ``--no-epoch-kw`` are correct scripts the
checkers must not fail.
"""
import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 12)))
p.add_argument("--ckpt-every", type=int, default=3)
p.add_argument("--dataset", type=int, default=48, help="samples per epoch (a multiple of 12)")
p.add_argument("--record-epoch", action="store_true", help="pass epoch= to s.record")
p.add_argument("--per-rank-rng", action="store_true", help="a per-rank RNG, one file per rank")
p.add_argument("--per-rank-cursor", action="store_true",
               help="a per-rank count of consumed samples, one file per rank")
p.add_argument("--ema", action="store_true", help="an EMA of the weights, in the checkpoint")
p.add_argument("--digest-late", action="store_true",
               help="take the load digest after the epoch iterator is built (as a framework's "
                    "on_step_begin callback would), not right after the restore")
p.add_argument("--bug-ema-not-restored", action="store_true", help="bug: the EMA is saved, "
               "never restored")
p.add_argument("--bug-rng-world1-name", action="store_true",
               help="bug: at world size 1 the per-rank RNG is looked for as rng.pt (the name a "
                    "single process saves), so a 2 -> 1 reshard does not restore it")
p.add_argument("--bug-load-uncommitted", action="store_true",
               help="bug: the resume takes the newest checkpoint folder, committed or not")
p.add_argument("--bug-stop-at-checkpoints", action="store_true",
               help="bug: asks run.stop_requested() only at its checkpoint steps, so it keeps "
                    "training after SIGTERM until the next one")
p.add_argument("--bug-exit-at", type=int, default=None,
               help="bug: rank --bug-rank calls os._exit(0) at this step (no fault scheduled)")
p.add_argument("--bug-rank", type=int, default=1)
p.add_argument("--bug-raise-at-import", action="store_true",
               help="bug: an exception before probe.attach() (an import that fails)")
p.add_argument("--hang-before-first-step", action="store_true",
               help="bug: attaches, then blocks before its first step")
args = p.parse_args()

if args.bug_raise_at_import:
    import a_module_that_is_not_installed  # noqa: F401  (raises ModuleNotFoundError)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from pytest_reshard import probe  # noqa: E402

run = probe.attach(max_rewind_steps=args.ckpt_every)
run.stop_requested()  # SIGTERM sets a flag from here on
if args.hang_before_first_step:
    time.sleep(3600)
dist.init_process_group("gloo", timeout=timedelta(seconds=20))
rank, world = dist.get_rank(), dist.get_world_size()
workdir = run.workdir or Path("verdict-work")
workdir.mkdir(parents=True, exist_ok=True)

GLOBAL_BATCH = 12
N = args.dataset
assert N % GLOBAL_BATCH == 0, "--dataset must be a multiple of the global batch (12)"
data_gen = torch.Generator().manual_seed(1234)
inputs = torch.randn(N, 8, generator=data_gen)
targets = inputs.sum(dim=1, keepdim=True)
torch.manual_seed(run.seed)
model = torch.nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
rng = torch.Generator().manual_seed(99)              # the "framework's" RNG: replicated
rank_rng = torch.Generator().manual_seed(1000 + rank)  # this rank's own stream
epoch_seed = None                                    # drawn from rng when an epoch's iterator is built
cursor = {"rank": rank, "consumed": 0}               # --per-rank-cursor: this rank's samples so far
PER_RANK = [n for n, on in (("rank_rng", args.per_rank_rng), ("cursor", args.per_rank_cursor)) if on]


def rng_state():
    return {"rng": rng.get_state(), "epoch_seed": epoch_seed}


def digests(step, *, with_ema=args.ema, with_rank_rng=args.per_rank_rng,
            with_cursor=args.per_rank_cursor):
    d = {"model": probe.digest(model.state_dict()), "optimizer": probe.digest(opt.state_dict()),
         "step": probe.digest(step), "data": probe.digest(step * GLOBAL_BATCH),
         "rng": probe.digest(rng_state())}
    if with_ema:
        d["ema"] = probe.digest(ema)
    if with_rank_rng:
        d["rank_rng"] = probe.digest(rank_rng.get_state())
    if with_cursor:
        d["cursor"] = probe.digest(cursor)
    return d


def newest_checkpoint():
    found = []
    for d in workdir.glob("step-*"):
        if args.bug_load_uncommitted or (d / "COMMITTED").exists():
            found.append((int(d.name.split("-")[1]), d))
    return max(found)[1] if found else None


start = 0
ckpt = newest_checkpoint()
if ckpt is not None:
    state = torch.load(ckpt / "state.pt", weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    rng.set_state(state["rng"])
    epoch_seed = state["epoch_seed"]
    restored_ema = False
    if args.ema and "ema" in state and not args.bug_ema_not_restored:
        ema = state["ema"]
        restored_ema = True
    restored_rank_rng = False
    if args.per_rank_rng:
        name = "rng.pt" if world == 1 and args.bug_rng_world1_name else f"rng-{rank}.pt"
        if (ckpt / name).exists():  # a rank the last generation did not have starts fresh
            rank_rng.set_state(torch.load(ckpt / name, weights_only=False))
            restored_rank_rng = True
    restored_cursor = False
    if args.per_rank_cursor and (ckpt / f"cursor-{rank}.pt").exists():
        cursor = torch.load(ckpt / f"cursor-{rank}.pt", weights_only=False)
        restored_cursor = True
    start = state["step"] + 1

    def record_load():  # only what was really restored
        run.checkpoint_loaded(state["step"], digests(state["step"], with_ema=restored_ema,
                                                     with_rank_rng=restored_rank_rng,
                                                     with_cursor=restored_cursor),
                              per_rank=PER_RANK)

    if not args.digest_late:
        record_load()  # right after the restore, before the epoch iterator is built
run.resumed(step=start, source="checkpoint" if start else "fresh")


def save(step, s):
    s.point("checkpoint")
    folder = workdir / f"step-{step:05d}"
    folder.mkdir(exist_ok=True)
    if rank == 0:
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                 "rng": rng.get_state(), "epoch_seed": epoch_seed}
        if args.ema:
            state["ema"] = ema
        torch.save(state, folder / "state.pt")
    if args.per_rank_rng:
        torch.save(rank_rng.get_state(), folder / f"rng-{rank}.pt")
    if args.per_rank_cursor:
        torch.save(cursor, folder / f"cursor-{rank}.pt")
    s.point("checkpoint_commit")  # every part written, not yet committed
    dist.barrier()
    if rank == 0:
        (folder / "COMMITTED").touch()
    dist.barrier()
    mine = digests(step) if rank == 0 else {
        k: v for k, v in digests(step).items() if k in PER_RANK}
    run.checkpoint_saved(step, mine, per_rank=PER_RANK)


per_rank = GLOBAL_BATCH // world
for step in range(start, args.steps):
    pos = step * GLOBAL_BATCH
    epoch, offset = divmod(pos, N)
    if offset == 0:  # the epoch's iterator: its shuffle seed comes from the framework's RNG
        epoch_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=rng))
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(epoch_seed))
    if step == start and ckpt is not None and args.digest_late:
        record_load()  # as an on_step_begin callback would: after the iterator was built
    with run.step(step) as s:
        ids = perm[offset + rank * per_rank: offset + (rank + 1) * per_rank].tolist()
        cursor["consumed"] += len(ids)
        if args.record_epoch:
            s.record(samples=ids, epoch=epoch)
        else:
            s.record(samples=ids)
        if args.bug_exit_at == step and rank == args.bug_rank:
            os._exit(0)  # BUG bug_exit_at: a silent death mid-run
        s.point("forward")
        noise = 0.01 * torch.randn(GLOBAL_BATCH, 8, generator=rng)[rank * per_rank:(rank + 1) * per_rank]
        torch.rand(1, generator=rank_rng)  # a per-rank draw (dropout's, say): it moves the stream
        loss = torch.nn.functional.mse_loss(model(inputs[ids] + noise), targets[ids])
        s.point("backward")
        opt.zero_grad()
        loss.backward()
        for p_ in model.parameters():
            dist.all_reduce(p_.grad)
            p_.grad /= world
        s.point("optimizer")
        opt.step()
        with torch.no_grad():
            for k, v in model.state_dict().items():
                ema[k].mul_(0.9).add_(0.1 * v)
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        s.record(loss=global_loss.item() / world)
        if args.bug_stop_at_checkpoints:
            asked = (step + 1) % args.ckpt_every == 0 and run.stop_requested()
        else:
            asked = run.stop_requested()
        stop = torch.tensor(float(bool(run.reshard_requested() or asked)))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() or (step + 1) % args.ckpt_every == 0:
            save(step, s)
    if stop.item():
        break

run.close()
dist.destroy_process_group()
