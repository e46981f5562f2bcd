"""The regression gate: expressions, comparisons, and a torch upgrade's +200 MB per rank failing
it under a fixed memory budget."""
import pytest


from ..conftest import WORKLOADS


@pytest.mark.nightly   # the CI budget: test_upgrade_gate.py plants +200 MB under a budget in CI
def test_200mb_more_per_rank_under_a_budget_fails_the_gate(pytester):
    """A torch upgrade that adds about 200 MB per GPU kills the ranks with the least headroom:
    under a fixed 1 GiB budget per rank, a baseline, then the same scenario with +200 MB on
    rank 1. The gate names the rank and how far its headroom fell."""
    pytester.makepyfile(f"""
        import os
        import pytest
        from pytest_reshard import chaos

        @pytest.mark.reshard(world_size=2, steps=6, timeout=90)
        def test_train(reshard_run):
            extra = int(os.environ.get("EXTRA_MB", "0"))
            # the rank stays a while after it allocates: the supervisor samples VmHWM every 20 ms
            # while a rank lives, and a toy rank can allocate and exit between two samples
            faults = [chaos.memory_pressure(rank=1, at_step=1, bytes=extra * 2**20),
                      chaos.slow_rank(rank=1, at_step=2, steps=3, delay_ms=100)] if extra else []
            reshard_run({str(WORKLOADS / "toy_train.py")!r}, faults=faults,
                        memory_budget_bytes=2**30).assert_ok()
    """)
    saved = pytester.runpytest_subprocess("--reshard-save-baseline=before")
    saved.assert_outcomes(passed=1)
    assert (pytester.path / ".reshard-baselines" / "before.json").exists()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EXTRA_MB", "200")
        mp.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
        after = pytester.runpytest_subprocess("--reshard-compare=before",
                                              "--reshard-compare-fail=peak_mem:+150MB")
    after.assert_outcomes(failed=1)
    after.stdout.fnmatch_lines(["*regressed against baseline 'before'*",
                                ("*rank 1 headroom fell from * MB to * MB (-* MB, -*%) under its "
                                 "1024 MB budget, beyond peak_mem:+150MB*")])
    summary = (pytester.path / "summary.md").read_text()  # the upgrade-gate workflow's page
    assert "### against baseline `before`" in summary
    assert any(line.startswith("- **REGRESSED** ") and "rank 1 headroom fell from" in line
               for line in summary.splitlines())
