"""Cost of a ci-profile property test on the bundled LM: 10 generated schedules, one Session.

The Session is reused across examples: one warm fork server, the clean reference runs cached
(one per world size), so an example costs its own generations only. Prints the wall time of the
whole property test (fork server start and reference runs included) and per example.
Target: at most 90 s on 2 cores. Usage: python bench/property_cost.py [--world-size 2] [--steps 8]
"""
import argparse
import tempfile
import time
from pathlib import Path

from hypothesis import given

from pytest_reshard.schedule import strategies
from pytest_reshard.session import Session, scenario_from

LM_PHASES = ("data", "forward", "backward", "optimizer")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--profile", default="ci", choices=strategies.PROFILES)
    args = p.parse_args()
    sizes = tuple(w for w in range(1, args.world_size + 1) if 12 % w == 0)
    ran: list[tuple[str, str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        @strategies.profile(args.profile)
        @given(strategies.schedules(args.world_size, args.steps, world_sizes=sizes,
                                    kinds=("kill", "shift_shards", "preempt"), max_faults=3,
                                    phases=LM_PHASES))
        def prop(schedule):
            scenario = scenario_from("lm", world_size=args.world_size, steps=args.steps,
                                     faults=schedule.faults, seed=schedule.seed, timeout_s=120)
            t = time.monotonic()
            result = session.run(scenario, f"lm-{schedule.hash}")
            ran.append((schedule.describe(), result.verdict.status, time.monotonic() - t))
            result.assert_ok()

        started = time.monotonic()
        error = None
        try:
            prop()
        except Exception as e:  # a real finding: report it, still print the cost
            error = e
        wall = time.monotonic() - started
    for describe, status, secs in ran:
        print(f"  {secs:5.1f} s  {status:7s} {describe}")
    print(f"property test ({args.profile} profile, lm, world size {args.world_size}, "
          f"{args.steps} steps): {len(ran)} runs in {wall:.1f} s "
          f"({wall / max(1, len(ran)):.1f} s per run, fork server and reference runs included)")
    if error is not None:
        print(f"FAILED: {error}")


if __name__ == "__main__":
    main()
