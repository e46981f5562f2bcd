"""torchft as a workload: G replica groups trained by torchft's Manager, its DDP and its optimizer
wrapper, on CPU with gloo, recorded with the probe (docs/torchft-notes.md).

The launcher (our harness, or the small one under ``__main__``) starts ALL ranks as one world
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, with a TCPStore already listening at
``MASTER_ADDR:MASTER_PORT``, as the harness and torchrun's agent host it). The script splits it:

- ``--groups G``: ``per = WORLD_SIZE // G``; replica group ``g = RANK // per``, group rank
  ``RANK % per``. torchft's cross-group process group joins the ranks of equal group rank, one per
  replica group; with ``per > 1`` a plain gloo group inside each replica group averages the
  gradients over its ranks as well (data parallel inside the group).
- Each replica group has its own TCPStore (torchft's ``Manager`` keeps unprefixed keys there, so
  groups cannot share one): its group rank 0 hosts it on a free port and publishes the address in
  the world store under ``torchft/g{g}/store/{incarnation}``; the others read it there.
- The Lighthouse is ``--lighthouse`` or ``TORCHFT_LIGHTHOUSE``; with neither, rank 0 (group 0's
  rank 0) starts one in its own process on a free port and publishes it the same way. That is enough
  while every fault ends the whole world (the harness today), but the Lighthouse then dies with
  group 0: a launcher that restarts only the failed group must host it (``__main__`` does).
- ``incarnation`` is ``RESHARD_GENERATION`` (the harness), else ``TORCHFT_INCARNATION``: a group
  restarted alone must be given a new one so its ranks do not read a dead store's address, and
  ``TORCHFT_REJOIN=1`` so it does not wait at the start barrier for the whole world.

Each attempt at a step: ``optimizer.zero_grad()`` (torchft starts the quorum there; with the
default ``--quorum sync`` it waits for it and applies a heal before returning), then
``run.begin_step(manager.current_step())``, forward, backward (the DDP hook all-reduces across the
quorum), ``optimizer.step()`` (torchft's ``should_commit`` vote, then the real step only if it
voted yes). A step the quorum did not commit ends with ``run.end_step(error=...)``; the next attempt
runs the same step number again. A heal (torchft copies the state from a live peer: its
``load_state_dict`` callback runs) is recorded as ``run.checkpoint_loaded(step - 1, state=...)``;
the donor's ``state_dict`` callback, which torchft calls when a peer recovers from it, records
``run.checkpoint_saved``. Every ``--ckpt-every`` committed steps each rank also writes its own file
(model, optimizer, torchft's manager state), for launchers that restart the whole world.

The model: ``--model mlp`` (default) a small MLP on a regression; ``--model gpt`` the bundled LM's
tiny GPT (``pytest_reshard.fixtures.lm``: its model, its token data, its loss and AdamW settings,
without its FSDP2 sharding or LR schedule), to compare torchft's recovery with the LM's own on the
same model (``bench/recovery.py``).

Samples: ``--data step`` (default) derives each rank's sample ids from the committed step
(``step * G * per * B + (g * per + group_rank) * B + i``): a step retried draws the same ids again, a
group that heals resumes at the donor's position. ``--data sampler`` walks torchft's own
``DistributedSampler`` from the start, as torchft's train_ddp.py does without a dataloader
checkpoint: what torchft's data loading loses or replays.

Outside any harness the probe is a no-op; ``--log-dir`` then writes one JSON line per event and
rank (attempts, commits, losses, sample ids, state digests, heals) for a harness-free study.
Standalone: ``python tests/workloads/torchft_train.py --world-size 2 --groups 2 --steps 20``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

from pytest_reshard import probe


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--groups", type=int, default=int(os.environ.get("NUM_REPLICA_GROUPS", 1)))
    p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 20)))
    p.add_argument("--lighthouse", default=os.environ.get("TORCHFT_LIGHTHOUSE"))
    p.add_argument("--batch", type=int, default=4, help="samples per rank and step")
    p.add_argument("--hidden", type=int, default=32, help="--model mlp: its hidden width")
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp",
                   help="mlp: a 16-in, 1-out MLP on a sum-regression (MSE); gpt: the bundled LM's "
                        "tiny GPT on its synthetic token sequences (next-token cross-entropy), to "
                        "compare torchft's recovery with the LM's on the same model")
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--quorum", choices=["sync", "async"], default="sync",
                   help="torchft's use_async_quorum: async overlaps the quorum with the forward and "
                        "applies a heal only at should_commit (the healer's batch of that step "
                        "is then discarded)")
    p.add_argument("--data", choices=["step", "sampler"], default="step")
    p.add_argument("--transport", choices=["http", "pg"], default="http",
                   help="how a healing group receives the state: torchft's HTTPTransport "
                        "(default) or PGTransport over the cross-group gloo group")
    p.add_argument("--init-sync", action="store_true",
                   help="torchft's init_sync: copy group 0's weights to the others at step 0 "
                        "(not needed: every rank seeds its model identically)")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--timeout", type=float, default=10.0, help="collectives and heal, seconds")
    p.add_argument("--quorum-timeout", type=float, default=60.0)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=5000,
                   help="a Lighthouse started here: when a silent replica group counts as dead")
    p.add_argument("--join-timeout-ms", type=int, default=10000,
                   help="a Lighthouse started here: how long to wait for heartbeating stragglers")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    p.add_argument("--log-dir", default=os.environ.get("TORCHFT_LOG_DIR"),
                   help="write events as JSON lines here (one file per rank and incarnation)")
    p.add_argument("--torchft-hook", action="store_true",
                   help="torchft 0.2.0's own DDP comm hook, which kills a surviving group when a "
                        "peer group dies mid all-reduce (see _ddp_class)")
    p.add_argument("--on-shrink", choices=["auto", "exit", "continue"], default="auto",
                   help="when the quorum lost a replica group: exit (auto: under our harness, "
                        "which relaunches the whole world, unless TORCHFT_MEMBERSHIP=1) or train "
                        "on with the groups left (torchft's behaviour; auto elsewhere)")
    p.add_argument("--bug-skip-heal", action="store_true",
                   help="bug: a healing group ignores the state torchft received for it")
    p.add_argument("--world-size", type=int, default=2, help="__main__'s launcher only")
    return p.parse_args(argv)


class Log:
    """The harness-free record: JSON lines, one os.write each (a SIGKILL tears at most one)."""

    def __init__(self, folder: str | None, name: str) -> None:
        self.fd = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.fd = os.open(Path(folder) / f"{name}.jsonl",
                              os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, ev: str, **fields) -> None:
        if self.fd is not None:
            os.write(self.fd, (json.dumps({"ev": ev, "t": time.time(), **fields}) + "\n").encode())


def _heartbeats_seen(lighthouse: str, replica_ids: list[str]) -> bool:
    """Whether the Lighthouse's status page lists a heartbeat of every one of ``replica_ids``."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{lighthouse}/status", timeout=5) as reply:
            page = reply.read().decode()
    except OSError:
        return False
    return all(f"{i}: seen" in page for i in replica_ids)


