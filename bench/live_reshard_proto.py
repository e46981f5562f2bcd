"""Live (in-memory) reshard of the bundled LM against save-exit-relaunch-load, harness-free.

    python bench/live_reshard_proto.py [--sizes 4,3,4] [--change-after 4,12] [--steps 20]
        [--joiner warm|cold] [--method fast|dcp] [--replicas 1] [--size tiny] [--no-gc-freeze]
        [--bug none|keep_old_shard_map] [--repeats 1] [--timeout 300]

Two runs of ``pytest_reshard.fixtures.lm`` (its ``Trainer``: model, AdamW, LR schedule, sampler,
RNG, its own training step) over the same world-size sequence, on loopback gloo:

- relaunch: every world is its own set of processes. At a change the ranks save (DCP), all exit,
  new processes start and load (DCP reshards on load): what the harness does today.
- live: the processes stay. At a shrink the leaving rank hands its shards over and exits; at a
  grow a new process joins with no state. The state moves in memory (``fixtures/lm_live.py``).

Then it compares the per-step losses, the state digests right after each change, and the final
full model + optimizer + schedule/data/RNG state (bit for bit, and the max abs difference), and
times each membership change: from the old world's last step (its slowest rank) to every new
rank ready to train. ``--joiner warm``: the joining process is started (and imports torch) while
the old world still trains, and waits; ``cold``: it is started when the old world stops.
``--bug keep_old_shard_map`` plants a live reshard that keeps the old shard layout; the
comparison must catch it. Exit status 0 when the comparison says what it should (equal without
a bug, different with one), 1 otherwise, 2 on an error.

Every process it starts has a deadline and ends with its parent; all are gone when it returns.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
MAX_PROCS = 4


# -- worker side -------------------------------------------------------------------------------
def _watchdog(deadline: float) -> None:
    """End this process if its parent is gone or the deadline passed (nothing may hang)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent or time.time() > deadline:
                why = "parent gone" if os.getppid() != parent else "deadline"
                print(f"worker {os.getpid()}: {why}, exiting", file=sys.stderr, flush=True)
                os._exit(86)
            time.sleep(0.2)

    threading.Thread(target=watch, name="watchdog", daemon=True).start()


def _recorder(rank: int, world: int) -> Any:
    """A probe Run outside the harness that keeps what the LM records (its exact losses)."""
    from pytest_reshard import probe

    run = probe.Run(env={"RANK": str(rank), "WORLD_SIZE": str(world)})
    run.events = []
    run.active = True  # recorded into a list, not a harness's run folder
    run._write = lambda data: run.events.append(json.loads(data))
    return run


def _losses(run: Any, seen: int) -> list[dict[str, Any]]:
    return [{"step": e["step"], "loss": e["loss"], "rank": e["rank"]}
            for e in run.events[seen:] if e.get("ev") == "record" and "loss" in e]


