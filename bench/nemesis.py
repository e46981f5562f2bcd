"""The wider nemesis beside a kill, on one model: how long each fault takes to be noticed, and to
the first committed step after it. Each is a real run under the harness on 4 ranks of the
bundled LM (FSDP2, a durable DCP checkpoint every 4 steps); the kinds are interleaved so they
see the same machine noise.

    python bench/nemesis.py [--repeats 2] [--steps 12]

- kill: rank 1 SIGKILLed in step 7's backward;
- abort_comms: rank 1's process groups aborted in step 7's backward, the process left alive
  (it fails its next collective, writes its emergency snapshot and exits);
- power_loss: the machine's power cut at the first file event rank 0 makes from step 7 on (the
  save after step 7 begins), every rank killed at once, what was not durable undone;
- bitflip: bit 30 of rank 1's first parameter flipped in step 7 before the update; the LM's loss
  guard stops every rank once the loss shows it (a NaN or a spike), without saving;
- kill/elastic and partition: on two namespaced nodes under torchrun's agents (root; skipped
  elsewhere), a kill of rank 2, and rank 2's node cut off the network in step 7's backward; the
  LM's collectives time out after 5 s, and the agents re-form on the node left.

Measured from the fault (the kill, the abort, the cut): the supervisor's first detection of a
dead rank (``detect``), and the next generation's first committed step (every rank ended it),
with the committed steps it runs again. Every run must pass every checker, or the script stops
with the verdicts. (``slow_link`` ends nothing: its cost is the throughput it takes, which
``tests/scenarios/test_network_faults.py`` reports.)
"""
import argparse
import statistics
import tempfile
from pathlib import Path

from pytest_reshard import chaos
from pytest_reshard.history import FileEvent, History
from pytest_reshard.session import Session, scenario_from
from pytest_reshard.supervisor.launch import netns

WORLD, AT_STEP, CKPT_EVERY = 4, 7, 4
NODES = dict(launcher="elastic", nodes=2, network="netns")
KINDS = {  # name: (the fault, the scenario's options, the LM's own arguments)
    "kill": (chaos.kill(rank=1, at_step=AT_STEP, phase="backward"), {}, []),
    "abort_comms": (chaos.abort_comms(rank=1, at_step=AT_STEP, phase="backward"), {}, []),
    "power_loss": (chaos.power_loss(rank=0, at_step=AT_STEP, event=1), {}, []),
    "bitflip": (chaos.bitflip(rank=1, at_step=AT_STEP, phase="optimizer", bit=30), {}, []),
    "kill/elastic": (chaos.kill(rank=2, at_step=AT_STEP, phase="backward"), NODES,
                     ["--pg-timeout-s", "5"]),
    "partition": (chaos.partition(rank=2, at_step=AT_STEP), NODES, ["--pg-timeout-s", "5"]),
}


def fault_time(h: History) -> float:
    """When the fault struck: a power loss at its cut, the others where they fired."""
    cut = [e.t for e in h.file_events() if isinstance(e, FileEvent) and e.killed == "power"]
    if cut:
        return cut[0]
    [fault] = h.faults_fired()
    assert fault.t is not None
    return fault.t


def measure(h: History) -> dict[str, float]:
    at = fault_time(h)
    detected = min(d.t for d in h.detections() if d.gen == 0 and d.t is not None)
    first = min(h.committed(1))
    return {"detect_s": detected - at,
            "first_commit_s": max(h.end_times(1, first).values()) - at,
            "rerun_steps": max(h.committed(0)) + 1 - first}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    got: dict[tuple[str, str], list[float]] = {}
    why = netns.netns_unavailable()
    kinds = {k: v for k, v in KINDS.items() if why is None or not v[1]}
    if len(kinds) < len(KINDS):
        print(f"skipping {', '.join(k for k in KINDS if k not in kinds)}: {why}")
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for i in range(args.repeats):
            for kind, (fault, options, lm_args) in kinds.items():
                sc = scenario_from("lm", world_size=WORLD, steps=args.steps, timeout_s=180,
                                   args=["--size", "tiny", "--ckpt-every", str(CKPT_EVERY),
                                         *lm_args], faults=[fault], **options)
                result = session.run(sc, f"{kind}-{i}")
                if not result.ok:
                    raise SystemExit(f"{kind}: " + "; ".join(
                        f"{k} {v.status}: {v.message}" for k, v in result.verdicts.items()
                        if v.status != "pass"))
                m = measure(result.history)
                for k, v in m.items():
                    got.setdefault((kind, k), []).append(v)
                print(f"{kind:12s} run {i}: " + ", ".join(f"{k} {v:.3f}" for k, v in m.items())
                      + " | every checker passes", flush=True)
    kill = {k: statistics.median(v) for (kind, k), v in got.items() if kind == "kill"}
    print(f"\nmedians of {args.repeats}, {WORLD} ranks, fault in step {AT_STEP}, a checkpoint "
          f"every {CKPT_EVERY} steps:")
    print(f"{'fault':12s} {'detected':>10s} {'x kill':>7s} {'1st commit':>11s} {'x kill':>7s} "
          f"{'re-run':>7s}")
    for kind in kinds:
        m = {k: statistics.median(got[(kind, k)]) for k in ("detect_s", "first_commit_s",
                                                              "rerun_steps")}
        print(f"{kind:12s} {m['detect_s']:9.3f}s {m['detect_s'] / kill['detect_s']:6.2f}x "
              f"{m['first_commit_s']:10.3f}s {m['first_commit_s'] / kill['first_commit_s']:6.2f}x "
              f"{m['rerun_steps']:7.0f}")


if __name__ == "__main__":
    main()
