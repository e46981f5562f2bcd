"""``pytest-reshard judge DIR``: the checkers on a production job's record-mode recording.

The history comes from ``history.recorded`` (generations derived from the processes' start
events, how each ended from their own events). The checkers run as on a harness run, through
the same registry, with two differences that come from what production lacks:

- There is no clean reference run. The checks that compare with one (``NEEDS_REFERENCE``) say
  ``unknown``, with what they saw without it, unless ``reference=`` names another recording of
  the same job run without failures (same script, seed, data and world size); it then stands
  for the clean run at its own topology, and a topology it did not run at is ``unknown``. A
  reference stands for a clean run only when it is one: undamaged, one generation, no step begun
  twice, ended complete (``reference_refusal``). Any other would let a run with the same bug pass
  against it, so the checks that need it say ``unknown``, naming the reference and why.
- There is no fault schedule: liveness judges whether the job finished (every rank of the last
  generation closed, at the step count the job declared in ``RESHARD_STEPS`` when it did), not
  whether each failure was planned. Earlier generations' failures are the job's real crashes;
  what they cost is for ``no_rewind`` and the others to judge.

The verdicts, ``verdict.json`` and ``report.html`` are the harness's own (``Result``,
``reports``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from pytest_reshard import checkers
from pytest_reshard.contract import Cause
from pytest_reshard.history import History
from pytest_reshard.history.recorded import load_recorded
from pytest_reshard.result import Result
from pytest_reshard.supervisor import Scenario
from pytest_reshard.verdict import PASS, UNKNOWN, Verdict

__all__ = ["NEEDS_REFERENCE", "ReferenceMissing", "judge", "judge_history", "reference_refusal"]

#: The checks that compare with a clean run, which a production recording does not have.
NEEDS_REFERENCE = ("loss_continuity", "exactly_once_samples")


class ReferenceMissing(LookupError):
    """The reference recording cannot stand for the clean run a checker asked for."""


def reference_refusal(reference: History, folder: Path) -> str | None:
    """Why the recording in ``folder`` cannot stand for a clean run (None: it can). A clean run
    is one launch that ran every step once and closed on every rank: a reference that crashed,
    restarted or replayed steps may share the bug being judged, and comparing with it would pass
    that bug."""
    gens = reference.generations
    if reference.damaged:
        d = reference.damaged[0]
        why = f"its history is damaged at {d.file}:{d.line} ({d.why})"
    elif len(gens) != 1:
        why = (f"it ran {len(gens)} generations (its processes were started again: a restart or a "
               "resubmission), and a clean run is one launch" if gens else
               "it recorded no generation")
    else:
        g = next(iter(gens.values()))
        again = reference.begun_again(g.gen)
        if g.cause != Cause.COMPLETE:
            why = f"its generation {g.gen} ended by {g.cause}, not complete: {g.detail}"
        elif again:
            rank, step = again[0]
            why = (f"rank {rank} began step {step} more than once in it (a retried or replayed "
                   "step)")
        else:
            return None
    return (f"the reference recording {folder} cannot stand for a clean run: {why}; record the "
            "job once more without failures (one launch, every rank closing) and pass that folder")


def _reference_runs(reference: History, folder: Path, refused: str | None) -> checkers.ReferenceRuns:
    gens = reference.generations
    roles = list(gens[min(gens)].roles) if gens else []

    def at(asked: Sequence[str]) -> History:
        if refused is not None:
            raise ReferenceMissing(refused)
        if list(asked) != roles:
            raise ReferenceMissing(
                f"the reference recording {folder} ran at {len(roles)} ranks ({', '.join(roles)}), "
                f"and this check needs a clean run at {len(asked)} ranks "
                f"({', '.join(asked)}); record a clean run at that size too")
        return reference
    return at


def judge_history(history: History, reference: History | None = None,
                  reference_dir: Path | None = None) -> dict[str, Verdict]:
    """Every registered checker that applies to the recorded ``history``, by name, with the
    production rules of the module docstring."""
    folder = reference_dir or Path("reference")
    refused = reference_refusal(reference, folder) if reference is not None else None
    runs = _reference_runs(reference, folder, refused) if reference is not None else None
    ctx = checkers.CheckContext(history, None, reference_runs=runs)
    verdicts = checkers.run_all(ctx)
    return {name: _production(name, v, history, reference, refused)
            for name, v in verdicts.items()}


def _production(name: str, v: Verdict, history: History, reference: History | None,
                refused: str | None) -> Verdict:
    """``v`` as a production recording can support it."""
    if history.damaged:
        return v   # not judged, naming the damage (the registry's own words)
    if name in NEEDS_REFERENCE and refused is not None:
        # whatever the check made of the refused reference: it cannot stand for a clean run
        saw = f"; against it the check said: {v.status}: {v.message}" if v.status != UNKNOWN \
            and v.details.get("exception") is None else ""
        return Verdict.unknown(name, refused + saw, step=v.step, rank=v.rank,
                               generation=v.generation,
                               details={**v.details, "reference": "refused",
                                        "with_refused_reference": v.status})
    if v.details.get("exception") == ReferenceMissing.__name__:
        return Verdict.unknown(name, str(v.details.get("error")),
                               details={"reference": "refused" if refused else
                                        "missing at this topology"})
    if name in NEEDS_REFERENCE and reference is None:
        saw = f"; without one it saw: {v.status}: {v.message}" if v.status != UNKNOWN else ""
        return Verdict.unknown(
            name, "a production recording has no clean reference run to compare with: pass "
            "--reference DIR, a recording of the same job (script, seed, data, world size) run "
            f"without failures{saw}",
            step=v.step, rank=v.rank, generation=v.generation,
            details={**v.details, "without_reference": v.status})
    if name == "liveness":
        return _liveness(v, history)
    return v


def _liveness(v: Verdict, history: History) -> Verdict:
    final = history.final_generation
    if final is None:
        return v
    if v.status == UNKNOWN and history.scenario is None:
        return Verdict.unknown(
            "liveness", f"whether the job finished cannot be told: its last generation "
            f"({final.gen}) {final.detail or 'did not close on every rank'}, and it declared no "
            "step count (set RESHARD_STEPS in the job's environment); nothing else went wrong "
            "that the recording shows", generation=final.gen, details=v.details)
    if v.status != PASS:
        return v
    failed = [g for g in history.generations.values() if g.cause == Cause.FAILURE]
    restarts = (f"; {len(failed)} earlier generation{'s' * (len(failed) != 1)} ended without a "
                f"clean exit and the launcher started the next one" if failed else "")
    target = history.target_step()
    return dataclasses.replace(v, message=f"the job committed step {target} in its last "
                               f"generation ({final.gen}) and every rank of it closed "
                               f"(run.close()){restarts}")


def _scenario(history: History, folder: Path) -> Scenario:
    """What the report's header shows for a recording: the job as its processes described it."""
    gens = history.generations
    first = gens[min(gens)] if gens else None
    sc = history.scenario
    return Scenario(workload=sc.workload if sc else "recorded job",
                    world_size=first.world_size if first else 0,
                    steps=sc.steps if sc else 0,
                    launcher=(first.launcher or "recorded") if first else "recorded",
                    roles=list(first.roles) if first and first.roles else None)


