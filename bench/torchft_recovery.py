"""torchft's recovery under the harness's membership mode, measured from the recorded history.

    python bench/torchft_recovery.py --repeats 3 --scenarios kill,kill_in_heal,two_in_a_row

Each run: 2 replica groups x 1 rank of tests/workloads/torchft_train.py, the supervisor's
Lighthouse (heartbeat timeout ``--heartbeat-ms``), a SIGKILL of a group, the group restarted
alone through the fork server. Per group restart it reports, from the events' own clocks:

- survivor: the fault -> the next step a rank of another group ended (committed);
- restarted: the new incarnation's ``start`` (the probe attached) -> its first committed step,
  and the supervisor's restart -> that ``start``;

and what the checkers said (no_rewind, state_equivalence) with the steps a smaller quorum
committed (whose share of the killed group is never trained).
"""
import argparse
import statistics
import tempfile
from pathlib import Path

from pytest_reshard import chaos
from pytest_reshard.checkers import no_rewind, state_equivalence
from pytest_reshard.history import History
from pytest_reshard.session import Session, scenario_from

WORKLOAD = str(Path(__file__).resolve().parent.parent / "tests" / "workloads" / "torchft_train.py")
SCENARIOS = {
    "kill": [chaos.kill(rank=1, at_step=5, phase="backward")],
    "kill_in_heal": [chaos.kill(rank=1, at_step=5, phase="backward"),
                     chaos.kill(rank=1, at_step=0, phase="heal")],
    "two_in_a_row": [chaos.kill(rank=1, at_step=5, phase="backward"),
                     chaos.kill(rank=0, at_step=20, phase="backward")],
}


def recovery(h: History) -> list[dict[str, float]]:
    """Per restart: seconds from the fault to a survivor's next end, from the supervisor's restart
    to the incarnation's start, and from that start to its first end."""
    out = []
    ends = h.rank_events("end", gen=0)
    for restart in h.member_restarts(0):
        ranks = set(restart["ranks"])
        fault_t = max(f.t for f in h.faults_fired() if f.rank in ranks and f.t <= restart["t"])
        start = min((e for e in h.rank_events("start", gen=0) if e["rank"] in ranks
                     and e["t"] > restart["t"]), key=lambda e: e["t"])
        survivor = min(e["t"] for e in ends if e["rank"] not in ranks and e["t"] > fault_t)
        later = [e["t"] for e in h.rank_events("start", gen=0)
                 if e["rank"] == start["rank"] and e["t"] > start["t"]]
        until = min(later, default=float("inf"))  # killed again before it committed: no rejoin
        firsts = [e["t"] for e in ends if e["rank"] == start["rank"] and start["t"] < e["t"] < until]
        out.append({"survivor_s": survivor - fault_t, "relaunch_s": start["t"] - restart["t"],
                    "rejoin_s": (min(firsts) - start["t"]) if firsts else float("nan")})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--heartbeat-ms", type=int, default=1000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for name in args.scenarios.split(","):
            rows = []
            for i in range(args.repeats):
                sc = scenario_from(WORKLOAD, world_size=2, steps=args.steps, faults=SCENARIOS[name],
                                   replica_groups=2, phases=["heal"], timeout_s=180,
                                   lighthouse={"heartbeat_timeout_ms": args.heartbeat_ms},
                                   args=["--groups", "2", "--step-sleep", "0.05",
                                         "--ckpt-every", "10", "--timeout", "5"])
                h = session.execute(sc, Path(tmp) / f"{name}-{i}")
                r = recovery(h)
                rows.extend(r)
                reduced = sorted(h.reduced_steps(0))
                print(f"{name} run {i}: " + "; ".join(
                    f"survivor {x['survivor_s']:.2f} s, relaunch {x['relaunch_s']:.3f} s, "
                    f"rejoin {x['rejoin_s']:.2f} s" for x in r)
                    + f" | no_rewind {no_rewind(h).status}, state_equivalence "
                      f"{state_equivalence(h).status} ({state_equivalence(h).message[:60]}), "
                      f"steps a smaller quorum committed: {reduced or 'none'}", flush=True)
            for key in ("survivor_s", "relaunch_s", "rejoin_s"):
                vals = [x[key] for x in rows if x[key] == x[key]]  # NaN: killed before rejoining
                print(f"{name} {key}: median {statistics.median(vals):.3f} s, max {max(vals):.3f} s "
                      f"over {len(vals)} restarts")


if __name__ == "__main__":
    main()
