"""Recovery time on one model, side by side: torchft's heal, our restart path, the LM's live
reshard. Each is a real run under the harness on 4 ranks of the bundled LM's tiny GPT; the ways
are interleaved so they see the same machine noise.

    python bench/recovery.py [--repeats 3] [--steps 14] [--heartbeat-ms 1000]

- torchft (a failure): ``tests/workloads/torchft_train.py --model gpt``, 2 replica groups x 2
  ranks (torchft's DDP across the groups, a plain all-reduce inside one), the harness's
  membership mode and its Lighthouse. Rank 2 (group 1) is SIGKILLed in step 7's backward; the
  supervisor restarts group 1 alone, which heals from group 0. Measured from the kill: the
  survivors' next committed step (every rank of group 0 ended it) and the restarted group's
  first committed step (its heal included). The survivors' pause is about the Lighthouse's
  ``heartbeat_timeout_ms``, a setting (``--heartbeat-ms``; torchft's default is 5000).
- restart (a failure): the LM (FSDP2 over 4 ranks, a DCP checkpoint every 5 steps), rank 1
  SIGKILLed in step 7's backward: the generation ends, every rank is relaunched from the fork
  server and resumes from the last checkpoint. Measured from the kill to the new generation's
  first committed step (every rank ended it) and to the killed step committed again, and the
  committed steps it runs again (the rewind). (torchft's survivors' next committed step is the
  killed step: nothing is rewound.)
- live (planned): the LM ``--live``, ``shift_shards`` 4 -> 3 after step 7, in the running
  processes; relaunch (planned): the same change by save, exit, relaunch, load. Measured from the
  old world's last step end (its slowest rank) to the new world's first committed step.

A failure is not announced: its times include noticing it. A planned change is: its times
start when the old world has finished its last step. Every run's verdicts must be what the way
promises (no_rewind, state_equivalence and liveness pass; the restart's rewind at most the
checkpoint interval), or the script stops with them. The Lighthouse logs its quorums on stderr.
"""
import argparse
import statistics
import tempfile
from pathlib import Path

from live_reshard import recovery_s  # bench/: the planned change's clock, one home

from pytest_reshard import chaos
from pytest_reshard.checkers import liveness, no_rewind, state_equivalence
from pytest_reshard.history import History
from pytest_reshard.session import Session, scenario_from

TORCHFT = str(Path(__file__).resolve().parent.parent / "tests" / "workloads" / "torchft_train.py")
WORLD, AT_STEP, CKPT_EVERY = 4, 7, 5
WAYS = ("torchft", "restart", "live", "relaunch")


def scenario(way: str, steps: int, heartbeat_ms: int):
    if way == "torchft":
        return scenario_from(TORCHFT, world_size=WORLD, steps=steps, replica_groups=2,
                             faults=[chaos.kill(rank=2, at_step=AT_STEP, phase="backward")],
                             phases=["heal"], timeout_s=180,
                             lighthouse={"heartbeat_timeout_ms": heartbeat_ms},
                             args=["--groups", "2", "--model", "gpt",
                                   "--ckpt-every", str(CKPT_EVERY), "--timeout", "5"])
    lm_args = ["--size", "tiny", "--ckpt-every", str(CKPT_EVERY)]
    if way == "restart":
        return scenario_from("lm", world_size=WORLD, steps=steps, args=lm_args, timeout_s=180,
                             faults=[chaos.kill(rank=1, at_step=AT_STEP, phase="backward")])
    return scenario_from("lm", world_size=WORLD, steps=steps, timeout_s=180,
                         args=lm_args + (["--live"] if way == "live" else []),
                         faults=[chaos.shift_shards(to_world_size=3, at_step=AT_STEP,
                                                    notice_s=30)])


def group_commits(h: History, ranks: set[int], after: float, incarnation: int = 0) -> list[float]:
    """When each step was committed by ``ranks`` (every one of them ended it), from
    incarnation ``incarnation`` on, for steps whose last end is after ``after``; sorted."""
    ends: dict[int, dict[int, float]] = {}
    for a in h.attempts(0):
        if a.ended and a.rank in ranks and a.incarnation >= incarnation:
            ends.setdefault(a.step, {}).setdefault(a.rank, h.events[a.end_index]["t"])
    return sorted(max(by.values()) for by in ends.values()
                  if set(by) == ranks and max(by.values()) > after)


