"""balance: in a heterogeneous world, no rank sits idle waiting for a slower one.

Each rank records per step how long it computed (``compute_s``) and how long it waited at the
step's collectives for the others (``wait_s``), and its samples. When the shares of the work are
in proportion to each rank's speed, every rank computes about as long as the slowest and nobody
waits; an uneven split (even shares on mixed devices, a share computed from an old device map)
shows as one rank idling a large part of every step.
"""
from __future__ import annotations

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import Devices, History
from pytest_reshard.verdict import Verdict

CHECK = "balance"
#: The largest part of its steps a rank may idle at the collectives in a balanced world.
MAX_IDLE = 0.10


def balance(history: History, *, max_idle: float = MAX_IDLE) -> Verdict:
    """Every rank of each heterogeneous generation idled at most ``max_idle`` of its step time
    (``wait_s / (compute_s + wait_s)``, summed over the generation's steps after its first,
    which pays for warm-up and, in a workload that measures its ranks' speeds, for the
    measuring). A failure names the idlest rank, its class and its share of the samples."""
    devices = history.devices()
    if not devices:
        return Verdict.unknown(CHECK, "not a heterogeneous world: pass devices= to judge balance")
    stretched = sorted(g for g, d in devices.items() if d.mode != "cgroup")
    if stretched:   # the class's slowness comes after the step's body: compute_s cannot show it
        return Verdict.unknown(CHECK, f"generation {stretched[0]}'s devices were stretched, not "
                               "capped: a rank's own compute time does not show its class, so "
                               "shares measured from it cannot be judged (throttle='cgroup', "
                               "as root, caps them)")
    per: dict[int, dict[int, list[float]]] = {}   # gen -> rank -> [compute, wait, samples]
    first: dict[int, int] = {}
    for occ, e in history.records():
        if occ.gen in devices and "compute_s" in e and "wait_s" in e:
            first[occ.gen] = min(first.get(occ.gen, occ.step), occ.step)
    for occ, e in history.records():
        if occ.gen not in first or occ.step == first[occ.gen]:
            continue
        row = per.setdefault(occ.gen, {}).setdefault(int(e["rank"]), [0.0, 0.0, 0.0])
        row[0] += float(e.get("compute_s") or 0.0)
        row[1] += float(e.get("wait_s") or 0.0)
        row[2] += len(e.get("samples") or ())
    if not per:
        return Verdict.unknown(CHECK, "no rank recorded compute_s= and wait_s= in a step after "
                               "its generation's first: record, each step, the seconds it "
                               "computed and the seconds it waited at the collectives")
    judged = []
    for gen, ranks in sorted(per.items()):
        d, total = devices[gen], sum(r[2] for r in ranks.values()) or 1.0

        def who(rank: int, d: Devices = d, ranks: dict[int, list[float]] = ranks,
                total: float = total) -> str:
            return (f"rank {rank} ({d.classes[rank] if rank < len(d.classes) else '?'}, "
                    f"{ranks[rank][2] / total:.0%} of the samples)")
        idle = {r: (w / (c + w) if c + w > 0 else 0.0) for r, (c, w, _) in ranks.items()}
        worst, slowest = max(idle, key=lambda r: idle[r]), min(idle, key=lambda r: idle[r])
        if idle[worst] > max_idle:
            return Verdict.failed(
                CHECK, f"generation {gen}: {who(worst)} idled {idle[worst]:.0%} of its steps "
                f"waiting at the collectives for {who(slowest)}, above the {max_idle:.0%} a "
                f"balanced world allows: the shares are not in proportion to the ranks' speeds "
                f"({', '.join(f'{c} {s:g}' for c, s in dict(zip(d.classes, d.speeds)).items())})",
                rank=worst, generation=gen)
        judged.append(f"generation {gen}: at most {idle[worst]:.0%} idle ("
                      + ", ".join(who(r) for r in sorted(ranks)) + ")")
    return Verdict.passed(CHECK, "; ".join(judged))


@register(CHECK, column="bal", assertion="assert_balanced",
          applies=lambda ctx: bool(ctx.scenario is not None and ctx.scenario.devices),
          when="the scenario is a heterogeneous world (devices=)",
          description="no rank idled more than max_idle (10%) of its steps waiting for a slower "
                      "one")
def _check(ctx: CheckContext) -> Verdict:
    return balance(ctx.history, max_idle=ctx.scenario.max_idle if ctx.scenario else MAX_IDLE)
