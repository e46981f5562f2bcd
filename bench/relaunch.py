"""Relaunch latency: from the end of a generation to the first step of the next one.

Runs the same planned reshard (4 -> 3 ranks, bundled LM, tiny) with the warm fork server and
with cold interpreters, interleaved so both see the same machine noise, and prints the medians
and their ratio. Usage: python bench/relaunch.py [--repeats 5] [--workload lm]
[--launchers fork,local] [--json] (one line ``JSON {...}`` of the medians, for
bench/before_after.py). With ``slurm`` or ``slurm-fork`` among the launchers (2 nodes x 2 ranks
on the cluster in SLURM_CONF) every launcher reshards 4 -> 2 instead, one node's worth, so the
runs compare.
"""
import argparse
import json
import statistics
import tempfile
from pathlib import Path

from pytest_reshard import chaos
from pytest_reshard.history import History
from pytest_reshard.session import Session, scenario_from

SLURM = {"slurm", "slurm-fork"}  # 2 nodes x 2 ranks of the cluster in SLURM_CONF


def relaunch_s(history: History, ev: str = "begin") -> float:
    """gen_end of generation 0 -> the last rank of generation 1 recording ``ev`` (its first
    ``start``: the process is up and attached; its first ``begin``: training resumed)."""
    end = next(e["t"] for e in history.events if e["ev"] == "gen_end" and e["gen"] == 0)
    first = {}
    for e in history.events:
        if e["ev"] == ev and e.get("gen") == 1:
            first.setdefault(e["rank"], e["t"])
    return max(first.values()) - end


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workload", default="lm")
    p.add_argument("--launchers", default="fork,local")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    launchers = args.launchers.split(",")
    on_slurm = bool(SLURM & set(launchers))
    times: dict[str, list[float]] = {k: [] for k in launchers}
    up: dict[str, list[float]] = {k: [] for k in launchers}
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for i in range(args.repeats):
            for launcher in times:
                sc = scenario_from(args.workload, world_size=4, steps=6, launcher=launcher,
                                   nodes=2 if launcher in SLURM else 1,
                                   faults=[chaos.shift_shards(to_world_size=2 if on_slurm else 3,
                                                              at_step=2)])
                history = session.execute(sc, Path(tmp) / f"{launcher}-{i}")
                times[launcher].append(relaunch_s(history))
                up[launcher].append(relaunch_s(history, "start"))
                print(f"{launcher:7s} run {i}: ranks up {up[launcher][-1]:.3f} s, first step "
                      f"{times[launcher][-1]:.3f} s", flush=True)
    if set(launchers) >= {"fork", "local"}:
        for label, data in (("ranks up (harness)", up),
                            ("first step (harness + workload resume)", times)):
            fork, cold = (statistics.median(data[k]) for k in ("fork", "local"))
            print(f"relaunch to {label}, median of {args.repeats}: fork server {fork:.3f} s, "
                  f"cold start {cold:.3f} s, ratio {cold / fork:.1f}x")
    for label, data in (("ranks up", up), ("first step", times)):
        print(f"relaunch to {label}, median of {args.repeats}: " + ", ".join(
            f"{k} {statistics.median(v):.3f} s" for k, v in data.items()))
    if args.json:
        print("JSON " + json.dumps({f"{k} {what}": round(statistics.median(data[k]), 4)
                                    for what, data in (("ranks up", up), ("first step", times))
                                    for k in launchers}))


if __name__ == "__main__":
    main()