def judge(folder: str | Path, *, reference: str | Path | None = None,
          out: str | Path | None = None, html: bool = True) -> Result:
    """Judge the recording in ``folder``: the verdicts, ``verdict.json`` (and ``report.html``
    unless ``html=False``) written into ``out`` (default: ``folder``). Raises
    ``HistoryError`` when a folder holds no recording."""
    root = Path(folder).resolve()
    history = load_recorded(root)
    ref_dir = Path(reference).resolve() if reference is not None else None
    ref = load_recorded(ref_dir) if ref_dir is not None else None
    verdicts = judge_history(history, ref, ref_dir)
    target = Path(out).resolve() if out is not None else root
    target.mkdir(parents=True, exist_ok=True)
    command = "pytest-reshard judge " + str(root) + (f" --reference {ref_dir}" if ref_dir else "")
    verdicts = {k: dataclasses.replace(v, replay=command) for k, v in verdicts.items()}
    result = Result(name=f"judge {root.name}", scenario=_scenario(history, root), run_dir=target,
                    history=history, verdicts=verdicts, wall_s=None, replay=command)
    result.save()
    if html:
        from pytest_reshard.reports import html as html_report

        result.report = html_report.write(result, ref).page
    return result


def summary(result: Result) -> dict[str, Any]:
    """What ``--json`` prints: verdict.json's content."""
    return {"name": result.name, "status": result.verdict.status, "folder": str(result.run_dir),
            "report": str(result.report) if result.report else None,
            "generations": [{"gen": g.gen, "world_size": g.world_size, "cause": g.cause,
                             "planned": g.planned, "detail": g.detail,
                             "resume_step": g.resume_step}
                            for g in result.history.generations.values()],
            "checks": {k: v.to_dict() for k, v in result.verdicts.items()}}