def worker(spec: dict[str, Any]) -> int:
    t_start = time.time()
    _watchdog(spec["deadline"])
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed import TCPStore
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from pytest_reshard.fixtures import _common as C
    from pytest_reshard.fixtures import lm, lm_live

    out: dict[str, Any] = {"mode": spec["mode"], "pid": os.getpid(), "role": spec["role"],
                           "join_change": spec.get("join_change"),
                           "t_proc_start": C.process_start_time(), "t_main": t_start,
                           "t_imported": time.time(), "losses": [], "steps": [], "changes": [],
                           "digests": {}}
    result = Path(spec["out"]) / f"{spec['mode']}-{spec['name']}.json"
    if spec["gc_freeze"]:
        # What imports made lives for the whole process: keep it out of every collection, so
        # that the live reshard's gc.collect() of the old world traverses only what came later
        # (0.15-0.7 s -> ~0.01 s here; --no-gc-freeze shows the difference).
        import gc

        gc.collect()
        gc.freeze()

    def dump() -> None:
        result.write_text(json.dumps(out))

    cfg = lm.LMConfig(**spec["cfg"])
    segments = spec["segments"]  # [[world, first_step, last_step], ...]

    def train(trainer: Any, run: Any, first: int, last: int) -> None:
        for step in range(first, last + 1):
            seen = len(run.events)
            t0 = time.time()
            if not trainer.train_step(step):
                raise RuntimeError(f"step {step} abandoned")
            out["steps"].append({"step": step, "world": trainer.world, "rank": trainer.rank,
                                 "t0": t0, "t1": time.time()})
            out["losses"] += _losses(run, seen)

    def digest(trainer: Any, key: str) -> None:
        d = C.full_state_digest(trainer.model, trainer.opt, trainer.state_step,
                                trainer.extra_state())
        if trainer.rank == 0:
            out["digests"][key] = d

    def final(trainer: Any) -> None:
        msd, osd = get_state_dict(trainer.model, trainer.opt,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if trainer.rank == 0:
            torch.save({"model": msd, "optim": osd, "step": trainer.state_step,
                        "extra": trainer.extra_state()},
                       Path(spec["out"]) / f"final-{spec['mode']}.pt")

    try:
        if spec["mode"] == "relaunch":
            g = spec["gen"]
            world, first, last = segments[g]
            run = _recorder(int(os.environ["RANK"]), world)
            t0 = time.time()
            trainer = lm.Trainer(cfg, run, lm.effective_replicas(cfg.replicas, world))
            out["t_init"] = time.time()
            start, source = trainer.resume()
            out["t_loaded"] = time.time()
            out.update(rank=trainer.rank, world=trainer.world, gen=g, source=source,
                       init_s=out["t_init"] - t0, load_s=out["t_loaded"] - out["t_init"])
            if start != first:
                raise RuntimeError(f"resumed at step {start}, expected {first}")
            if g > 0:
                digest(trainer, f"after_change_{g - 1}")
            train(trainer, run, first, last)
            out["t_stop"] = out["steps"][-1]["t1"]
            if g == len(segments) - 1:
                final(trainer)  # the LM saved the last step already (its end-of-run save)
            else:
                trainer.save(last)
                out["t_saved"] = time.time()
            dist.destroy_process_group()
            out["t_destroyed"] = time.time()
            out["done"] = True
            dump()
            return 0

        # live
        control = TCPStore(HOST, spec["control_port"], is_master=False,
                           timeout=timedelta(seconds=spec["timeout_s"]))

        def train_segment(trainer: Any, run: Any, g: int) -> None:
            """Segment ``g``; before its last step, wait for the warm spares of the grow that
            follows (a supervisor starts a grow once its spare is up; not counted as the
            change's cost, reported as spare_wait_s)."""
            _, first, last = segments[g]
            joiners = (segments[g + 1][0] - min(segments[g][0], segments[g + 1][0])
                       if g + 1 < len(segments) else 0)
            if joiners and spec["joiner_mode"] == "warm":
                train(trainer, run, first, last - 1)
                t0 = time.time()
                control.wait([f"c{g}/joiner_ready/{j}" for j in range(joiners)])
                out.setdefault("spare_wait_s", {})[str(g)] = time.time() - t0
                train(trainer, run, last, last)
            else:
                train(trainer, run, first, last)
        old_rank = spec.get("rank")
        trainer = None
        if old_rank is not None:
            world, first, last = segments[0]
            run = _recorder(old_rank, world)
            trainer = lm.Trainer(cfg, run, lm.effective_replicas(cfg.replicas, world))
            start, _ = trainer.resume()
            if start != 0:
                raise RuntimeError(f"a fresh live run resumed at step {start}")
            out["t_ready0"] = time.time()
            train_segment(trainer, run, 0)
            changes = range(len(segments) - 1)
        else:  # a joiner: wait until the old world stops, then join its change
            k = spec["join_change"]
            run = _recorder(0, segments[k + 1][0])
            if spec["joiner_mode"] == "warm":  # pay the first model construction now
                out["warm_up_s"] = lm.warm_up(cfg)
            out["t_waiting"] = time.time()
            control.set(f"c{k}/joiner_ready/{spec['joiner']}", repr(out["t_waiting"]))
            control.wait([f"c{k}/stopped"])
            out["t_go"] = time.time()
            changes = range(k, len(segments) - 1)
        for k in changes:
            old_world = segments[k][0]
            new_world = segments[k + 1][0]
            change = lm_live.Change(tag=f"c{k}", old_world=old_world,
                                    survivors=tuple(range(min(old_world, new_world))),
                                    new_world=new_world, master_addr=HOST,
                                    master_port=spec["ports"][k + 1], timeout_s=spec["timeout_s"])
            rec: dict[str, Any] = {"change": k, "old_rank": old_rank}
            if trainer is not None:
                rec["t_stop"] = out["steps"][-1]["t1"]
                if old_rank == 0:
                    control.set(f"c{k}/stopped", repr(rec["t_stop"]))
            new, phases = lm.reshard_trainer(trainer, cfg, run, change, old_rank=old_rank,
                                                  joiner=spec.get("joiner", 0),
                                                  method=spec["method"], bug=spec["bug"])
            trainer = None
            rec.update(phases=phases, t_ready=time.time())
            out["changes"].append(rec)
            if new is None:  # this rank left after handing its shards over
                out["left"] = out["done"] = True
                dump()
                # Nothing left to run: skip the interpreter's teardown (1 s and more for a torch
                # process here), so that the supervisor has the slot back at once.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
            trainer = new
            old_rank = trainer.rank
            rec["new_rank"] = trainer.rank
            digest(trainer, f"after_change_{k}")
            _, first, last = segments[k + 1]
            if trainer.state_step != first - 1:
                raise RuntimeError(f"restored step {trainer.state_step}, expected {first - 1}")
            train_segment(trainer, run, k + 1)
        final(trainer)
        dist.destroy_process_group()
        out["done"] = True
        dump()
        return 0
    except BaseException as e:
        out["error"] = f"{type(e).__name__}: {e}"
        dump()
        raise


# -- driver side -------------------------------------------------------------------------------
class Procs:
    """The processes this script started; ``kill_all`` ends each of them by its pid."""

    def __init__(self) -> None:
        self.all: list[tuple[subprocess.Popen, str, Path]] = []
        self.warned: set[int] = set()

    def start(self, spec: dict[str, Any], env: dict[str, str], log: Path) -> subprocess.Popen:
        alive = sum(p.poll() is None for p, _, _ in self.all)
        if alive >= MAX_PROCS:
            raise RuntimeError(f"{alive} workers alive; refusing to start another")
        spec_path = log.with_suffix(".spec.json")
        spec_path.write_text(json.dumps(spec))
        with open(log, "w") as f:
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                                  str(spec_path)], env=env, stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
        self.all.append((p, spec["name"], log))
        return p

    def wait(self, procs: list[subprocess.Popen], deadline: float) -> float:
        """Wait until every one of ``procs`` exited 0; the time the last one did. Fails as soon
        as any worker this script started (not only these) exits non-zero, or at the deadline."""
        last = time.time()
        pending = list(procs)
        while pending:
            self.check()
            for p in [p for p in pending if p.poll() is not None]:
                pending.remove(p)
                last = time.time()
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"workers {[p.pid for p in pending]} still running at the "
                                   "deadline")
            if pending:
                time.sleep(0.005)
        return last

    def check(self) -> None:
        """Raise if any worker exited non-zero, with the end of each such worker's log."""
        bad = [(p, name, log) for p, name, log in self.all
               if p.poll() not in (None, 0) and not self._finished(p, name, log)]
        if bad:
            raise RuntimeError("\n".join(f"worker {name} (pid {p.pid}) exited {p.returncode}; "
                                         f"its log ends:\n{_tail(log)}" for p, name, log in bad))

    def _finished(self, p: subprocess.Popen, name: str, log: Path) -> bool:
        """A worker that wrote its results and then died in the interpreter's teardown (FSDP2's
        "terminate called without an active exception", SIGABRT, which the harness's probe
        also forgives after a clean close): its work counts; the abort is reported."""
        if p.returncode is None or p.returncode >= 0:
            return False
        try:
            res = json.loads(log.with_name(log.name.replace(".log", ".json")).read_text())
        except (OSError, ValueError):
            return False
        if not res.get("done") or res.get("error"):
            return False
        if p.pid not in self.warned:
            self.warned.add(p.pid)
            print(f"note: worker {name} (pid {p.pid}) finished its work, then died with signal "
                  f"{-p.returncode} at exit: {_tail(log, 1)}", flush=True)
        return True

    def watch_key(self, store: Any, key: str, deadline: float) -> None:
        """Poll the control store for ``key`` (10 ms), failing fast if a worker died."""
        while not store.check([key]):
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {key!r} before the deadline")
            time.sleep(0.01)

    def kill_all(self) -> None:
        for p, _, _ in self.all:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p, _, _ in self.all:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print(f"warning: worker {p.pid} did not end after SIGKILL", file=sys.stderr)


