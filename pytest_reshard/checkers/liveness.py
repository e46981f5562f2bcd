"""liveness: the run finished, and nothing died, hung or went silent unexplained.

The final generation committed the last step; every death, stop or stall is explained by a
scheduled fault; every scheduled fault fired; every rank started.
"""
from __future__ import annotations

from typing import Any

from pytest_reshard.checkers._text import _summarise
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import Detection, History
from pytest_reshard.verdict import Verdict


def _describe_detection(d: Detection) -> str:
    at = (f"at step {d.step}, phase {d.phase}" if d.step is not None and d.phase
          else f"at step {d.step}" if d.step is not None else "before its first step")
    who = f"rank {d.rank}" if d.rank is not None else "a rank"
    code = ""
    if d.exit_code is not None:
        code = (f" (killed by signal {-d.exit_code})" if d.exit_code < 0
                else f" (exit code {d.exit_code})")
    what = {
        "died": f"{who} died{code} {at}",
        "stopped": f"{who} stopped responding {at}",
        "stalled": f"{who} stalled {at}: alive, but no progress",
        "exited_early": f"{who} exited early{code} {at}, before the run finished",
        "oom": d.detail or f"{who} exceeded its memory budget {at}",
    }.get(d.kind, f"{who} {d.kind} {at}")
    return (f"{what} (generation {d.gen}), and no scheduled fault explains it; read that rank's "
            "output in the run folder")


def liveness(history: History) -> Verdict:
    """The run reached its last step, and nothing died, hung or went silent unexplained."""
    check, replay = "liveness", history.replay
    final = history.final_generation
    if final is None:
        return Verdict.unknown(check, "the history has no generation: no rank recorded anything",
                               replay=replay)
    problems: list[dict[str, Any]] = []
    for d in history.detections():
        if not d.expected:
            problems.append({"message": _describe_detection(d), "step": d.step, "rank": d.rank,
                             "generation": d.gen, "fault": None})
    fired_ranks: set[tuple[int, int | None]] = {(f.gen, f.rank) for f in history.faults_fired()}
    fired_ranks |= {(d.gen, d.rank) for d in history.detections() if d.expected}
    for g, gen in history.generations.items():
        starts = history.starts(g)
        anyone_ended = bool(history.ended(g))
        for r in range(gen.world_size):
            if r not in starts and (anyone_ended or gen.cause in (None, "complete", "reshard",
                                                                  "preempt")):
                problems.append({"message": f"rank {r} of generation {g} never recorded a start: it "
                                 "died before probe.attach() or was never launched",
                                 "step": None, "rank": r, "generation": g, "fault": None})
    ended_by: dict[int, int] = {}
    for s in history.ended(final.gen):
        for r in history.ended_by(final.gen, s):
            ended_by[r] = max(ended_by.get(r, -1), s)
    if ended_by:
        for r in range(final.world_size):
            if r in ended_by or (final.gen, r) in fired_ranks or r not in history.starts(final.gen):
                continue
            others = ", ".join(str(x) for x in sorted(ended_by))
            errors = history.rank_events("error", gen=final.gen, rank=r)
            last = (f"; its last error: {errors[-1].get('error')} at step {errors[-1]['step']}"
                    if errors else "")
            role = history.role(final.gen, r)
            problems.append({"message": f"rank {r} (role {role or '?'}) of generation {final.gen} "
                             f"finished no step while ranks {others} finished up to step "
                             f"{max(ended_by.values())}: it died silently or sits idle{last}",
                             "step": None, "rank": r, "generation": final.gen, "fault": None})
    for u in history.unfired():
        fid = u.get("fault_id")
        fault = history.scenario.fault(fid) if history.scenario else None
        desc = history.describe_fault(fid) or "a scheduled fault"
        phase = fault.get("phase") if fault else None
        if phase in ("begin", "end") or phase is None:
            why = "the run never reached that step"
        else:
            why = (f"the workload never reached that point; does it call "
                   f"s.point({phase!r})?")
        detail = str(u.get("detail") or "")
        extra = f" ({detail})" if detail and detail not in desc else ""
        problems.append({"message": f"fault {desc} never fired: {why}{extra}",
                         "step": fault.get("step") if fault else None, "rank": None,
                         "generation": None, "fault": desc})
    for e in history.events:
        if e["ev"] == "abort":
            problems.append({"message": f"the supervisor {e.get('detail', 'aborted the run')}",
                             "step": None, "rank": None, "generation": None, "fault": None})
    for g, gen in history.generations.items():
        if gen.cause == "timeout":
            problems.append({"message": f"the run hit its timeout in generation {g}"
                             f"{': ' + gen.detail if gen.detail else ''}; raise timeout= if the "
                             "workload is only slow, else look for a hang", "step": None,
                             "rank": None, "generation": g, "fault": None})
    scenario = history.scenario
    target = scenario.steps - 1 if scenario else None
    committed = history.committed(final.gen)
    carried = (final.resume_step is not None and target is not None and final.resume_step > target
               and any(o.step == target for o in history.kept()))  # done before, resumed past it
    if target is not None and target >= 0 and target not in committed and not carried:
        reached = (f"last committed step {max(committed)}" if committed else "no step committed")
        how = (f"; generation {final.gen} ended by {final.cause}"
               f"{': ' + final.detail if final.detail else ''}" if final.cause else "")
        problems.append({"message": f"the run did not reach its target: step {target} never "
                         f"committed in the final generation {final.gen} ({reached}){how}",
                         "step": target, "rank": None, "generation": final.gen,
                         "fault": history.describe_fault(final.fault_id)})
    details = {"problems": [p["message"] for p in problems], "target": target,
               "detections": len(history.detections())}
    if problems:
        first = problems[0]
        return Verdict.failed(check, _summarise([p["message"] for p in problems]),
                              step=first["step"], rank=first["rank"],
                              generation=first["generation"], fault=first["fault"],
                              details=details, replay=replay)
    if target is None:
        return Verdict.unknown(check, "no scenario record, so the target step is unknown; nothing "
                               "else went wrong", details=details, replay=replay)
    return Verdict.passed(check, f"reached step {target} in generation {final.gen}; "
                          f"{len(history.detections())} detections, all explained by scheduled "
                          "faults; every scheduled fault fired", details=details, replay=replay)


@register("liveness", column="live", assertion="assert_live",
          description="the run finished; no rank died, stopped or vanished without a scheduled "
                      "fault; every scheduled fault fired")
def _check(ctx: CheckContext) -> Verdict:
    return liveness(ctx.history)
