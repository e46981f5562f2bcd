"""pytest-xdist: workers share one machine without collisions, and one summary comes back.

The pure parts (port ranges, GPU shares, shards) are unit-tested; one pytester run with ``-n 2``
proves the whole path: two real scenarios on two workers, disjoint port ranges and GPU sets,
artifacts per worker, one table and one Markdown summary on the controller."""
import json

import pytest


from ..conftest import WORKLOADS


def test_two_workers_run_scenarios_apart_and_summarise_once(pytester, monkeypatch):
    """``-n 2``: each worker claims its own ports and GPU share (from the inventory given as
    CUDA_VISIBLE_DEVICES here), writes under its own folder, and the controller prints one
    table, one index and one Markdown summary with both workers' scenarios."""
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (the test extra has it)")
    pytester.makeconftest("""
        import json, os
        def pytest_sessionstart(session):
            wid = os.environ.get("PYTEST_XDIST_WORKER")
            if wid:
                with open(f"layout-{wid}.json", "w") as f:
                    json.dump({k: os.environ.get(k) for k in
                               ("RESHARD_PORT_RANGE", "CUDA_VISIBLE_DEVICES")}, f)
    """)
    pytester.makepyfile(f"""
        import pytest
        from pytest_reshard import chaos

        @pytest.mark.reshard(world_size=2, steps=5, timeout=90)
        @pytest.mark.parametrize("n", [0, 1])
        def test_pair(reshard_run, n):
            faults = [chaos.shift_shards(to_world_size=1, at_step=2)] if n else []
            reshard_run({str(WORKLOADS / "toy_train.py")!r}, faults=faults).assert_ok()
    """)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    result = pytester.runpytest_subprocess("-n", "2", "--reshard-artifacts=art",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    layouts = [json.loads((pytester.path / f"layout-gw{i}.json").read_text()) for i in (0, 1)]
    assert [lay["CUDA_VISIBLE_DEVICES"] for lay in layouts] == ["0", "1"]
    (lo0, hi0), (lo1, hi1) = (map(int, lay["RESHARD_PORT_RANGE"].split("-")) for lay in layouts)
    assert hi0 <= lo1 or hi1 <= lo0
    art = pytester.path / "art"
    reports = sorted(p.relative_to(art).parts[0] for p in art.glob("gw*/*/report.html"))
    assert reports == ["gw0", "gw1"]  # xdist sends the first two tests one to each worker
    assert (art / "gw0" / "_references").is_dir() and (art / "gw1" / "_references").is_dir()
    result.stdout.fnmatch_lines(["*reshard verdicts*", "test_pair[[]0]*pass*", "test_pair[[]1]*pass*",
                                 f"reports: {art / 'index.html'}"])
    index = (art / "index.html").read_text()
    assert 'href="gw0/' in index and 'href="gw1/' in index
    summary = (pytester.path / "summary.md").read_text()
    assert summary.count("## reshard verdicts") == 1
    assert "| test_pair[0] |" in summary and "| test_pair[1] |" in summary