def _tail(log: Path, n: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _store() -> Any:
    from datetime import timedelta

    from torch.distributed import TCPStore

    return TCPStore(HOST, 0, 1, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=60))


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RESHARD_", "PYTEST_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RESHARD_BACKEND="gloo",
               TORCHELASTIC_USE_AGENT_STORE="True", MASTER_ADDR=HOST, **extra)
    return env


def _results(out: Path, mode: str) -> list[dict[str, Any]]:
    return [json.loads(f.read_text()) for f in sorted(out.glob(f"{mode}-*.json"))
            if not f.name.endswith(".spec.json")]


def run_relaunch(args: argparse.Namespace, base: dict[str, Any], out: Path, procs: Procs,
                 deadline: float) -> dict[str, Any]:
    segments = base["segments"]
    exits: list[dict[str, float]] = []
    stores = []  # held until the end: a TCPStore server lives as long as its object
    for g, (world, _, _) in enumerate(segments):
        store = _store()  # a fresh rendezvous store per world, as the harness hosts one
        stores.append(store)
        t_spawn = time.time()
        gen = []
        for r in range(world):
            spec = {**base, "mode": "relaunch", "gen": g, "name": f"g{g}-r{r}", "role": "rank"}
            env = _env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                        "MASTER_PORT": str(store.port)})
            gen.append(procs.start(spec, env, out / f"relaunch-g{g}-r{r}.log"))
        t_exit = procs.wait(gen, deadline)
        exits.append({"t_spawn": t_spawn, "t_exit": t_exit})
    res = _results(out, "relaunch")
    changes = []
    for k in range(len(segments) - 1):
        old = [r for r in res if r["gen"] == k]
        new = [r for r in res if r["gen"] == k + 1]
        t_stop = max(r["t_stop"] for r in old)
        t_saved = max(r["t_saved"] for r in old)
        t_ready = max(r["t_loaded"] for r in new)
        r0 = next(r for r in new if r["rank"] == 0)
        changes.append({
            "total_s": t_ready - t_stop,
            "save_s": t_saved - t_stop,
            "exit_s": exits[k]["t_exit"] - t_saved,
            "spawn_import_s": max(r["t_imported"] for r in new) - exits[k]["t_exit"],
            "init_s": max(r["t_init"] for r in new) - max(r["t_imported"] for r in new),
            "load_s": t_ready - max(r["t_init"] for r in new),
            "rank0_init_s": r0["init_s"], "rank0_load_s": r0["load_s"],
            "first_step_s": _first_step(new, segments[k + 1][1]),
        })
    return {"results": res, "changes": changes}


