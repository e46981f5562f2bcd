"""throughput: tokens/s per generation and role, and every rank of a role doing its share.

Rates are judged against a clean run of the same topology, failing only below a declared
fraction (short rates on a shared CPU swing too much to guess one), per CPU other processes left
to the run; and every rank of a role must do its share, so a pool that silently shrank fails
without any reference.
"""
from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History
from pytest_reshard.verdict import Verdict


class RoleRate(NamedTuple):
    """What one role did in one generation, over its steady steps (all but the first)."""

    tokens: float
    seconds: float               # wall time, scaled to the share of the machine left to the run
    steps: int
    wait: float                  # share of the ranks' time spent waiting on the other role
    queue: float | None          # mean queue depth the role recorded (producers), if any

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def role_rate(history: History, gen: int, role: str) -> RoleRate | None:
    """Tokens/s of ``role`` in ``gen``: tokens of the committed steps after the first one, over
    the time from the first one's end to the last's on the role's ranks (a producer that ran
    ahead into steps nobody consumed does not count them). None below 3 committed steps."""
    g = history.generations.get(gen)
    if g is None:
        return None
    ranks = {r for r, name in enumerate(g.roles) if name == role}
    steps = sorted(history.committed(gen))
    if len(steps) < 3 or not ranks:
        return None
    ends = {s: max(t for r, t in history.end_times(gen, s).items() if r in ranks) for s in steps}
    tokens = waited = 0.0
    depths = [d for s in steps for r, d in history.metric(gen, s, "queue").items() if r in ranks]
    for s in steps:
        if s != steps[0]:
            tokens += sum(n for r, n in history.metric(gen, s, "tokens").items() if r in ranks)
            waited += sum(w for r, w in history.metric(gen, s, "wait_s").items() if r in ranks)
    wall = ends[steps[-1]] - ends[steps[0]]
    seconds = wall * _share_left(history, gen, steps[1:], wall)
    return RoleRate(tokens, seconds, len(steps), min(1.0, waited / (wall * len(ranks)))
                    if wall > 0 else 0.0, sum(depths) / len(depths) if depths else None)


def role_work(history: History, gen: int, role: str) -> dict[int, float]:
    """rank -> tokens each rank of ``role`` processed over ``gen``'s committed steps."""
    g = history.generations.get(gen)
    if g is None:
        return {}
    ranks = {r for r, name in enumerate(g.roles) if name == role}
    steps = history.committed(gen)
    if not steps or not ranks:
        return {}
    work = {r: 0.0 for r in ranks}
    for s in steps:
        for r, n in history.metric(gen, s, "tokens").items():
            if r in work:
                work[r] += n
    return work


def _share_left(history: History, gen: int, steps: list[int], wall: float) -> float:
    """The share of the machine's CPUs other processes left to the run during ``steps`` (1.0
    when the workload did not record ``cpu_s``/``busy_s``/``cpus``): a CPU-bound run on a shared
    runner gets only that, so its rate is judged per CPU it could have used."""
    ours = sum(c for s in steps for c in history.metric(gen, s, "cpu_s").values())
    busy_by_rank: dict[int, float] = {}
    cpus = 0.0
    for s in steps:
        for r, b in history.metric(gen, s, "busy_s").items():
            busy_by_rank[r] = busy_by_rank.get(r, 0.0) + b
        cpus = max([cpus, *history.metric(gen, s, "cpus").values()])
    if not busy_by_rank or not cpus or wall <= 0:
        return 1.0
    busy = busy_by_rank[min(busy_by_rank)]   # the machine's clock, read by one rank
    foreign = max(0.0, busy - ours)
    return min(1.0, max(0.25, 1 - foreign / (cpus * wall)))


