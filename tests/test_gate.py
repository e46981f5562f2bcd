"""The regression gate: expressions, comparisons, and seed 001 (+200 MB per rank) failing it."""
import pytest

from pytest_reshard import gate
from pytest_reshard.gate import GateError

from .conftest import WORKLOADS


def test_expressions_parse_to_limits():
    limits = gate.parse("peak_mem:+150MB, step_time:+10%,throughput:-10%")
    assert [(lim.field, lim.sign, lim.relative) for lim in limits] == [
        ("peak_mem", "+", False), ("step_time", "+", True), ("throughput", "-", True)]
    assert limits[0].amount == 150 * 2**20 and limits[1].amount == pytest.approx(0.10)


@pytest.mark.parametrize("expr, message", [
    ("", "empty expression"),
    ("peak_mem+150MB", r"write FIELD:\+N"),
    ("memory:+1MB", "unknown field 'memory'"),
    ("peak_mem:+150XB", "unknown unit 'XB'"),
])
def test_malformed_expressions_say_what_is_allowed(expr, message):
    with pytest.raises(GateError, match=message):
        gate.parse(expr)


def test_compare_marks_only_what_passed_its_limit():
    base = {"runs": {"t": {"peak_mem": 1000 * 2**20, "step_time": 0.100, "throughput": 100.0}}}
    now = {"peak_mem": 1200 * 2**20, "step_time": 0.105, "throughput": 85.0}
    changes = gate.compare(base, "t", now, gate.parse("peak_mem:+150MB,step_time:+10%,throughput:-10%"))
    regressed = {c.field: c.describe() for c in changes if c.regressed}
    assert set(regressed) == {"peak_mem", "throughput"}
    assert "1000 MB -> 1200 MB (+200 MB, +20.0%), beyond peak_mem:+150MB" in regressed["peak_mem"]
    assert gate.compare(base, "other", now, []) == []


def test_bad_expression_is_a_usage_error(pytester):
    result = pytester.runpytest("--reshard-compare-fail=peak_mem:lots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--reshard-compare-fail: 'peak_mem:lots': write FIELD:+N*"])


def test_seed_001_extra_memory_fails_the_gate(pytester):
    """Baseline, then the same scenario with +200 MB on one rank: the gate names field and amount."""
    pytester.makepyfile(f"""
        import os
        import pytest
        from pytest_reshard import chaos

        @pytest.mark.reshard(world_size=2, steps=6, timeout=90)
        def test_train(reshard_run):
            extra = int(os.environ.get("EXTRA_MB", "0"))
            faults = [chaos.memory_pressure(rank=1, at_step=1, bytes=extra * 2**20)] if extra else []
            reshard_run({str(WORKLOADS / "toy_train.py")!r}, faults=faults).assert_ok()
    """)
    saved = pytester.runpytest_subprocess("--reshard-save-baseline=before")
    saved.assert_outcomes(passed=1)
    assert (pytester.path / ".reshard-baselines" / "before.json").exists()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EXTRA_MB", "200")
        after = pytester.runpytest_subprocess("--reshard-compare=before",
                                              "--reshard-compare-fail=peak_mem:+150MB")
    after.assert_outcomes(failed=1)
    after.stdout.fnmatch_lines(["*regressed against baseline 'before'*",
                                "*peak RSS of the biggest rank * MB -> * MB (+* MB, *beyond peak_mem:+150MB*"])