def _ddp_class():
    """torchft's DDP with the comm hook of its later releases (the nightly of 2026-10-26).

    torchft 0.2.0's hook asserts on the inner future after ``work.wait()`` failed, and that
    inner future does not exist when the cross-group all-reduce raised (a peer group was
    SIGKILLed: gloo's "Connection closed by peer"): ``AssertionError`` in ``backward()``, so a
    surviving group dies of its peer's death instead of skipping the step. This is the fix the
    nightly ships: give DDP the bucket back; should_commit then votes no and the step is retried.
    ``--torchft-hook`` keeps 0.2.0's hook (to see the bug)."""
    import torch.futures
    from torchft import DistributedDataParallel
    from torchft.manager import _ManagedFuture

    class FixedHookDDP(DistributedDataParallel):
        @staticmethod
        def _comm_hook(state, bucket):
            work = state.allreduce(bucket.buffer())
            if not work.wait():
                done = torch.futures.Future()
                done.set_result(bucket.buffer())
                return done
            fut = work.get_future()
            if not isinstance(fut, _ManagedFuture):
                return fut
            assert fut._fut is not None
            return fut._fut

    return FixedHookDDP


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world % args.groups:
        raise SystemExit(f"--groups {args.groups} does not divide WORLD_SIZE={world}")
    per = world // args.groups
    group, group_rank = rank // per, rank % per
    # One role for every group: a sample two groups trained is a duplicate (each attempt
    # records its replica_group for the membership checks).
    run = probe.attach(max_rewind_steps=args.ckpt_every)
    run.stop_requested()  # SIGTERM sets a flag from here on

    # Imported after attach: torchft's import takes seconds on 2 cores, and a rank that dies in
    # it should be said to have died after attaching.
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport
    from torchft.data import DistributedSampler

    # a launcher that restarts one group gives it a new TORCHFT_INCARNATION (the harness's
    # membership mode: "gen.n"); else each generation of the harness is one
    incarnation = os.environ.get("TORCHFT_INCARNATION") or os.environ.get("RESHARD_GENERATION", "0")
    log = Log(args.log_dir, f"g{group}-r{group_rank}-i{incarnation}")
    log("start", pid=os.getpid(), rank=rank, group=group, group_rank=group_rank,
        incarnation=incarnation)
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    wstore = TCPStore(host, int(os.environ["MASTER_PORT"]), is_master=False,
                      wait_for_workers=False, timeout=timedelta(seconds=60))

    lighthouse_server = None
    lighthouse = args.lighthouse
    if not lighthouse:
        key = f"torchft/lighthouse/{incarnation}"
        if rank == 0:
            from torchft._torchft import LighthouseServer
            lighthouse_server = LighthouseServer(
                bind="[::]:0", min_replicas=args.min_replicas,
                join_timeout_ms=args.join_timeout_ms,
                heartbeat_timeout_ms=args.heartbeat_timeout_ms)
            wstore.set(key, lighthouse_server.address())
        lighthouse = wstore.get(key).decode()

    key = f"torchft/g{group}/store/{incarnation}"
    if group_rank == 0:
        gstore = TCPStore(host, 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
        wstore.set(key, f"{host}:{gstore.port}")
    gaddr, gport = wstore.get(key).decode().rsplit(":", 1)
    if group_rank != 0:
        gstore = TCPStore(gaddr, int(gport), is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    if per > 1:  # data parallel inside the replica group: a plain gloo group of its ranks
        dist.init_process_group("gloo", store=PrefixStore("intra/", gstore), rank=group_rank,
                                world_size=per, timeout=timedelta(seconds=args.timeout))

    torch.manual_seed(1234)  # the same initial weights everywhere (so init_sync is not needed)
    n_samples = args.steps * world * args.batch
    if args.model == "gpt":
        from pytest_reshard.fixtures import lm

        size = lm.SIZES["tiny"]
        net = lm.GPT(size)
        inner_opt = torch.optim.AdamW(net.parameters(), lr=lm.LMConfig.lr, betas=(0.9, 0.95),
                                      weight_decay=lm.LMConfig.weight_decay)

        def loss_of(ids: list[int]) -> torch.Tensor:
            tokens = torch.tensor([lm.sample_tokens(0, i, size.seq_len + 1, size.vocab)
                                   for i in ids])
            logits = model(tokens[:, :-1])
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     tokens[:, 1:].reshape(-1))
    else:
        net = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(),
                                  torch.nn.Linear(args.hidden, 1))
        inner_opt = torch.optim.AdamW(net.parameters(), lr=0.01)
        data_gen = torch.Generator().manual_seed(4321)
        inputs = torch.randn(n_samples, 16, generator=data_gen)
        targets = inputs.sum(dim=1, keepdim=True)

        def loss_of(ids: list[int]) -> torch.Tensor:
            return torch.nn.functional.mse_loss(model(inputs[ids]), targets[ids])

    holder: dict = {}  # the Manager, once built (the callbacks need its step); "before": the
    # step this rank held when it asked for the quorum (a heal's fault point is at that step)
    healed: list = []

    def state() -> dict:
        return {"model": net, "optimizer": inner_opt,
                "step": holder["manager"].current_step() if "manager" in holder else 0}

    def digest_now() -> dict:
        s = state()
        return {"model": probe.digest(net.state_dict()),
                "optimizer": probe.digest(inner_opt.state_dict()), "step": probe.digest(s["step"])}

    def torchft_state_dict() -> dict:
        # torchft calls this when a peer must recover from us (the donor side of a heal); with
        # --quorum sync it runs while our main thread waits for the quorum, so nothing moves.
        step = holder["manager"].current_step()
        d = digest_now()
        log("donate", step=step, digest=d)
        run.checkpoint_saved(step - 1, d, source="torchft-heal-donor")
        return {"model": net.state_dict(), "optim": inner_opt.state_dict()}

    def torchft_load_state_dict(sd: dict) -> None:
        # torchft applies a heal here: in start_quorum (--quorum sync), or in should_commit
        # (async, mid-step: the digest is then one taken after the step began). The fault point
        # "heal" is at the step the rank held before the heal (0 for a group restarted without a
        # checkpoint): the state has arrived, none of it is applied yet.
        run.point("heal", step=holder.get("before", 0))
        if not args.bug_skip_heal:
            net.load_state_dict(sd["model"])
            inner_opt.load_state_dict(sd["optim"])
        healed.append((holder["manager"].current_step(), digest_now()))

    if args.transport == "pg":
        pg = ProcessGroupGloo(timeout=timedelta(seconds=args.timeout))
        transport = PGTransport(pg, timeout=timedelta(seconds=args.timeout),
                                device=torch.device("cpu"))
    else:
        pg, transport = ProcessGroupGloo(timeout=timedelta(seconds=args.timeout)), None
    manager = Manager(
        pg=pg, min_replica_size=args.min_replicas,
        load_state_dict=torchft_load_state_dict, state_dict=torchft_state_dict,
        use_async_quorum=args.quorum == "async", replica_id=f"torchft_train_{group}",
        timeout=timedelta(seconds=args.timeout),
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
        connect_timeout=timedelta(seconds=args.timeout),
        rank=group_rank, world_size=per, store_addr=gaddr, store_port=int(gport),
        lighthouse_addr=lighthouse, hostname="localhost",
        checkpoint_transport=transport, init_sync=args.init_sync)
    holder["manager"] = manager
    # Every replica group's manager is heartbeating to the Lighthouse from here on. Without this
    # barrier the first group to get here forms a quorum of one alone (the others still import
    # torchft) and trains steps the others then heal into. A group restarted alone
    # (TORCHFT_REJOIN=1) joins the running quorum instead.
    if os.environ.get("TORCHFT_REJOIN") != "1":
        ready = f"torchft/ready/{incarnation}"
        wstore.add(ready, 1)
        while wstore.add(ready, 0) < world:
            time.sleep(0.01)
        # ...and their first heartbeats (every 100 ms) must have reached the Lighthouse: one that
        # has not is not waited for, and a quorum of one can still form at step 0 (seen once
        # in ~10 runs under the harness on 2 loaded cores before this wait). The Lighthouse
        # says so itself: its status page names a manager (its replica id, a fresh uuid each
        # incarnation) once a heartbeat of it arrived (0.002-0.008 s after the barrier at load
        # 4.5; the 0.5 s sleep this replaces was a guess).
        if group_rank == 0:
            wstore.set(f"torchft/replica/{incarnation}/{group}", gstore.get("replica_id"))
        ids = [wstore.get(f"torchft/replica/{incarnation}/{g}").decode()
               for g in range(args.groups)]
        waited = time.monotonic()
        while not _heartbeats_seen(lighthouse, ids):
            if time.monotonic() - waited > args.quorum_timeout:
                raise SystemExit(f"torchft: the Lighthouse saw no heartbeat of {ids} within "
                                 f"{args.quorum_timeout:.0f} s")
            time.sleep(0.01)
        log("heartbeats_seen", waited_s=time.monotonic() - waited)
    model = (DistributedDataParallel if args.torchft_hook else _ddp_class())(manager, net)
    optimizer = Optimizer(manager, inner_opt)

    workdir = run.workdir or (Path(args.log_dir) if args.log_dir else None)
    ckpt = workdir / f"torchft-ckpt-g{group}-r{group_rank}.pt" if workdir else None
    if ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        net.load_state_dict(saved["model"])
        inner_opt.load_state_dict(saved["optim"])
        manager.load_state_dict(saved["manager"])
        run.checkpoint_loaded(manager.current_step() - 1, digest_now(), source="disk")
        log("disk_load", step=manager.current_step(), digest=digest_now())
    start = manager.current_step()
    run.resumed(step=start, source="checkpoint" if start else "fresh")

    shrink_exits = {"exit": True, "continue": False}.get(
        args.on_shrink, run.active and os.environ.get("TORCHFT_REJOIN") is None
        and os.environ.get("TORCHFT_MEMBERSHIP") != "1")
    sampler_iter = None
    if args.data == "sampler":
        sampler = DistributedSampler(range(n_samples), replica_rank=group,
                                     num_replica_groups=args.groups, group_rank=group_rank,
                                     num_replicas=per, shuffle=False)
        sampler_iter = iter(sampler)

    def draw(step: int) -> list[int]:
        if sampler_iter is not None:
            return [next(sampler_iter) for _ in range(args.batch)]
        lo = step * world * args.batch + (group * per + group_rank) * args.batch
        return list(range(lo, lo + args.batch))

    while manager.current_step() < args.steps:
        t0 = time.time()
        holder["before"] = manager.current_step()
        optimizer.zero_grad()  # torchft: start the quorum (sync: wait for it, heal if behind)
        if args.quorum == "async":
            # the step number is the quorum's (a healer jumps to the donor's): wait for it; the
            # heal itself is still applied only in should_commit, as torchft's async mode does
            manager.wait_quorum()
        step = manager.current_step()
        if run.stop_requested() or run.reshard_requested():
            break
        if shrink_exits and manager.num_participants() < args.groups:
            # A launcher that relaunches the whole world on a death (our harness today) gives
            # the survivors failure_grace_s (5 s) to exit; torchft's survivor instead waits the
            # Lighthouse's heartbeat timeout (5 s) and trains on alone: a race whose loser
            # resumes, after the relaunch, from an older checkpoint than its peer, which ran the
            # remaining steps by itself. So under such a launcher the survivor ends here.
            raise SystemExit(f"torchft: the quorum has {manager.num_participants()} of "
                             f"{args.groups} replica groups; the launcher relaunches the world")
        for at, d in healed:
            log("healed", step=at, digest=d, quorum_s=time.time() - t0)
            run.checkpoint_loaded(at - 1, d, source="torchft-heal")
        healed.clear()
        if step >= args.steps:
            break
        s = run.begin_step(step)
        ids = draw(step)
        # the membership epoch: which quorum this group trains the step in, and how many groups
        s.record(samples=ids, quorum=manager._quorum_id, participants=manager.num_participants(),
                 replica_group=group)
        s.point("forward")
        loss = loss_of(ids)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        s.point("backward")
        loss.backward()  # torchft's DDP hook: manager.allreduce across the quorum's groups
        # A group still healing (--quorum async) trains the step with its gradient zeroed:
        # its batch counts as consumed but teaches nothing; say so for the sample check.
        s.record(participating=manager.is_participating())
        group_loss = loss.detach().clone()
        if per > 1:
            for p in net.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= per
            dist.all_reduce(group_loss)
            group_loss /= per
        s.point("optimizer")
        optimizer.step()  # torchft: should_commit, then the inner step only if committed
        committed = manager.current_step() == step + 1
        for at, d in healed:  # --quorum async: healed inside should_commit, mid-step
            log("healed", step=at, digest=d, quorum_s=time.time() - t0, mid_step=True)
            run.checkpoint_loaded(at - 1, d, source="torchft-heal (async, mid-step)")
        healed.clear()
        log("step", step=step, committed=committed, loss=group_loss.item(), samples=ids,
            participants=manager.num_participants(), quorum_id=manager._quorum_id,
            digest=digest_now()["model"], step_s=time.time() - t0)
        if not committed:
            run.end_step(error="not committed by the quorum")
            continue
        s.record(loss=group_loss.item())
        run.end_step()
        if ckpt is not None and (step + 1) % args.ckpt_every == 0:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": net.state_dict(), "optim": inner_opt.state_dict(),
                        "manager": manager.state_dict()}, tmp)
            os.replace(tmp, ckpt)
            run.checkpoint_saved(step, digest_now(), source="disk")
        if run.stop_requested() or run.reshard_requested():
            break

    log("exit", step=manager.current_step())
    run.close()
    manager.shutdown(wait=False)
    done = f"torchft/done/{incarnation}"
    wstore.add(done, 1)
    if lighthouse_server is not None:
        # The Lighthouse lives in this process: keep it up until every rank is through, or a
        # group still behind (one that resumed from an older checkpoint after a relaunch of the
        # world, while this one had already finished) loses its Lighthouse and hangs.
        while wstore.add(done, 0) < world:
            time.sleep(0.05)
        lighthouse_server.shutdown()


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Without a launcher: host the world store and a Lighthouse, start one process per rank."""
    import subprocess

    from torch.distributed import TCPStore
    from torchft._torchft import LighthouseServer

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=args.min_replicas,
                                  join_timeout_ms=args.join_timeout_ms,
                                  heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
           "WORLD_SIZE": str(args.world_size), "TORCHFT_LIGHTHOUSE": lighthouse.address(),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, *argv], env={**env, "RANK": str(r)})
             for r in range(args.world_size)]
    codes = [p.wait() for p in procs]
    lighthouse.shutdown()
    return max(codes, key=abs)


if __name__ == "__main__":
    if "RANK" in os.environ:
        main()
    else:
        raise SystemExit(launch(parse(), sys.argv[1:]))