def _first_step(results: list[dict[str, Any]], step: int) -> float:
    ends = [s["t1"] - s["t0"] for r in results for s in r["steps"] if s["step"] == step]
    return max(ends) if ends else float("nan")


def run_live(args: argparse.Namespace, base: dict[str, Any], out: Path, procs: Procs,
             deadline: float) -> dict[str, Any]:
    segments = base["segments"]
    # One fresh rendezvous store per world (a reused one hands the new world the old gloo
    # addresses), held until the end: a TCPStore server lives as long as its object.
    stores = [_store() for _ in segments]
    control = _store()
    base = {**base, "ports": [s.port for s in stores], "control_port": control.port}
    initial = []
    for r in range(segments[0][0]):
        spec = {**base, "mode": "live", "rank": r, "name": f"start-r{r}", "role": "initial"}
        initial.append(procs.start(spec, _env({"RANK": str(r), "WORLD_SIZE": str(segments[0][0]),
                                                "LOCAL_RANK": str(r),
                                                "MASTER_PORT": str(stores[0].port)}),
                                   out / f"live-start-r{r}.log"))
    alive = list(initial)
    spawned: dict[int, float] = {}
    for k in range(len(segments) - 1):
        old_world, new_world = segments[k][0], segments[k + 1][0]
        leavers = alive[new_world:old_world] if new_world < old_world else []
        if leavers:
            procs.wait(leavers, deadline)  # they hand over, then exit 0
            alive = [p for p in alive if p not in leavers]
        for j in range(new_world - old_world):  # joiners of change k
            spec = {**base, "mode": "live", "rank": None, "join_change": k, "joiner": j,
                    "name": f"join{k}-{j}", "role": "joiner"}
            if args.joiner == "cold":
                procs.watch_key(control, f"c{k}/stopped", deadline)
            spawned[k] = time.time()
            alive.append(procs.start(spec, _env({}), out / f"live-join{k}-{j}.log"))
    procs.wait(alive, deadline)
    res = _results(out, "live")
    changes = []
    for k in range(len(segments) - 1):
        recs = [(r, c) for r in res for c in r["changes"] if c["change"] == k]
        t_stop = max(c["t_stop"] for _, c in recs if "t_stop" in c)
        ready = [c["t_ready"] for _, c in recs if c.get("new_rank") is not None]
        r0 = next(c for _, c in recs if c.get("new_rank") == 0)["phases"]
        joiners = [r for r, c in recs if r.get("join_change") == k]
        leavers = [c for _, c in recs if c.get("new_rank") is None]
        new = [r for r, c in recs if c.get("new_rank") is not None]
        changes.append({
            "total_s": max(ready) - t_stop,
            **{f"rank0_{p}": v for p, v in r0.items()},
            "leaver_total_s": max((c["phases"]["total_s"] for c in leavers), default=None),
            "joiner_start_import_s": max((r["t_imported"] - r["t_proc_start"] for r in joiners),
                                         default=None),
            "joiner_warm_up_s": max((r.get("warm_up_s", 0.0) for r in joiners), default=None),
            "spare_wait_s": max((r.get("spare_wait_s", {}).get(str(k), 0.0) for r, c in recs
                                 if "t_stop" in c), default=None) if joiners else None,
            "joiner_spawned_before_stop_s": (t_stop - spawned[k]) if k in spawned else None,
            # > 0: the joiner was up and waiting when the old world stopped (warm); < 0: not yet
            "joiner_ready_before_stop_s": min((t_stop - r["t_waiting"] for r in joiners),
                                              default=None),
            "first_step_s": _first_step(new, segments[k + 1][1]),
        })
    return {"results": res, "changes": changes}