def _topology_name(roles: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for r in roles:
        counts[r] = counts.get(r, 0) + 1
    return " + ".join(f"{n} {r}" for r, n in counts.items())


def _k(rate: float) -> str:
    return f"{rate / 1000:.1f} Ktok/s"


def throughput(history: History, *, references: Mapping[tuple[str, ...], History] | None = None,
               min_fraction: float | None = None, min_share: float = 0.5) -> Verdict:
    """Each generation's tokens/s per role against a fault-free run of the same topology
    (``references``), failing below a declared ``min_fraction`` of it (undeclared: measured and
    reported only, since a rate over a few short steps on a shared CPU runner swings by 2x);
    and, needing no reference and immune to load, every rank of a role doing at least
    ``min_share`` of the role's mean work (of its device class's share, in a device mix), so a
    pool that silently shrank fails (ranks alive and
    idle: drafter GPUs that sat at 0% utilisation while alive, after two of three drafters died
    silently). The message names the bottleneck: the role that waited least on
    the other."""
    check = "throughput"
    if not history.has_tokens():
        return Verdict.unknown(check, "the workload recorded no token counts; call "
                               "s.record(tokens=n) in each step")
    measured: list[str] = []
    failures: list[tuple[int, str, int | None]] = []
    worked = 0  # generations whose ranks' shares of the work were judged
    ref_rates: dict[tuple[tuple[str, ...], str], RoleRate | None] = {}
    devices = history.devices()
    for gen, g in sorted(history.generations.items()):
        rates = {role: rate for role in dict.fromkeys(g.roles)
                 if (rate := role_rate(history, gen, role)) is not None}
        topo = _topology_name(g.roles)
        bottleneck = min(rates, key=lambda role: rates[role].wait) if len(rates) > 1 else None
        waits = ", ".join(f"{role}s waited {r.wait:.0%}"
                          + (f" (mean queue depth {r.queue:.1f})" if r.queue is not None else "")
                          for role, r in rates.items())
        why = (f"; bottleneck: {bottleneck} ({waits} of their time on the other role)"
               if bottleneck else "")
        for role in dict.fromkeys(g.roles):  # needs no rate: one committed step is enough
            work = role_work(history, gen, role)
            if not work:
                continue
            worked += 1
            mean = sum(work.values()) / len(work)
            # in a device mix a rank's share follows its class's speed: a slow class's small
            # share is the balance, not a rank gone idle
            d = devices.get(gen)
            speed = {r: d.speeds[r] for r in work} if d and len(d.speeds) == len(g.roles) else {}
            due = {r: sum(work.values()) * speed[r] / sum(speed.values()) if speed else mean
                   for r in work}
            idle = sorted(rank for rank, n in work.items() if n < min_share * due[rank])
            if idle and len(work) > 1:
                than = (f"their device classes' shares of the {role} work were "
                        f"{', '.join(f'{due[i]:.0f}' for i in idle)}" if speed else
                        f"the {role} ranks averaged {mean:.0f}")
                failures.append((gen, f"generation {gen} ({topo}): {role} rank{'s' if len(idle) > 1 else ''} "
                                 f"{', '.join(map(str, idle))} processed "
                                 f"{', '.join(f'{work[i]:.0f}' for i in idle)} tokens while "
                                 f"{than}: the {role} pool silently shrank "
                                 f"to {len(work) - len(idle)} of {len(work)} working ranks{why}",
                                 idle[0]))
        ref = (references or {}).get(tuple(g.roles))
        for role, r in rates.items():
            if ref is not None and (tuple(g.roles), role) not in ref_rates:   # once per topology
                ref_rates[(tuple(g.roles), role)] = role_rate(ref, min(ref.generations), role) \
                    if ref.generations else None
            ref_rate = ref_rates.get((tuple(g.roles), role))
            if ref_rate is None or ref_rate.rate <= 0:
                measured.append(f"gen {gen} {role} {_k(r.rate)} (no reference)")
                continue
            ratio = r.rate / ref_rate.rate
            measured.append(f"gen {gen} {role} {_k(r.rate)} ({ratio:.0%})")
            if min_fraction is not None and ratio < min_fraction:
                failures.append((gen, f"generation {gen} ({topo}): {role} throughput {_k(r.rate)}, "
                                 f"{ratio:.0%} of the fault-free run's {_k(ref_rate.rate)} at this "
                                 f"topology (declared minimum {min_fraction:.0%}){why}", None))
    details = {"measured": measured}
    if failures:
        gen, text, rank = failures[0]
        if len(failures) > 1:
            text += f" ({len(failures)} findings in all)"
        return Verdict.failed(check, text, rank=rank, generation=gen, details=details)
    if not worked:
        return Verdict.unknown(check, "no generation committed a step")
    bound = (f"every rate at least {min_fraction:.0%} of the clean run's" if min_fraction is not None
             else "no minimum rate declared (min_throughput=)")
    rates_text = "; ".join(measured) or "no generation ran the 3 steps a rate needs"
    return Verdict.passed(check, f"every rank of each role did its share; {bound}: {rates_text}",
                          details=details)


@register("throughput", column="tok/s", assertion="assert_throughput",
          applies=lambda ctx: ctx.history.has_tokens(),
          when="the workload records token counts (s.record(tokens=n) in each step), or opts "
               "into it",
          description="no rank of a role sat idle while the others worked, and no generation ran "
                      "below min_throughput of a clean run's tokens/s")
def _check(ctx: CheckContext) -> Verdict:
    """Against the session's clean run of each topology the run used."""
    history = ctx.history
    references = None
    if ctx.has_references:
        topologies = {tuple(g.roles) for g in history.generations.values() if g.roles}
        references = {t: ctx.reference(t) for t in sorted(topologies)}
    return throughput(history, references=references,
                      min_fraction=ctx.scenario.min_throughput if ctx.scenario else None)
