"""The checker registry: one registration per checker, read by the session (which checkers run),
``Result`` (their ``assert_*`` methods) and the verdict tables (their columns). Unit tests on
hand-built histories, then one pytester run in which a conftest registers its own checkers."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from pytest_reshard import checkers
from pytest_reshard.reports import html as html_report
from pytest_reshard.reports import table
from pytest_reshard.result import CheckerDidNotRun, ReshardAssertionError, Result
from pytest_reshard.schedule import Schedule
from pytest_reshard.supervisor import Scenario
from pytest_reshard.verdict import PASS, Status, Verdict

from ..histories import clean_run, reshard_run

BUILT_IN = ["no_rewind", "loss_continuity", "exactly_once_samples", "state_equivalence",
            "liveness", "poisoned_commit", "sample_ledger", "throughput", "memory_headroom",
            "allocator_fragmentation"]


@contextmanager
def registered(name: str, fn, **options) -> Iterator[checkers.Checker]:
    """Register ``fn`` as ``name`` for the block, then remove it."""
    checkers.register(name, **options)(fn)
    try:
        yield checkers.get(name)
    finally:
        checkers.unregister(name)


def final_loss_below(limit: float):
    def final_loss(ctx: checkers.CheckContext) -> Verdict:
        """The loss at the last kept step is below the limit."""
        losses = ctx.history.kept_losses()
        step = max(losses)
        loss = losses[step][1]
        if loss < limit:
            return Verdict.passed("final_loss", f"loss {loss:.3g} at step {step} < {limit}")
        return Verdict.failed("final_loss", f"loss {loss:.3g} at step {step} >= {limit}", step=step)
    return final_loss


def boom(ctx: checkers.CheckContext) -> Verdict:
    return {}["no such key"]  # type: ignore[no-any-return]


def result_of(history, verdicts=None, **scenario) -> Result:
    sc = Scenario(workload="train.py", world_size=2, steps=20, schedule=Schedule(0), **scenario)
    if verdicts is None:
        verdicts = checkers.run_all(checkers.CheckContext(history, sc))
    return Result(name="t.py::test_x", scenario=sc, run_dir=Path("/art/t"), history=history,
                  verdicts=verdicts, wall_s=1.0, replay="pytest 't.py::test_x'")


# -- registration --------------------------------------------------------------------------------
def test_the_built_ins_are_registered_in_order_each_with_column_and_assertion():
    assert [c.name for c in checkers.registered()][:len(BUILT_IN)] == BUILT_IN
    columns = dict(checkers.columns())
    assert columns["allocator_fragmentation"] == "frag" and columns["no_rewind"] == "rewind"
    assertions = {c.name: c.assertion for c in checkers.registered()}
    assert assertions["loss_continuity"] == "assert_loss_continuous"
    assert assertions["liveness"] == "assert_live"
    assert all(c.description and c.when for c in checkers.registered())


def test_a_duplicate_name_is_refused_unless_replacing():
    with registered("eval_metric", final_loss_below(1.0), column="eval"):
        with pytest.raises(checkers.RegistrationError,
                           match=r"a checker named 'eval_metric' is already registered \(at .*"
                                 r"test_checker_registry.py:\d+\).*replace=True"):
            checkers.register("eval_metric")(final_loss_below(2.0))
        checkers.register("eval_metric", column="eval2", replace=True)(final_loss_below(2.0))
        assert checkers.get("eval_metric").column == "eval2"
        with pytest.raises(checkers.RegistrationError, match="assert_no_rewind already asserts"):
            checkers.register("other", assertion="assert_no_rewind")(boom)
    assert checkers.get("eval_metric") is None
    with pytest.raises(checkers.RegistrationError, match="liveness"):
        checkers.register("liveness")(boom)  # a built-in too


def test_names_that_cannot_make_an_assertion_are_refused():
    with pytest.raises(checkers.RegistrationError, match="Python identifier"):
        checkers.register("eval-metric")(boom)
    with pytest.raises(checkers.RegistrationError, match="assert_ok is Result's own method"):
        checkers.register("ok")(boom)
    with pytest.raises(checkers.RegistrationError, match="must be an identifier starting with assert_"):
        checkers.register("eval", assertion="check_eval")(boom)
    with pytest.raises(LookupError, match="no checker named 'nope'"):
        checkers.unregister("nope")


# -- running -------------------------------------------------------------------------------------
def test_a_raising_checker_is_unknown_naming_the_checker_and_the_exception():
    with registered("boom", boom, column="boom"):
        verdicts = checkers.run_all(checkers.CheckContext(clean_run()))
    v = verdicts["boom"]
    assert v.status == "unknown" and v.check == "boom"
    assert v.message.startswith("checker 'boom' raised KeyError: 'no such key' (at ")
    assert "test_checker_registry.py:" in v.message
    assert "KeyError" in v.details["traceback"]
    assert verdicts["liveness"].status == "pass"  # the others still decided


def test_a_raising_applies_rule_or_a_non_verdict_is_unknown_too():
    def rule(ctx):
        raise RuntimeError("rule broke")

    with registered("ruled", final_loss_below(9.0), applies=rule), \
            registered("sloppy", lambda ctx: "fine"):
        verdicts = checkers.run_all(checkers.CheckContext(clean_run()))
    assert verdicts["ruled"].status == "unknown"
    assert "deciding whether it applies raised RuntimeError: rule broke" in verdicts["ruled"].message
    assert verdicts["sloppy"].status == "unknown" and "returned 'fine', not a Verdict" in \
        verdicts["sloppy"].message


def test_a_clean_run_that_cannot_start_is_asked_for_once_and_named():
    calls = []

    def reference(roles):
        calls.append(list(roles))
        raise RuntimeError("cannot start the clean run")

    verdicts = checkers.run_all(checkers.CheckContext(clean_run(), reference_runs=reference))
    assert len(calls) == 1
    for name in ("loss_continuity", "exactly_once_samples"):
        assert verdicts[name].status == "unknown"
        assert f"checker {name!r} raised RuntimeError: cannot start the clean run" in \
            verdicts[name].message


def test_a_checker_that_does_not_apply_is_absent_unless_opted_into():
    h = clean_run()
    with registered("never", final_loss_below(9.0), applies=lambda ctx: False, when="never"):
        assert "never" not in checkers.run_all(checkers.CheckContext(h))
        opted = checkers.run_all(checkers.CheckContext(h, opted_in=frozenset({"never",
                                                                              "sample_ledger"})))
    assert opted["never"].status == "pass"
    assert opted["sample_ledger"].status == "unknown"  # opted in without a pipeline: says so


def test_a_verdict_is_filed_under_its_checkers_name():
    with registered("eval_metric", final_loss_below(9.0)):  # the function says "final_loss"
        v = checkers.run_all(checkers.CheckContext(clean_run()))["eval_metric"]
    assert v.check == "eval_metric" and v.status == "pass"


# -- Result --------------------------------------------------------------------------------------
def test_result_asserts_a_users_checker_by_its_registered_name():
    with registered("eval_metric", final_loss_below(1e-9), column="eval"):
        result = result_of(clean_run())
        assert "assert_eval_metric" in dir(result) and "assert_live" in dir(result)
        assert "last kept step is below the limit" in result.assert_eval_metric.__doc__
        with pytest.raises(ReshardAssertionError, match=r"eval_metric FAIL: loss .* at step 19 "
                                                        r">= 1e-09\n  scenario: train.py"):
            result.assert_eval_metric()
        with pytest.raises(ReshardAssertionError, match="eval_metric FAIL"):
            result.assert_ok()
        result.assert_live()
        assert not result.ok
    with pytest.raises(AttributeError, match="no registered checker asserts it"):
        result.assert_nothing_like_this()


def test_asserting_a_checker_that_did_not_apply_says_when_it_applies():
    result = result_of(clean_run())   # no tokens, no pipeline, no memory budget, gloo
    assert "throughput" not in result.verdicts
    with pytest.raises(CheckerDidNotRun, match=r"assert_throughput\(\): the throughput checker "
                                               r"did not run for this scenario: it applies when "
                                               r"the workload records token counts"):
        result.assert_throughput()
    with pytest.raises(ReshardAssertionError, match="memory budget"):
        result.assert_memory_headroom()
    with pytest.raises(ReshardAssertionError, match="target and drafter"):
        result.assert_sample_ledger()


def test_result_ok_and_allow_unknown():
    result = result_of(reshard_run().history())  # no clean runs here: loss continuity unknown
    assert not result.ok
    with pytest.raises(ReshardAssertionError, match="loss_continuity UNKNOWN"):
        result.assert_ok()
    result.assert_ok(allow_unknown=True)
    result.assert_loss_continuous(allow_unknown=True)
    passed = result_of(clean_run(), verdicts={"no_rewind": Verdict.passed("no_rewind", "fine")})
    assert passed.ok


def test_memory_and_allocator_checkers_apply_by_the_scenario():
    result = result_of(clean_run(), backend="nccl", memory_budget_bytes=2**30)
    assert {"memory_headroom", "allocator_fragmentation"} <= set(result.verdicts)
    assert result.verdicts["allocator_fragmentation"].status == "unknown"


# -- verdicts and tables -------------------------------------------------------------------------
def test_status_is_an_enum_and_a_verdicts_status_a_plain_string():
    v = Verdict(Status.FAIL, "x", "broke")
    assert type(v.status) is str and v.status == "fail" == Status.FAIL  # xdist can carry it
    assert Status(Verdict("pass", "x", "fine").status) is Status.PASS and PASS == "pass"
    assert f"{Status.UNKNOWN}" == "unknown" and table.MARK[Status.UNKNOWN] == "?"
    assert json.loads(json.dumps(v.to_dict()))["status"] == "fail"


def test_columns_include_allocator_fragmentation_and_a_users_checker(tmp_path):
    with registered("eval_metric", final_loss_below(1e-9), column="eval"):
        assert ("allocator_fragmentation", "frag") in checkers.columns()
        assert checkers.columns()[-1] == ("eval_metric", "eval")
        history = clean_run()
        result = result_of(history, backend="nccl")
        row = table.summary_row(result)
    assert row["columns"]["eval_metric"] == "eval" and row["checks"]["eval_metric"]["status"] == "fail"
    assert type(row["status"]) is str
    # the controller never registered eval_metric: the row's header still names its column
    lines = table.verdict_table([row])
    assert lines[0].split()[-4:] == ["frag", "eval", "wall", "s"]
    assert "FAIL" in lines[2].split()
    assert "test_x: eval_metric fail: loss" in "\n".join(lines)
    md = table.markdown_summary([row])
    assert "| frag | eval | wall s |" in md
    page = html_report.write_index(tmp_path, [row]).read_text()
    assert "<th>frag</th><th>eval</th>" in page


def test_columns_of_rows_without_headers_are_named_after_the_check():
    row = {"name": "t.py::test_a", "faults": "none", "status": "pass", "wall_s": 1.0,
           "replay": "r", "checks": {"no_rewind": {"status": "pass", "message": "m"},
                                     "custom": {"status": "unknown", "message": "?"}}}
    assert table.columns_of([row]) == [("no_rewind", "rewind"), ("custom", "custom")]
    assert [c for c, _ in table.columns_of([])] == [c.name for c in checkers.registered()]
    assert [c for c, _ in table.COLUMNS][:len(BUILT_IN)] == BUILT_IN




def test_only_a_sweeps_point_feeds_the_sweep_matrix():
    """A test of its own that kills at a file event may expect the failure it gets: its row is
    no crash point of a sweep (it read as one that failed)."""
    from pytest_reshard.schedule import Fault

    sc_faults = Schedule(0, [Fault("power_loss", "rank:0", 3, "begin", {"event": 1})])
    import dataclasses

    result = dataclasses.replace(result_of(clean_run()), scenario=Scenario(
        workload="train.py", world_size=2, steps=20, schedule=sc_faults))
    assert table.summary_row(result)["file_point"] is None
    assert table.summary_row(result, swept=True)["file_point"]["event"] == 1
