"""The regression gate: expressions, comparisons, and a torch upgrade's +200 MB per rank failing
it under a fixed memory budget."""
import pytest

from pytest_reshard import procfs
from pytest_reshard.contract import Ev
from pytest_reshard.gate import baseline as gate
from pytest_reshard.gate import stacks
from pytest_reshard.gate.baseline import GateError

from ..histories import Builder



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


def test_headroom_is_judged_per_rank_under_a_fixed_budget():
    mb = 2**20
    before = {"runs": {"t": {"peak_mem": 300 * mb, "memory_budget": 1024 * mb,
                             "peak_mem_by_rank": {"0": 300 * mb, "1": 250 * mb}}}}
    now = {"peak_mem": 450 * mb, "memory_budget": 1024 * mb,
           "peak_mem_by_rank": {"0": 310 * mb, "1": 450 * mb}}
    changes = {c.field: c for c in gate.compare(before, "t", now, gate.parse("peak_mem:+150MB"))}
    room = changes["headroom"]
    assert room.regressed and room.rank == "1" and not changes["peak_mem"].regressed
    assert room.describe() == ("t: rank 1 headroom fell from 774 MB to 574 MB (-200 MB, -25.8%) "
                               "under its 1024 MB budget, beyond peak_mem:+150MB")
    # without any memory limit it still fails (never a pass): at most 10% of the budget
    default = gate.compare(before, "t", now, [])[-1]
    assert default.regressed and "beyond the default limit for a fixed budget (headroom may " \
        "fall by 10% of it, 102 MB)" in default.describe()
    # within the limit, and budgets that differ (headroom is then not comparable): no verdict
    assert not gate.compare(before, "t", now, gate.parse("peak_mem:+250MB"))[-1].regressed
    moved = {**now, "memory_budget": 2048 * mb}
    assert all(c.field != "headroom" for c in gate.compare(before, "t", moved, []))
    assert gate.compare(before, "t", moved, gate.parse("peak_mem:+100MB"))[0].regressed


def test_two_baselines_side_by_side():
    old = {"environment": {"torch": "2.13.0+cpu", "cuda": None},
           "runs": {"s.py::t": {"step_time": 0.100, "throughput": 100.0, "loss_digest": "aa"},
                    "s.py::gone": {"step_time": 0.1}}}
    new = {"environment": {"torch": "2.14.1", "cuda": "13.0"},
           "runs": {"s.py::t": {"step_time": 0.150, "throughput": 99.0, "loss_digest": "bb"}}}
    lines, changes, problems = gate.diff_table(old, new, gate.parse("step_time:+10%"))
    text = "\n".join(lines)
    assert problems == ["scenario s.py::gone ran in one stack only"]
    assert [c.field for c in changes if c.regressed] == ["step_time"]
    assert "torch" in text and "2.13.0+cpu" in text and "2.14.1" in text and "changed" in text
    row = next(ln for ln in lines if ln.startswith("t step_time"))
    assert "100.0 ms" in row and "150.0 ms" in row and "+50.0%" in row and "FAIL beyond step_time:+10%" in row
    assert "differs" in next(ln for ln in lines if "loss trajectory" in ln)


def _run_on(launcher: str) -> dict:
    """The gate's numbers of a one-generation run whose ranks ``launcher`` started, each with
    the memory sets it recorded at its exit."""
    b = Builder(steps=3)
    b.gen(run=range(3))
    for e in b.events:
        if e["ev"] == Ev.GEN_START:
            e["launcher"] = launcher
    for rank in range(b.world_size):
        b.rank(0, rank, Ev.MEMORY, peak=(300 + rank) * 2**20, budget=2**34,
               reserved=(400 + rank) * 2**20)
        b.rank(0, rank, Ev.EXIT, code=0, memory={"uss": (100 + rank) * 2**20, "pss": 150 * 2**20})
    return gate.metrics(b.history())


def test_a_run_says_how_its_ranks_were_measured_and_keeps_their_own_sets():
    cold, forked = _run_on("local"), _run_on("fork")
    assert cold["memory_method"] == gate.COLD
    assert forked["memory_method"].startswith("forked from the fork server of pytest-reshard ")
    assert cold["uss"] == 101 * 2**20 and cold["pss"] == 150 * 2**20
    assert cold["device_mem"] == 301 * 2**20 and cold["device_reserved"] == 401 * 2**20
    assert list(gate.FIELDS)[:2] == ["device_mem", "device_reserved"]   # a GPU's figures first


def test_runs_measured_in_different_ways_are_not_compared():
    """A baseline of forked ranks against a run of cold ones (or one that never said how): the
    memory moved with the harness, not the stack, so the gate refuses and says why."""
    cold, forked = _run_on("local"), _run_on("fork")
    with pytest.raises(GateError, match="the baseline's ranks ran in forked from the fork server"):
        gate.compare({"runs": {"t": forked}}, "t", cold, gate.parse("peak_mem:+1MB"))
    unsaid = {k: v for k, v in cold.items() if k != "memory_method"}
    with pytest.raises(GateError, match="a way not recorded"):
        gate.compare({"runs": {"t": unsaid}}, "t", cold, [])
    assert gate.compare({"runs": {"t": cold}}, "t", cold, gate.parse("peak_mem:+1MB"))
    lines, _, problems = gate.diff_table({"runs": {"t": forked}}, {"runs": {"t": cold}}, [])
    assert len(problems) == 1 and "cannot be compared" in problems[0], problems
    assert any(ln.startswith("ranks ran in") and gate.COLD in ln for ln in lines), lines


def test_the_gate_runs_its_ranks_cold_and_refuses_the_fork_server(capsys, tmp_path):
    assert stacks.launcher_of(["-x", "--reshard-launcher", "torchrun"]) == "torchrun"
    assert stacks.launcher_of(["--reshard-launcher=fork"]) == "fork"
    assert stacks.launcher_of(["-x"]) is None
    rc = stacks.main(["--old", f"venv:{tmp_path}", "--new", f"venv:{tmp_path}",
                      "--dir", str(tmp_path / "g"), "--", "--reshard-launcher=fork"])
    err = capsys.readouterr().err
    assert rc == 2 and "the gate runs every rank in a cold interpreter" in err, err
    assert not (tmp_path / "g").exists()   # refused before anything ran


def test_a_process_knows_its_unique_and_proportional_sets():
    sets = procfs.memory_sets("self")
    rss = procfs.status_bytes("self", "VmRSS")
    assert rss and 0 < sets["uss"] <= sets["pss"] <= rss, (sets, rss)
    assert procfs.memory_sets(2**22 + 7) == {}   # no such process


def test_a_stack_between_the_two_says_which_step_cost_what():
    mb = 2**20
    doc = lambda torch, cuda, peak: {"environment": {"torch": torch, "cuda": cuda},  # noqa: E731
                                     "runs": {"u.py::t[steady]": {"peak_mem": peak * mb}}}
    old, via, new = doc("2.13.0+cpu", None, 333), doc("2.13.0+cu130", "13.0", 805), \
        doc("2.14.1+cu130", "13.0", 823)
    assert gate.steps_table(old, via, new) == [
        "t[steady] peak_mem  333 MB  -> 805 MB (+472 MB, +141.7%)  -> 823 MB (+18 MB, +2.2%)"]
    note = gate.mixed_change_note(old, new)
    assert len(note) == 1 and "version (2.13.0 -> 2.14.1) and its build (CUDA None -> 13.0)" \
        in note[0] and "--via" in note[0], note
    assert gate.mixed_change_note(via, new) == []      # the version alone changed
