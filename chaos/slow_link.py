"""``slow_link``: one node's link gets slow, lossy or late; nothing fails outright."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import positive, target_of
from pytest_reshard.chaos._link import Change, apply, link_or_refuse, needs_namespaced_nodes
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def slow_link(*, rank: int, at_step: int, phase: str = "backward",
              rate_mbit: float | None = None, loss: float | None = None,
              delay_ms: float | None = None, jitter_ms: float = 0.0,
              duration_s: float | None = None) -> Fault:
    """At the fault point the link of the node that hosts ``rank`` degrades, for
    ``duration_s`` seconds or to the end of the run (needs ``launcher="elastic"`` with
    ``nodes >= 2`` on namespaced nodes, as root): what it sends is capped at ``rate_mbit``
    megabits per second, a fraction ``loss`` of its packets (sent and received) is dropped at
    random, and, where the kernel has ``sch_netem``, what it sends is delayed by ``delay_ms``
    (+/- ``jitter_ms``).

    Layer: the node's own link, in its network namespace: a ``tc`` token bucket (``tbf``) for
    the rate, ``iptables``' ``statistic`` match for the loss (TCP retransmits what is lost, so
    a collective slows rather than fails), ``tc netem`` for the delay. Judged by every checker
    as usual: a slow link must change no verdict, and the ``throughput`` verdict reports the
    drop against the clean run (fail it with ``min_throughput=``). Does not model a flapping
    link, asymmetric routes, congestion from other jobs, or the slow collectives of a real
    fabric (NCCL over InfiniBand is not TCP); a delay needs ``sch_netem``: where the kernel
    lacks it the fault fails at its point rather than running without the delay, and
    ``liveness`` says it could not be injected, with ``tc``'s reason.
    """
    if rate_mbit is None and loss is None and delay_ms is None:
        raise ScheduleError("slow_link needs rate_mbit=, loss= or delay_ms=")
    params: dict[str, Any] = {}
    if rate_mbit is not None:
        params["rate_mbit"] = positive("rate_mbit", rate_mbit)
    if loss is not None:
        if not 0 < loss < 1:
            raise ScheduleError(f"slow_link loss is a fraction in (0, 1), got {loss!r}")
        params["loss"] = float(loss)
    if delay_ms is not None:
        params["delay_ms"] = positive("delay_ms", delay_ms)
        if jitter_ms < 0:
            raise ScheduleError(f"slow_link jitter_ms must be >= 0, got {jitter_ms!r}")
        params["jitter_ms"] = float(jitter_ms)
    if duration_s is not None:
        params["duration_s"] = positive("duration_s", duration_s)
    return Fault("slow_link", target_of(rank, None, None, "one"), at_step, phase, params)


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    p = fault["params"]
    dev = link_or_refuse("slow_link", "tc")
    changes: list[Change] = []
    root = ["tc", "qdisc", "del", "dev", dev, "root"]
    if "delay_ms" in p:   # netem delays, and caps the rate itself
        netem = ["delay", f"{p['delay_ms']}ms", f"{p['jitter_ms']}ms"]
        if "rate_mbit" in p:
            netem += ["rate", f"{p['rate_mbit']}mbit"]
        changes.append((["tc", "qdisc", "add", "dev", dev, "root", "netem", *netem], root))
    elif "rate_mbit" in p:
        changes.append((["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                         f"{p['rate_mbit']}mbit", "burst", "32kbit", "latency", "400ms"], root))
    if "loss" in p:
        link_or_refuse("slow_link", "iptables")
        for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
            rule = [chain, flag, dev, "-m", "statistic", "--mode", "random", "--probability",
                    str(p["loss"]), "-j", "DROP"]
            changes.append((["iptables", "-I", *rule], ["iptables", "-D", *rule]))
    apply(run, fault, changes)


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    """A rate cap or a loss slow enough to show, not so slow a step outlasts ``stall_s``."""
    from hypothesis import strategies as st

    rank, at = draw(st.integers(0, ctx.world_size - 1)), dict(at_step=ctx.step, phase=ctx.phase)
    if draw(st.booleans()):
        return slow_link(rank=rank, rate_mbit=draw(st.sampled_from([16.0, 64.0])), **at)
    return slow_link(rank=rank, loss=draw(st.sampled_from([0.01, 0.05])), **at)


register(FaultKind("slow_link", execute=execute, draw=_draw,
                   requires=needs_namespaced_nodes("slow_link"),
                   label="slow link", doc=slow_link.__doc__ or ""))