def measure(way: str, h: History) -> dict[str, float]:
    verdicts = {"no_rewind": no_rewind(h), "state_equivalence": state_equivalence(h),
                "liveness": liveness(h, run_dir=h.run_dir)}
    bad = {k: v for k, v in verdicts.items() if v.status != "pass"}
    if bad:
        raise SystemExit(f"{way}: " + "; ".join(f"{k} {v.status}: {v.message}"
                                                for k, v in bad.items()))
    if way in ("live", "relaunch"):
        return {"change_s": recovery_s(h, AT_STEP, 0)[1]}
    [fault] = h.faults_fired()
    if way == "torchft":
        [restart] = h.member_restarts(0)
        assert restart["ranks"] == [2, 3], restart
        survivors = group_commits(h, {0, 1}, fault.t)
        healed = group_commits(h, {2, 3}, fault.t, incarnation=1)
        return {"survivors_s": survivors[0] - fault.t, "healed_s": healed[0] - fault.t,
                "reduced_steps": len(h.reduced_steps(0))}
    first = min(h.committed(1))
    lost = max(h.committed(0)) + 1 - first  # committed before the kill, run again
    if lost > CKPT_EVERY:
        raise SystemExit(f"restart: {lost} committed steps run again, more than the checkpoint "
                         f"interval {CKPT_EVERY}")
    return {"restart_s": max(h.end_times(1, first).values()) - fault.t,
            "back_s": max(h.end_times(1, AT_STEP).values()) - fault.t, "lost_steps": lost}


ROWS = (  # (key, way, what happens, from -> to)
    ("survivors_s", "torchft heal, 2x2", "failure: rank 2 killed",
     "kill -> survivors' next committed step"),
    ("healed_s", "torchft heal, 2x2", "failure: rank 2 killed",
     "kill -> restarted group's first committed (healed) step"),
    ("restart_s", "LM restart (relaunch + DCP load)", "failure: rank 1 killed",
     "kill -> first committed step, all 4 ranks"),
    ("back_s", "LM restart (relaunch + DCP load)", "failure: rank 1 killed",
     f"kill -> the killed step {AT_STEP} committed (the rewound steps re-run)"),
    ("change_s:live", "LM --live 4 -> 3", "planned: shift_shards",
     "old world's last step end -> new world's first committed step"),
    ("change_s:relaunch", "LM save-exit-relaunch-load 4 -> 3", "planned: shift_shards",
     "old world's last step end -> new world's first committed step"),
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--heartbeat-ms", type=int, default=1000,
                   help="the Lighthouse's heartbeat_timeout_ms (torchft's default: 5000)")
    args = p.parse_args()
    if args.steps <= AT_STEP + 2:
        p.error(f"--steps must be more than {AT_STEP + 2}: the fault is at step {AT_STEP}")
    got: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        for i in range(args.repeats):
            for way in WAYS:
                h = session.execute(scenario(way, args.steps, args.heartbeat_ms),
                                    Path(tmp) / f"{way}-{i}")
                m = measure(way, h)
                for k, v in m.items():
                    got.setdefault(f"{k}:{way}" if k == "change_s" else k, []).append(v)
                print(f"{way:8s} run {i}: " + ", ".join(
                    f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items())
                    + " | no_rewind, state_equivalence, liveness pass", flush=True)
    medians = {k: statistics.median(v) for k, v in got.items()}
    counts = ("lost_steps", "reduced_steps")
    fastest = min(v for k, v in medians.items() if k not in counts)
    print(f"\nmedians of {args.repeats}, tiny GPT on {WORLD} ranks, fault or change at step "
          f"{AT_STEP}, checkpoint every {CKPT_EVERY} steps, Lighthouse heartbeat timeout "
          f"{args.heartbeat_ms} ms")
    print("| way | what happens | measured | median s | vs fastest |\n|---|---|---|---|---|")
    for key, way, what, span in ROWS:
        print(f"| {way} | {what} | {span} | {medians[key]:.3f} | {medians[key] / fastest:.1f}x |")
    print(f"\nLM restart: committed steps run again (the rewind), per run: {got['lost_steps']} "
          f"(at most the checkpoint interval, {CKPT_EVERY}); torchft: none (no_rewind passed), "
          f"steps the survivors committed without the killed group, per run: "
          f"{got['reduced_steps']}")


if __name__ == "__main__":
    main()
