"""balance: in a heterogeneous world, no rank sits idle waiting for a slower one.

Each rank records per step how long it computed (``compute_s``) and how long it waited at the
step's collectives (``wait_s``), and its samples. The rank that arrives last at a step's
collectives waits only for their transfer, which every rank pays; a rank idles what it waited
beyond that, for a slower one. When the shares of the work are in proportion to each rank's
speed, every rank computes about as long as the slowest and nobody idles; an uneven split
(even shares on mixed devices, a share computed from an old device map) shows as one rank idling
a large part of every step. A rank without timings could be the idle one, so a generation is
judged only when every rank timed every step judged. Under a cgroup cap a rank gets its CPU time
per quota period: a step of a few milliseconds fits in one at full speed or waits out the rest
of it, so its class is not made real, and a rank whose steps compute for under ``MIN_PERIODS``
periods makes the verdict unknown.

In a world of several roles (a pipeline's targets and drafters) each role is judged on its own,
from ``compute_s`` alone: its ranks share the role's collectives, and each also waits on the
other role (a drafter for hidden states), which says nothing of its own role's shares. A rank
then idles what it computed less than the slowest peer over the steps judged. Step by step the
slowest peer changes with jitter (a rank's time swings 10-30% from step to step on a busy CPU
under a quota, as much between two equal ranks at even shares as between unequal ones); that
idle no split of the samples removes, so it is reported, not judged. A split that alternates
which rank is overloaded shows there too. A role none of whose ranks recorded ``compute_s`` is
left out, and the verdict says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.contract import OWN_GPUS, STRETCHED
from pytest_reshard.history import Devices, History
from pytest_reshard.verdict import Verdict

CHECK = "balance"
#: The largest part of its steps a rank may idle at the collectives in a balanced world.
MAX_IDLE = 0.10
#: The steps at the start of each generation left out: its first pays for warm-up and, in a
#: workload that measures its ranks' speeds, for the measuring.
SETTLE_STEPS = 1
TIMINGS = frozenset({"compute_s", "wait_s"})
#: The fewest quota periods a capped rank's step must compute for: a rank gets its CPU time per
#: period, so a shorter step either fits in one (full speed) or waits out the period's rest.
MIN_PERIODS = 3


@dataclass
class _Step:
    """One rank's records of one step, summed."""

    compute: float = 0.0
    wait: float = 0.0
    samples: int = 0
    keys: set[str] = field(default_factory=set)   # which of TIMINGS it recorded


def balance(history: History, *, max_idle: float = MAX_IDLE,
            settle_steps: int = SETTLE_STEPS) -> Verdict:
    """Every rank of each heterogeneous generation idled at most ``max_idle`` of its step time
    (its ``wait_s`` beyond the step's shortest, over ``compute_s + wait_s``, summed over the
    generation's steps that every rank ended, less its first ``settle_steps``: warm-up and, in a
    workload that measures its ranks' speeds, the measuring; one that feeds its step times back
    into its shares needs a few steps to settle). A failure names the idlest rank, its class and
    its share of the samples. A rank without timings in one of those steps, or whose steps are
    too short for its cgroup cap, makes the verdict unknown."""
    if settle_steps < 0:
        raise ValueError(f"settle_steps={settle_steps}: give the steps of each generation to "
                         "leave out, 0 or more")
    devices = history.devices()
    if not devices:
        return Verdict.unknown(CHECK, "not a heterogeneous world: pass devices= to judge balance")
    stretched = sorted({g for g, d in devices.items() if d.mode not in ("cgroup", OWN_GPUS)}
                       | {n.gen for n in history.notes(STRETCHED) if n.gen in devices})
    if stretched:   # the class's slowness comes after the step's body: compute_s cannot show it
        return Verdict.unknown(CHECK, f"generation {stretched[0]}'s devices were stretched, not "
                               "capped (or a rank could not join its cgroup): a rank's own "
                               "compute time does not show its class, so shares measured from "
                               "it cannot be judged (throttle='cgroup', as root, caps them)")
    steps: dict[tuple[int, int, int], _Step] = {}   # (gen, step, rank) -> its records
    for occ, e in history.records():
        row = steps.setdefault((occ.gen, occ.step, int(e["rank"])), _Step())
        row.keys |= TIMINGS & e.keys()
        row.compute += float(e.get("compute_s") or 0.0)
        row.wait += float(e.get("wait_s") or 0.0)
        row.samples += len(e.get("samples") or ())
    judged: list[str] = []
    untimed: list[tuple[int, str]] = []
    too_short: list[tuple[int, str]] = []   # ranks whose steps their cgroup cap cannot slow
    skipped: list[int] = []
    left_out: list[str] = []   # roles of a pipeline that recorded no compute_s at all
    first = "first" if settle_steps == 1 else f"first {settle_steps}"   # the steps left out
    for gen, d in sorted(devices.items()):
        everyone = range(len(d.classes))
        begun = history.begun(gen)
        judge = [s for s in sorted(begun) if s >= min(begun) + settle_steps
                 and set(everyone) <= history.ended_by(gen, s)] if begun else []
        if not judge:
            skipped.append(gen)
            continue
        roles: dict[str, list[int]] = {}
        for r in everyone:
            roles.setdefault(history.role(gen, r), []).append(r)
        needed = TIMINGS if len(roles) == 1 else {"compute_s"}
        for role, ranks in roles.items():
            lacking = {r: n for r in ranks if (n := sum(
                not needed <= steps.get((gen, s, r), _Step()).keys for s in judge))}
            if len(roles) > 1 and all(n == len(judge) for n in lacking.values()) and \
                    len(lacking) == len(ranks):
                left_out.append(f"generation {gen}'s {role} ranks recorded no compute_s, not "
                                "judged")
                continue
            if lacking:
                untimed.append((gen, f"generation {gen}: " + ", ".join(
                    f"rank {r} ({d.classes[r]}) recorded no {'= and '.join(sorted(needed))}= in {n}"
                    for r, n in lacking.items()) + f" of the {len(judge)} steps judged (steps "
                    f"{judge[0]}-{judge[-1]}: those after the generation's {first} that every "
                    "rank ended)"))
                continue
            medians = {r: median(steps[(gen, s, r)].compute for s in judge) for r in ranks}
            short = {r: t for r, t in medians.items()
                     if d.period_s is not None and t < MIN_PERIODS * d.period_s}
            if short:
                too_short.append((gen, f"generation {gen}: " + ", ".join(
                    f"rank {r} ({d.classes[r]}) computed a median {t * 1000:.1f} ms a step"
                    for r, t in short.items())))
                continue
            failed = _judge(gen, d, ranks, judge, steps, max_idle,
                            f" ({role})" if len(roles) > 1 else "", judged)
            if failed is not None:
                return failed
    if too_short:
        return Verdict.unknown(
            CHECK, "; ".join(why for _, why in too_short) + f": under {MIN_PERIODS} quota "
            f"periods of a cgroup cap ({(devices[too_short[0][0]].period_s or 0) * 1000:g} ms "
            "each), which then pauses a rank now and then instead of slowing it, so its class "
            "was not made real; make each step compute longer (a bigger batch or model)",
            generation=too_short[0][0])
    if untimed:
        return Verdict.unknown(
            CHECK, "; ".join(why for _, why in untimed) + ": a rank without timings may be "
            "the one idling; record, each step, on every rank, s.record(compute_s=seconds "
            "computing, wait_s=seconds waiting at the collectives)",
            generation=untimed[0][0])
    if not judged:
        why = "; ".join(left_out) if left_out else (
            f"no generation of the device mix (generations {', '.join(map(str, skipped))}) had "
            f"a step after its {first} that every rank ended")
        return Verdict.unknown(CHECK, f"{why}: nothing to judge balance on")
    return Verdict.passed(CHECK, "; ".join(judged + left_out) + "".join(
        f"; generation {g}: no step after its {first} that every rank ended, not judged"
        for g in skipped))


