"""A failing chaos test leaves a report that a real browser renders.

One real failing scenario (the toy workload with a planted bug: it drops the optimizer state on
resume) runs under pytest, exactly as a user's would; then headless Chromium opens its
report.html and the session's index.html over the DevTools protocol, and the test checks what
was rendered: the loss curve against the reference, the faults, the per-rank timeline, the
plots, and no console error.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from .. import browser
from ..conftest import WORKLOADS

TEST = f"""
import pytest
from pytest_reshard import chaos

@pytest.mark.reshard(world_size=3, steps=12, timeout=90)
def test_resume_bug(reshard_run):
    result = reshard_run({str(WORKLOADS / "toy_train.py")!r}, args=["--drop-optimizer-state"],
                         faults=[chaos.shift_shards(to_world_size=2, at_step=3, phase="optimizer"),
                                 chaos.kill(rank=1, at_step=7, phase="backward")])
    result.assert_ok()
"""

# What the page shows, read from the rendered DOM (layout boxes, not just the markup).
PROBE = """JSON.stringify((() => {
  const all = s => [...document.querySelectorAll(s)];
  const box = s => { const e = document.querySelector(s); if (!e) return [0, 0];
                     const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const ref = document.querySelector('#loss-curve polyline.reference');
  return {
    status: document.querySelector('#status').textContent,
    loss_box: box('#loss-curve'), timeline_box: box('#timeline'),
    reference_points: ref ? ref.points.numberOfItems : 0,
    chaos_gens: all('#loss-curve g.loss.chaos').map(g => g.dataset.gen),
    chaos_points: all('#loss-curve g.loss.chaos circle').length,
    loss_faults: all('#loss-curve g.fault').map(g => g.dataset.kind),
    shaded_gens: all('#loss-curve g.generation').length,
    rank_rows: all('#timeline g.rank-row').length,
    step_bars: all('#timeline rect.step').filter(r => r.getBBox().width > 0).length,
    timeline_faults: all('#timeline g.fault').map(g => g.dataset.kind),
    detections: all('#timeline g.detection').map(g => g.dataset.kind),
    failed: all('#verdicts tr.check').filter(r => r.querySelector('td.fail'))
              .map(r => r.dataset.check),
    replay: document.querySelector('#replay').textContent,
    plots: all('img.plot').map(i => [i.id, i.complete && i.naturalWidth > 0]),
    png_skipped: !!document.querySelector('#png-skipped'),
  };
})())"""


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    """Run the failing chaos test once in a pytest of its own; return its folder and output."""
    where = tmp_path_factory.mktemp("failing")
    (where / "test_planted.py").write_text(TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RESHARD_"))}
    env["GITHUB_STEP_SUMMARY"] = str(where / "summary.md")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                           "--junitxml=junit.xml", "--reshard-artifacts=art", "test_planted.py"],
                          cwd=where, env=env, capture_output=True, text=True, timeout=300)
    return where, proc


def test_the_failure_names_its_report_and_the_summaries_are_written(failing_run):
    where, proc = failing_run
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    page = where / "art" / "test_planted.py__test_resume_bug" / "report.html"
    assert f"  report: {page}" in proc.stdout          # in the failure message
    assert f"test_resume_bug: report {page}" in proc.stdout  # and the verdict table
    assert f"reports: {where / 'art' / 'index.html'}" in proc.stdout
    # the live progress (-v): a relaunch is fast enough that its first line may show a step
    assert re.search(r"generation 1 \(world size 2\), (starting|step \d+/12), faults 1/2",
                     proc.stdout), proc.stdout[-3000:]
    summary = (where / "summary.md").read_text()
    assert "| test_resume_bug |" in summary and f"report: `{page}`" in summary
    junit = (where / "junit.xml").read_text()
    assert 'name="reshard_verdict" value="fail"' in junit
    assert f'name="reshard_report" value="{page}"' in junit


@pytest.mark.skipif(browser.find() is None,
                    reason="no Chromium or Chrome on PATH (apt-get install chromium, or set "
                           "RESHARD_CHROMIUM); .ci/run installs it where it can")
def test_the_report_renders_in_a_real_browser(failing_run):
    where, proc = failing_run
    page = where / "art" / "test_planted.py__test_resume_bug" / "report.html"
    assert page.exists(), proc.stdout[-3000:]
    with browser.Browser(browser.find()) as chromium:
        chromium.open(page.as_uri())
        shown = json.loads(chromium.evaluate(PROBE))
        errors = chromium.console_errors()
        shot = chromium.screenshot()
        (where / "report.png").write_bytes(shot)
        chromium.open((where / "art" / "index.html").as_uri())
        index = json.loads(chromium.evaluate(
            "JSON.stringify([...document.querySelectorAll('#scenarios a')]"
            ".map(a => [a.textContent, a.href]))"))
        errors += chromium.console_errors()
        pid = chromium.proc.pid
    assert errors == []
    assert shown["status"] == "FAIL"
    assert shown["loss_box"][0] > 500 and shown["loss_box"][1] > 200
    assert shown["timeline_box"][0] > 500 and shown["timeline_box"][1] > 80
    assert shown["reference_points"] == 12           # the clean run's curve
    assert shown["chaos_gens"] == ["0", "1", "2"]    # one line per generation
    assert shown["chaos_points"] >= 12 and shown["shaded_gens"] == 3
    assert shown["loss_faults"] == ["shift_shards", "kill"]
    assert shown["rank_rows"] == 3 and shown["step_bars"] >= 2 * 12
    assert sorted(shown["timeline_faults"]) == ["kill", "shift_shards", "shift_shards", "shift_shards"]
    assert shown["detections"] == ["died"]
    assert "state_equivalence" in shown["failed"]
    assert shown["replay"] == "pytest test_planted.py::test_resume_bug --reshard-seed=0"
    if shown["png_skipped"]:
        assert shown["plots"] == []
    else:
        assert shown["plots"] == [["loss-png", True], ["timeline-png", True]]
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 50_000
    assert index == [["test_planted.py::test_resume_bug", page.as_uri()]]
    assert not browser.group_alive(pid), "Chromium outlived Browser.close()"
    try:
        from PIL import Image  # matplotlib's dependency: look at the pixels too
    except ImportError:
        return
    with Image.open(where / "report.png") as img:
        rgb = img.convert("RGB").tobytes()
        pixels = list(zip(rgb[0::3], rgb[1::3], rgb[2::3], strict=True))
        red = sum(1 for r, g, b in pixels if r > 180 and g < 80 and b < 80)  # the FAIL badge, faults
        blue = sum(1 for r, g, b in pixels if (r, g, b) == (0x44, 0x77, 0xaa))  # generation 0
    assert red > 500 and blue > 200
