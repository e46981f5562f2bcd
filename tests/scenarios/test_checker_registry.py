"""The checker registry: one registration per checker, read by the session (which checkers run),
``Result`` (their ``assert_*`` methods) and the verdict tables (their columns). Unit tests on
hand-built histories, then one pytester run in which a conftest registers its own checkers."""
from __future__ import annotations

import json


from pytest_reshard import checkers
from pytest_reshard.verdict import Verdict

from ..conftest import WORKLOADS


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


# -- end to end: a conftest registers its own checkers -------------------------------------------
CONFTEST = '''
import pytest
from pytest_reshard import checkers
from pytest_reshard.verdict import Verdict

LIMIT = {}


@pytest.fixture
def final_loss_below():
    yield lambda limit: LIMIT.update(value=limit)
    LIMIT.clear()


@checkers.register("final_loss", column="lastloss", applies=lambda ctx: "value" in LIMIT,
                   when="a test sets a limit with the final_loss_below fixture")
def final_loss(ctx):
    """The loss at the last kept step is below the test's limit."""
    losses = ctx.history.kept_losses()
    step = max(losses)
    loss, limit = losses[step][1], LIMIT["value"]
    if loss < limit:
        return Verdict.passed("final_loss", f"loss {loss:.4g} at step {step}, below {limit}")
    return Verdict.failed("final_loss", f"loss {loss:.4g} at step {step} is not below {limit}",
                          step=step)


@checkers.register("exploding", column="boom")
def exploding(ctx):
    raise ZeroDivisionError("planted in the conftest")
'''


def test_a_conftest_checker_shows_in_table_assertions_verdict_json_and_report(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_user_checker=f'''
        import pytest
        from pytest_reshard.result import CheckerDidNotRun

        TOY = {str(WORKLOADS / "toy_train.py")!r}
        pytestmark = pytest.mark.reshard(world_size=2, steps=6, timeout=90)

        def test_loss_below_a_loose_limit(reshard_run, final_loss_below):
            final_loss_below(1e9)
            result = reshard_run(TOY)
            result.assert_final_loss()
            assert result.verdicts["exploding"].status == "unknown"
            result.assert_ok(allow_unknown=True)

        def test_loss_below_an_impossible_limit(reshard_run, final_loss_below):
            final_loss_below(0.0)
            reshard_run(TOY).assert_ok()

        def test_without_a_limit_the_checker_does_not_apply(reshard_run):
            result = reshard_run(TOY)
            assert "final_loss" not in result.verdicts
            with pytest.raises(CheckerDidNotRun, match="it applies when a test sets a limit"):
                result.assert_final_loss()
            result.assert_live()
    ''')
    result = pytester.runpytest_subprocess("--reshard-artifacts=art", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "INTERNALERROR" not in out
    # assert_ok()'s failure names both user checkers
    result.stdout.fnmatch_lines(["*final_loss FAIL: loss * at step 5 is not below 0.0*",
                                 "*exploding UNKNOWN: checker 'exploding' raised ZeroDivisionError: "
                                 "planted in the conftest*"])
    # the verdict table: a column for each, after the built-ins
    result.stdout.fnmatch_lines(["scenario*faults*rewind*loss*samples*state*live*ecc*lastloss*boom*wall s",
                                 "test_loss_below_a_loose_limit*pass*?*",
                                 "test_loss_below_an_impossible_limit*FAIL*?*"])
    art = pytester.path / "art"
    run_dir = art / "test_user_checker.py__test_loss_below_an_impossible_limit"
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["status"] == "fail"
    assert verdict["checks"]["final_loss"]["status"] == "fail"
    assert verdict["checks"]["exploding"]["status"] == "unknown"
    assert "ZeroDivisionError: planted" in verdict["checks"]["exploding"]["message"]
    page = (run_dir / "report.html").read_text()
    assert 'data-check="final_loss"' in page and 'data-check="exploding"' in page
    loose = json.loads((art / "test_user_checker.py__test_loss_below_a_loose_limit"
                        / "verdict.json").read_text())
    assert loose["checks"]["final_loss"]["status"] == "pass"
    index = next(art.rglob("index.html")).read_text()
    assert "<th>lastloss</th><th>boom</th>" in index