def _judge(gen: int, d: Devices, ranks: list[int], judge: list[int],
           steps: dict[tuple[int, int, int], _Step], max_idle: float, role: str,
           judged: list[str]) -> Verdict | None:
    """One group of ranks that share their collectives: the failure, or None (and the group's
    line added to ``judged``)."""
    per = {r: [steps[(gen, s, r)] for s in judge] for r in ranks}
    compute = {r: sum(x.compute for x in per[r]) for r in ranks}
    jitter = ""
    if role:   # a pipeline's role: over the steps, waiting for the slowest peer's computing
        wait = {r: max(compute.values()) - compute[r] for r in ranks}
        spent = {r: compute[r] + wait[r] for r in ranks}
        spans = sum(max(per[q][i].compute for q in ranks) for i in range(len(judge)))
        if spans > 0 and (spans - max(compute.values())) / spans >= 0.005:
            jitter = (f"; step-to-step jitter, which no split removes, idled them another "
                      f"{(spans - max(compute.values())) / spans:.0%}")
    else:   # each step the last to arrive waits only for the transfer itself, which all pay
        floor = [min(per[q][i].wait for q in ranks) for i in range(len(judge))]
        wait = {r: sum(x.wait - floor[i] for i, x in enumerate(per[r])) for r in ranks}
        spent = {r: compute[r] + sum(x.wait for x in per[r]) for r in ranks}
    samples = {r: sum(x.samples for x in per[r]) for r in ranks}
    total = sum(samples.values()) or 1

    def who(rank: int) -> str:
        return f"rank {rank} ({d.classes[rank]}, {samples[rank] / total:.0%} of the samples)"
    idle = {r: wait[r] / spent[r] if spent[r] > 0 else 0.0 for r in ranks}
    worst, slowest = max(idle, key=lambda r: idle[r]), min(idle, key=lambda r: idle[r])
    if idle[worst] > max_idle:
        return Verdict.failed(
            CHECK, f"generation {gen}{role}, steps {judge[0]}-{judge[-1]}: {who(worst)} idled "
            f"{idle[worst]:.0%} of its steps waiting at the collectives for {who(slowest)}, "
            f"above the {max_idle:.0%} a balanced world allows: the shares are not in proportion to the ranks' speeds "
            f"({', '.join(f'{c} {s:g}' for c, s in dict(zip(d.classes, d.speeds)).items())})"
            + jitter, rank=worst, generation=gen)
    judged.append(f"generation {gen}{role}, steps {judge[0]}-{judge[-1]}: at most "
                  f"{idle[worst]:.0%} idle ({', '.join(who(r) for r in ranks)})" + jitter)
    return None


@register(CHECK, column="bal", assertion="assert_balanced",
          applies=lambda ctx: bool(ctx.scenario is not None and ctx.scenario.devices),
          when="the scenario is a heterogeneous world (devices=)",
          description="no rank idled more than max_idle (10%) of its steps waiting for a slower "
                      "one")
def _check(ctx: CheckContext) -> Verdict:
    if ctx.scenario is None:
        return balance(ctx.history)
    return balance(ctx.history, max_idle=ctx.scenario.max_idle,
                   settle_steps=ctx.scenario.settle_steps)
