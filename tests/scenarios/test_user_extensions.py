"""A user's own fault kind and checker, declared in a conftest as the user guide shows, end to end:
the fault fires inside the rank at its point, the supervisor treats it as its declaration says,
and the checker shows in the verdict table, verdict.json, report.html and assert_ok()."""
import json

import pytest

from pytest_reshard import chaos
from pytest_reshard.schedule import ScheduleError

from ..conftest import WORKLOADS

CONFTEST = '''
import os
import signal

from pytest_reshard import checkers
from pytest_reshard.schedule.kinds import Ending, FaultKind, register
from pytest_reshard.verdict import Verdict


def oom_kill(run, fault):
    """The kernel's OOM killer takes the rank: a note for the record, then SIGKILL."""
    run.note("oom_kill", step=fault["step"])
    os.kill(os.getpid(), signal.SIGKILL)


register(FaultKind("oom_kill", execute=oom_kill, ending=Ending.DEATH, label="OOM kill"))


@checkers.register("oom_recovered", column="oom")
def oom_recovered(ctx):
    """Every OOM kill was followed by a generation that committed the last step."""
    h = ctx.history
    notes = [e for e in h.rank_events("note") if e.get("what") == "oom_kill"]
    if not notes:
        return Verdict.unknown("oom_recovered", "no OOM kill fired")
    last = h.final_generation
    if last is None or h.scenario.steps - 1 not in h.committed(last.gen):
        return Verdict.failed("oom_recovered", "the run never committed its last step")
    return Verdict.passed("oom_recovered", f"{len(notes)} OOM kill(s), then the run finished "
                          f"in generation {last.gen}")
'''


def test_a_fault_kind_and_a_checker_declared_in_a_conftest_work_end_to_end(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_user=f"""
        import pytest
        from pytest_reshard import chaos

        @pytest.mark.reshard(world_size=3, steps=8, timeout=120)
        def test_oom(reshard_run):
            result = reshard_run({str(WORKLOADS / "toy_train.py")!r}, args=["--ckpt-every", "2"],
                                 faults=[chaos.fault("oom_kill", rank=1, at_step=4,
                                                     phase="backward")])
            result.assert_ok()
            result.assert_oom_recovered()
    """)
    result = pytester.runpytest_subprocess("--reshard-artifacts=art", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["scenario*faults*oom*", "test_oom*oom_kill(rank:1) at step 4*"])
    run_dir = pytester.path / "art" / "test_user.py__test_oom"
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["checks"]["oom_recovered"]["status"] == "pass", verdict["checks"]
    # The executor ran in the rank at its point, and the supervisor treated it as a death.
    events = [json.loads(line) for line in (run_dir / "events" / "g0-r1.jsonl").read_text().splitlines()]
    fired = [e for e in events if e["ev"] == "fault"]
    assert [(e["kind"], e["step"], e["phase"]) for e in fired] == [("oom_kill", 4, "backward")]
    assert any(e["ev"] == "note" and e.get("what") == "oom_kill" for e in events)
    supervisor = [json.loads(line) for line in
                  (run_dir / "events" / "supervisor.jsonl").read_text().splitlines()]
    died = [e for e in supervisor if e["ev"] == "detect"]
    assert died and died[0]["kind"] == "died" and died[0]["rank"] == 1 and died[0]["expected"]
    assert [e["cause"] for e in supervisor if e["ev"] == "gen_end"] == ["failure", "complete"]
    page = (run_dir / "report.html").read_text()
    assert "oom_recovered" in page and "OOM kill" in page


def test_a_registered_workload_brings_its_phases_roles_and_preloads(tmp_path):
    from pytest_reshard import workloads
    from pytest_reshard.session import Session, scenario_from

    script = WORKLOADS / "toy_train.py"
    with pytest.raises(ScheduleError, match="unknown phase 'eval'"):
        scenario_from(str(script), world_size=2, steps=4,
                      faults=[chaos.kill(rank=0, at_step=1, phase="eval")])
    spec = workloads.register(workloads.WorkloadSpec(
        "toy_with_eval", script=str(script), phases=("eval",), preload=("json",),
        roles=lambda n: ["learner"] * n), replace=True)
    try:
        assert workloads.resolve(str(script)) is spec   # the file's spec, by path too
        assert spec.preloads()[-1] == "json"
        sc = scenario_from("toy_with_eval", world_size=2, steps=4, args=["--steps", "4"],
                           faults=[chaos.shift_shards(to_world_size=1, at_step=1)])
        assert sc.phases == ["eval"] and sc.initial_roles() == ["learner", "learner"]
        with Session(tmp_path) as session:
            result = session.run(sc, "by-name")
        result.assert_ok()
        assert [g.roles for g in result.history.generations.values()] == \
            [("learner", "learner"), ("learner",)]
    finally:
        workloads.unregister("toy_with_eval")
