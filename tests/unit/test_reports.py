"""Reports people look at: chart data read from histories, the SVG and HTML built from it, the
PNGs (or why they were skipped), the session index, and the live progress line. Pure parts,
on hand-built histories; the browser test (test_report_browser.py) renders a real one."""
import sys
from types import SimpleNamespace

import pytest

from pytest_reshard.contract import OWN_GPUS, Ev
from pytest_reshard.reports import charts
from pytest_reshard.reports import html as html_report
from pytest_reshard.reports import png as png_plots
from pytest_reshard.reports import table as report
from pytest_reshard.reports.progress import LiveLine, Status
from pytest_reshard.schedule import Fault, Schedule
from pytest_reshard.supervisor import Scenario
from pytest_reshard.verdict import Verdict

from ..histories import DIGEST, Builder, clean_run

KILL = {"kind": "kill", "target": "rank:1", "step": 8, "phase": "backward", "params": {}}
NEVER = {"kind": "preempt", "target": "all", "step": 30, "phase": "forward", "params": {}}


def killed_run():
    """Two ranks; rank 1 killed mid-step 8; the next generation resumes at 6 (replays 6, 7)."""
    b = Builder(steps=12, faults=[KILL, NEVER])
    b.gen(run=range(8), partial={8: [0]}, cause="failure", fault_id=0, saves={5: DIGEST},
          fault={"rank": 1, "step": 8, "phase": "backward", "kind": "kill", "id": 0})
    b.detect(0, "died", 1, 8, "backward", expected=True, exit_code=-9)
    b.gen(resume=6, run=range(6, 12), load=(5, DIGEST))
    return b.history()


def test_chart_data_tells_kept_from_thrown_away_steps_and_places_faults():
    data = charts.ChartData.build(killed_run(), clean_run(steps=12))
    thrown_away = sorted((p.gen, p.step) for p in data.chaos if not p.kept)
    assert thrown_away == [(0, 6), (0, 7), (0, 8)]  # gen 1 resumed at 6: 6-8 of gen 0 are gone
    assert len(data.reference) == 12 and data.reference_world_size == 2
    assert [(g.gen, g.first_step, g.last_step, g.cause) for g in data.generations] == \
        [(0, 0, 8, "failure"), (1, 6, 11, "complete")]
    kill, never = data.faults
    assert (kill.kind, kill.fired, kill.ranks, kill.gen, kill.x) == ("kill", True, (1,), 0, 8.5)
    assert (never.kind, never.fired, never.t) == ("preempt", False, None)
    unfinished = [(b.gen, b.rank, b.first_step) for b in data.bars if not b.done]
    assert unfinished == [(0, 1, 8)]  # rank 1 began step 8 and never ended it
    assert [(m.kind, m.rank) for m in data.marks if m.kind == "died"] == [("died", 1)]
    assert data.ranks == 2 and data.notes == []


def test_no_reference_and_no_loss_are_said_not_hidden():
    b = Builder(steps=4)
    b.gen(run=range(4), loss=lambda s: None)
    data = charts.ChartData.build(b.history(), None)
    assert data.notes == ["no reference run to compare the loss with",
                          "the workload recorded no loss (s.record(loss=...)), so there is no curve"]
    assert "no loss recorded" in charts.loss_svg(data)


def test_svg_has_the_ids_and_classes_the_browser_test_queries():
    data = charts.ChartData.build(killed_run(), clean_run(steps=12))
    loss, timeline = charts.loss_svg(data), charts.timeline_svg(data)
    assert loss.startswith('<svg id="loss-curve"') and loss.endswith("</svg>")
    assert loss.count('class="loss reference"') == 1 and loss.count('class="loss chaos"') == 2
    assert loss.count('<g class="fault" data-kind="kill">') == 1
    assert loss.count('class="fault unfired" data-kind="preempt"') == 1
    assert loss.count('class="discarded"') == 3
    assert timeline.count('class="rank-row"') == 2 and timeline.count('class="detection"') == 1
    assert timeline.count('class="step unfinished"') == 1