# -- comparison --------------------------------------------------------------------------------
def _loss_by_step(results: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for r in results for e in r["losses"] if e["rank"] == 0}


def _digests(results: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    d: dict[str, dict[str, str]] = {}
    for r in results:
        d.update(r["digests"])
    return d


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: obj}


def compare_state(a_path: Path, b_path: Path) -> dict[str, Any]:
    import torch

    a = torch.load(a_path, weights_only=False)
    b = torch.load(b_path, weights_only=False)
    out: dict[str, Any] = {}
    for part in ("model", "optim", "extra"):
        fa, fb = _flat(a[part]), _flat(b[part])
        keys = sorted(set(fa) | set(fb))
        diff, maxabs, tensors = [], 0.0, 0
        for k in keys:
            x, y = fa.get(k), fb.get(k)
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                tensors += 1
                if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                    diff.append(k)
                    if x.shape == y.shape and x.is_floating_point():
                        maxabs = max(maxabs, (x.double() - y.double()).abs().max().item())
                    else:
                        maxabs = float("inf")
            elif x != y:
                diff.append(k)
        out[part] = {"entries": len(keys), "tensors": tensors, "differ": diff, "max_abs": maxabs}
    out["step"] = (a["step"], b["step"])
    return out


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def report(args: argparse.Namespace, base: dict[str, Any], runs: list[dict[str, Any]]) -> bool:
    segments = base["segments"]
    rl, lv = runs[-1]["relaunch"], runs[-1]["live"]
    print()
    print(f"LM size {args.size}, {args.steps} steps, worlds "
          + " -> ".join(f"{w} (steps {a}-{b})" for w, a, b in segments)
          + f", replicas {args.replicas}, method {args.method}, joiner {args.joiner}, "
            f"gc freeze {'on' if args.gc_freeze else 'off'}, bug {args.bug}, "
            f"{len(runs)} repeat(s)")
    # -- timing
    med = "median of " + str(len(runs)) if len(runs) > 1 else "one run"
    print(f"\nMembership change time, old world's last step -> every new rank ready ({med}):")
    print(f"  {'change':23s} {'live (in memory)':>17s} {'relaunch (DCP)':>15s} {'ratio':>6s}"
          f"   {'+ first step at the new size: live':>34s} {'relaunch':>9s}")
    for k in range(len(segments) - 1):
        med_of = {}
        for mode in ("live", "relaunch"):
            ch = [r[mode]["changes"][k] for r in runs]
            med_of[mode] = (statistics.median(c["total_s"] for c in ch),
                            statistics.median(c["total_s"] + c["first_step_s"] for c in ch))
        (lt, lf), (rt, rf) = med_of["live"], med_of["relaunch"]
        name = f"{k}: {segments[k][0]} -> {segments[k + 1][0]} after step {segments[k][2]}"
        print(f"  {name:23s} {lt:16.3f}s {rt:14.3f}s {rt / lt:5.1f}x   {lf:33.3f}s {rf:8.3f}s")
    for k in range(len(segments) - 1):
        lc, rc = lv["changes"][k], rl["changes"][k]
        print(f"  change {k} breakdown (last run):")
        line = (f"    live:     capture {_fmt(lc.get('rank0_capture_s'))} s, release "
                f"{_fmt(lc.get('rank0_release_s'))} s, gc of the old world "
                f"{_fmt(lc.get('rank0_gc_s'))} s, join (rendezvous + fresh model + "
                f"fully_shard + AdamW) {_fmt(lc.get('rank0_join_s'))} s, restore "
                f"{_fmt(lc.get('rank0_restore_s'))} s (rank 0)")
        if lc.get("leaver_total_s") is not None:
            line += f"; leaver done in {_fmt(lc['leaver_total_s'])} s"
        if lc.get("joiner_start_import_s") is not None:
            line += (f"; joiner start+import {_fmt(lc['joiner_start_import_s'])} s, warm-up "
                     f"{_fmt(lc['joiner_warm_up_s'])} s, spawned "
                     f"{_fmt(lc['joiner_spawned_before_stop_s'])} s and ready "
                     f"{_fmt(lc['joiner_ready_before_stop_s'])} s before the stop")
            if lc.get("spare_wait_s"):
                line += (f" (the old world waited {_fmt(lc['spare_wait_s'])} s for it before "
                         "its last step, not counted)")
        print(line)
        print(f"    relaunch: save {_fmt(rc['save_s'])} s, exit {_fmt(rc['exit_s'])} s, "
              f"spawn + import {_fmt(rc['spawn_import_s'])} s, init {_fmt(rc['init_s'])} s, "
              f"load {_fmt(rc['load_s'])} s")
        print(f"    first step at the new size: live {_fmt(lc['first_step_s'])} s, relaunch "
              f"{_fmt(rc['first_step_s'])} s")
    # -- correctness, per repeat (the last one printed in full)
    for r in runs:
        la, lb = _loss_by_step(r["relaunch"]["results"]), _loss_by_step(r["live"]["results"])
        da, db = _digests(r["relaunch"]["results"]), _digests(r["live"]["results"])
        st = r["state"]
        r["equal"] = {
            "losses": la == lb and len(la) == base["cfg"]["steps"],
            "digests": da == db and len(da) == len(segments) - 1,
            "state": all(not st[p]["differ"] for p in ("model", "optim", "extra")),
        }
    r = runs[-1]
    la, lb = _loss_by_step(r["relaunch"]["results"]), _loss_by_step(r["live"]["results"])
    print("\nPer-step loss (rank 0's all-reduced loss, as the LM records it):")
    print(f"  {'step':>4s} {'world':>5s} {'relaunch (DCP)':>22s} {'live':>22s}  equal")
    world_of = {s: w for w, a, b in segments for s in range(a, b + 1)}
    for s in sorted(set(la) | set(lb)):
        x, y = la.get(s), lb.get(s)
        diff = "yes" if x == y else f"NO ({abs(x - y):.3e})" if x is not None and y is not None \
            else "NO (missing)"
        print(f"  {s:4d} {world_of.get(s, '?'):>5} {_fmt(x, 17):>22s} {_fmt(y, 17):>22s}  {diff}")
    da, db = _digests(r["relaunch"]["results"]), _digests(r["live"]["results"])
    print("\nState digest right after each change (full model, optimizer, step, LR schedule, "
          "data position, RNG):")
    for key in sorted(set(da) | set(db)):
        a, b = da.get(key, {}), db.get(key, {})
        bad = [c for c in sorted(set(a) | set(b)) if a.get(c) != b.get(c)]
        print(f"  {key}: " + ("identical" if not bad else f"DIFFERENT in {', '.join(bad)}"))
    st = r["state"]
    print(f"\nFinal state after step {st['step'][0]} (relaunch) / {st['step'][1]} (live):")
    for part, label in (("model", "model parameters"), ("optim", "AdamW state + param groups"),
                        ("extra", "LR schedule, data position, RNG")):
        p = st[part]
        print(f"  {label:32s} {p['entries']:4d} entries ({p['tensors']} tensors): "
              + ("bit-identical" if not p["differ"] else
                 f"{len(p['differ'])} DIFFER, max |diff| {p['max_abs']:.3e} "
                 f"(e.g. {', '.join(p['differ'][:3])})"))
    all_equal = all(all(r["equal"].values()) for r in runs)
    verdict = [f"repeat {i}: " + ", ".join(f"{k} {'equal' if v else 'DIFFER'}"
                                           for k, v in r["equal"].items())
               for i, r in enumerate(runs)]
    print("\n" + "\n".join(verdict))
    if args.bug == "none":
        ok = all_equal
        print("VERDICT: " + ("live reshard == save-exit-relaunch-load, bit for bit" if ok else
                             "MISMATCH: the live reshard differs from the relaunch"))
    else:
        ok = all(not all(r["equal"].values()) for r in runs)
        print(f"VERDICT: planted bug {args.bug}: " + ("caught (the comparison differs)" if ok else
                                                       "NOT caught"))
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--size", default="tiny")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--sizes", default="4,3,4", help="world sizes, in order (at most 4)")
    p.add_argument("--change-after", default="4,12",
                   help="the last step of each world but the last")
    p.add_argument("--joiner", choices=("warm", "cold"), default="warm")
    p.add_argument("--bug", default="none", choices=("none", "keep_old_shard_map"))
    p.add_argument("--method", default="fast", choices=("fast", "dcp"),
                   help="lm_live's handover: two flat all-gathers + direct copies, or DCP's "
                        "state_dict API")
    p.add_argument("--replicas", type=int, default=1, help="the LM's HSDP replicas (where they "
                   "divide the world size)")
    p.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                   help="gc.freeze() in every worker after its imports (both modes)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for everything")
    p.add_argument("--keep", help="keep the run folders (logs, results) here")
    p.add_argument("--json", action="store_true", help="also print one line JSON {...}")
    args = p.parse_args(argv)
    if args.worker:
        return worker(json.loads(Path(args.worker).read_text()))

    sizes = [int(x) for x in args.sizes.split(",")]
    after = [int(x) for x in args.change_after.split(",")] if args.change_after else []
    if len(after) != len(sizes) - 1 or after != sorted(after) \
            or (after and after[-1] >= args.steps - 1):
        p.error("--change-after needs one step per change, increasing, before the last step")
    if max(sizes) > MAX_PROCS or min(sizes) < 1:
        p.error(f"world sizes must be 1..{MAX_PROCS}")
    firsts = [0] + [a + 1 for a in after]
    lasts = after + [args.steps - 1]
    segments = [[w, a, b] for w, a, b in zip(sizes, firsts, lasts)]
    t_end = time.monotonic() + args.timeout
    wall_deadline = time.time() + args.timeout + 5  # the workers' watchdog
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="live-reshard-"))
    root.mkdir(parents=True, exist_ok=True)
    procs = Procs()

    def on_signal(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    runs = []
    try:
        for i in range(args.repeats):
            out = root / f"repeat-{i}"
            out.mkdir(parents=True, exist_ok=True)
            base = {"segments": segments, "bug": args.bug, "method": args.method,
                    "joiner_mode": args.joiner, "gc_freeze": args.gc_freeze,
                    "deadline": wall_deadline,
                    "timeout_s": max(30.0, min(120.0, args.timeout / 2)), "out": str(out)}
            modes = {}
            for mode in ("relaunch", "live") if i % 2 == 0 else ("live", "relaunch"):
                cfg = {"size": args.size, "steps": args.steps, "seed": 0, "ckpt_every": 10 ** 6,
                       "replicas": args.replicas,
                       "digest": False, "health": False, "log_every": 0,
                       "workdir": str(out / f"work-{mode}")}
                spec = {**base, "cfg": cfg}
                t0 = time.monotonic()
                modes[mode] = (run_relaunch if mode == "relaunch" else run_live)(
                    args, spec, out, procs, t_end)
                print(f"repeat {i}: {mode} run done in {time.monotonic() - t0:.1f} s", flush=True)
            modes["state"] = compare_state(out / "final-relaunch.pt", out / "final-live.pt")
            runs.append(modes)
        ok = report(args, {"segments": segments, "cfg": {"steps": args.steps}}, runs)
        if args.json:
            print("JSON " + json.dumps({
                "changes": [{mode + "_s": statistics.median(r[mode]["changes"][k]["total_s"]
                                                            for r in runs)
                             for mode in ("live", "relaunch")}
                            for k in range(len(segments) - 1)],
                "equal": [r["equal"] for r in runs]}))
        return 0 if ok else 1
    except Exception as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        procs.kill_all()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