def test_time_axis_squeezes_idle_gaps_and_keeps_order():
    axis = charts.TimeAxis([0.0, 0.2, 5.0, 5.3], 5.3)  # a 4.8 s relaunch between two bursts
    assert axis.gaps == [(0.2, 5.0)]
    xs = [axis(t) for t in (0.0, 0.1, 0.2, 2.0, 5.0, 5.3)]
    assert xs == sorted(xs) and xs[0] == 0 and xs[-1] == pytest.approx(1.0)
    assert axis(5.0) - axis(0.2) == pytest.approx(charts.TimeAxis.GAP)
    assert all(not 0.2 < t < 5.0 for t in axis.ticks())  # no tick inside the squeezed stretch
    assert charts.TimeAxis([0, 0.5, 1.0], 1.0).gaps == []  # nothing idle: drawn to scale


def _result(tmp_path, history, status="fail"):
    checks = {"no_rewind": Verdict.passed("no_rewind", "ok"),
              "state_equivalence": Verdict(status, "state_equivalence", "optimizer <differs> & co",
                                           step=6, generation=1)}
    scenario = Scenario(workload="train.py", world_size=2, steps=12,
                        schedule=Schedule(0, [Fault("kill", "rank:1", 8, "backward")]))
    result = SimpleNamespace(name="tests/t.py::test_a", scenario=scenario, run_dir=tmp_path,
                             history=history, verdicts=checks, wall_s=3.25,
                             replay="pytest 'tests/t.py::test_a' --reshard-seed=0", report=None)
    result.verdict = SimpleNamespace(status=status)
    return result


def test_page_has_verdicts_replay_and_charts_escaped(tmp_path):
    result = _result(tmp_path, killed_run())
    written = html_report.write(result, clean_run(steps=12))
    page = written.page.read_text()
    assert written.page == tmp_path / "report.html"
    assert '<span class="status fail" id="status">FAIL</span>' in page
    assert "optimizer &lt;differs&gt; &amp; co" in page and "<differs>" not in page
    assert "pytest &#x27;tests/t.py::test_a&#x27; --reshard-seed=0" in page
    assert '<svg id="loss-curve"' in page and '<svg id="timeline"' in page
    assert "<script" not in page  # static: nothing to run, nothing to fail


def test_png_plots_are_drawn_and_embedded(tmp_path):
    pytest.importorskip("matplotlib", reason="the report extra is not installed here")
    written = html_report.write(_result(tmp_path, killed_run()), clean_run(steps=12))
    assert written.png_skipped is None
    for name in ("loss.png", "timeline.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = written.page.read_text()
    assert page.count('<img class="plot"') == 2 and "data:image/png;base64," in page


def test_without_matplotlib_the_page_says_pngs_were_skipped(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    written = html_report.write(_result(tmp_path, killed_run()), clean_run(steps=12))
    assert written.pngs == () and "pytest-reshard[report]" in written.png_skipped
    page = written.page.read_text()
    assert 'id="png-skipped">PNG plots skipped: matplotlib is not installed' in page
    assert '<svg id="loss-curve"' in page and not (tmp_path / "loss.png").exists()
    assert png_plots.missing() is not None


def _row(name, status, worker, report_path):
    return {"name": name, "faults": "kill(rank:1) at step 8 backward", "status": status,
            "wall_s": 1.5, "replay": f"pytest {name}", "schedule_hash": "abc",
            "checks": {"no_rewind": {"status": status, "message": "m|1"}}, "run_dir": "",
            "report": report_path, "worker": worker}


def test_index_links_each_report_relative_to_itself(tmp_path):
    rows = [_row("t.py::test_a", "pass", "gw0", str(tmp_path / "gw0" / "t_a" / "report.html")),
            _row("t.py::test_b", "fail", "gw1", str(tmp_path / "gw1" / "t_b" / "report.html"))]
    page = html_report.write_index(tmp_path, rows).read_text()
    assert 'href="gw0/t_a/report.html"' in page and 'href="gw1/t_b/report.html"' in page
    assert "1 passed, 1 failed, 0 unknown" in page


def test_tables_from_rows_name_the_report_of_a_failure():
    rows = [_row("t.py::test_b", "fail", "gw1", "/art/gw1/t_b/report.html")]
    assert "test_b: report /art/gw1/t_b/report.html" in report.verdict_table(rows)
    md = report.markdown_summary(rows)
    assert "| test_b | kill(rank:1) at step 8 backward | FAIL |" in md
    assert "report: `/art/gw1/t_b/report.html`" in md and "m\\|1" not in md.split("\n")[2]


def test_a_judged_recording_has_no_wall_time_of_its_own_in_the_tables(tmp_path):
    """Its job ran elsewhere: the tables say "-", not the judging's own fraction of a second."""
    ran, recorded = _row("t.py::test_a", "pass", "", ""), _row("judge rec", "pass", "", "")
    recorded["wall_s"] = None
    lines = report.verdict_table([ran, recorded])
    assert lines[2].endswith("1.5") and lines[3].endswith("-")
    assert report.markdown_summary([recorded]).split("\n")[4].endswith("| - |")
    assert "<td>-</td></tr>" in html_report.write_index(tmp_path, [recorded]).read_text()


class FakeReporter:
    def __init__(self):
        self.out = []

    def write_line(self, text):
        self.out.append(("line", text))

    def rewrite(self, text, erase=False):
        self.out.append(("rewrite", text.strip()))

    def ensure_newline(self):
        self.out.append(("newline?",))

    def write(self, text, flush=False):
        self.out.append(("write", text))

    def flush(self):
        pass


def _statuses():
    return [Status(0, 4, None, 12, 0, 1, "s"), Status(0, 4, 3, 12, 0, 1, "s"),
            Status(0, 4, 4, 12, 1, 1, "s"), Status(1, 3, 5, 12, 1, 1, "s"),
            Status(1, 3, 9, 12, 1, 1, "s")]


def test_live_line_without_a_tty_prints_only_what_changes():
    rep = FakeReporter()
    live = LiveLine(rep, tty=False)
    for st in _statuses():
        live.status(st)
    live.finish()
    assert rep.out == [
        ("line", "  reshard: s: generation 0 (world size 4), starting, faults 0/1"),
        ("line", "  reshard: s: generation 0 (world size 4), step 5/12, faults 1/1"),
        ("line", "  reshard: s: generation 1 (world size 3), step 6/12, faults 1/1")]


def test_live_line_on_a_tty_rewrites_in_place_throttled_and_ends_with_a_newline():
    rep, now = FakeReporter(), [0.0]
    live = LiveLine(rep, tty=True, interval_s=1.0, clock=lambda: now[0])
    for st in _statuses():
        live.status(st)  # the clock stands still: only starts and new faults/generations draw
    live.message("generation 0 (world size 4): reshard")
    live.finish()
    drawn = [e[1] for e in rep.out if e[0] == "rewrite"]
    assert drawn == ["reshard: s: generation 0 (world size 4), starting, faults 0/1",
                     "reshard: s: generation 0 (world size 4), step 5/12, faults 1/1",
                     "reshard: s: generation 1 (world size 3), step 6/12, faults 1/1",
                     "reshard: generation 0 (world size 4): reshard",
                     "reshard: s: generation 1 (world size 3), step 10/12, faults 1/1",
                     "reshard: s: generation 1 (world size 3), step 10/12, faults 1/1"]
    assert rep.out[0] == ("newline?",) and rep.out[-1] == ("write", "\n")
    assert not [e for e in rep.out if e[0] == "line"]  # nothing outside the rewritten line


def test_each_detection_is_marked_at_its_own_time():
    b = Builder(steps=6)
    b.gen(run=range(2), partial={2: [0]}, cause="failure")
    b.detect(0, "died", 1, 2, "forward", expected=False, exit_code=-9)
    b.gen(resume=2, run=range(2, 3), partial={3: [0]}, cause="failure")
    b.detect(1, "died", 1, 3, "forward", expected=False, exit_code=-9)
    marks = [m for m in charts.ChartData.build(b.history()).marks if m.kind == "died"]
    assert [(m.gen, m.rank) for m in marks] == [(0, 1), (1, 1)] and marks[0].t < marks[1].t


def test_fault_marks_are_labelled_with_the_kinds_declared_label(monkeypatch):
    import dataclasses

    from pytest_reshard.schedule import kinds

    monkeypatch.setitem(kinds._KINDS, "kill", dataclasses.replace(kinds.get("kill"),
                                                                  label="rank killed"))
    b = Builder(steps=4)   # a kind this version does not know (an old history) still renders
    b.gen(run=range(4), fault={"rank": 0, "step": 2, "phase": "forward", "kind": "retired_kind"})
    data = charts.ChartData.build(killed_run())
    assert [(m.kind, m.kind_label) for m in data.faults] == [
        ("kill", "rank killed"), ("preempt", kinds.get("preempt").label or "preempt")]
    loss = charts.loss_svg(data)
    assert "&#9889; rank killed</text>" in loss and '<g class="fault" data-kind="kill">' in loss
    old = charts.ChartData.build(b.history())
    assert [m.kind_label for m in old.faults] == ["retired_kind"]
    assert "&#9889; retired_kind</text>" in charts.loss_svg(old)


def test_a_sweep_masks_random_ids_even_all_digit_ones_and_keeps_step_numbers():
    from pytest_reshard.reports.sweep import masked

    for random_id in ("a1e5e24a1726", "467633932016"):   # the LM's uuid4().hex[:12]
        assert masked(f"ckpt/.tmp-step-00000005-{random_id}/__0_0.distcp") == \
            "ckpt/.tmp-step-00000005-*/__0_0.distcp"
    assert masked("ckpt/step-00000005/.metadata") == "ckpt/step-00000005/.metadata"


def test_a_thousand_rank_timeline_draws_a_bounded_number_of_rows_bars_and_marks() -> None:
    ranks = charts.MAX_RANK_ROWS + 36
    b = Builder(steps=30, world_size=ranks)
    b.gen(run=range(30))
    data = charts.ChartData.build(b.history(), None)
    assert data.ranks == charts.MAX_RANK_ROWS
    assert {bar.rank for bar in data.bars} == set(range(charts.MAX_RANK_ROWS))
    assert len(data.bars) <= charts.MAX_BARS
    assert any(f"ranks 0..{charts.MAX_RANK_ROWS - 1} of {ranks}" in n for n in data.notes)
    assert f'data-rank="{charts.MAX_RANK_ROWS}"' not in charts.timeline_svg(data)


def test_a_heterogeneous_world_shows_each_ranks_class_share_and_how_it_was_made(tmp_path):
    b = Builder(steps=4)
    b.sup(Ev.DEVICES, gen=0, classes=["h100", "a100"], speeds=[1.0, 0.32], mode=OWN_GPUS,
          why="each rank's own GPU: rank 0 NVIDIA H100 80GB HBM3, rank 1 NVIDIA A100 <x>")
    b.gen(run=range(4), samples=lambda step, rank, _: [step * 4 + i for i in range(3 - 2 * rank)])
    page = html_report.write(_result(tmp_path, b.history()), clean_run(steps=4)).page.read_text()
    assert "<td>0</td><td>0</td><td>h100</td><td>1</td><td>75%</td>" in page
    assert "<td>0</td><td>1</td><td>a100</td><td>0.32</td><td>25%</td>" in page
    assert ('<td title="each rank&#x27;s own GPU: rank 0 NVIDIA H100 80GB HBM3, rank 1 NVIDIA '
            'A100 &lt;x&gt;">gpu</td>') in page
