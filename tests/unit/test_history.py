from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from ..histories import DIGEST, Builder, reshard_run
from pytest_reshard.checkers import CheckContext, run_all
from pytest_reshard.history import History, HistoryError, Occurrence


def test_load_reads_what_the_probe_and_supervisor_write(tmp_path: Path) -> None:
    b = reshard_run()
    loaded = History.load(b.write(tmp_path))
    built = b.history()
    assert loaded.generations == built.generations
    assert loaded.kept() == built.kept()
    assert loaded.scenario is not None and loaded.scenario.steps == 20
    assert loaded.replay == "pytest-reshard replay run-1"
    assert sorted(p.name for p in (tmp_path / "events").iterdir())[:2] == ["g0-r0.jsonl",
                                                                         "g0-r1.jsonl"]


def test_torn_last_line_is_tolerated(tmp_path: Path) -> None:
    b = Builder(steps=3)
    b.gen(run=range(3))
    b.write(tmp_path)
    path = tmp_path / "events" / "g0-r1.jsonl"
    with open(path, "a") as f:
        f.write('{"ev":"begin","t":1.0,"gen":0,"ra')        # SIGKILL mid-write
    h = History.load(tmp_path)
    assert len(h.torn) == 1 and h.torn[0].file.endswith("g0-r1.jsonl")
    assert h.committed(0) == {0, 1, 2}


def test_a_bad_middle_line_is_damage_naming_file_and_line(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    good = json.dumps({"ev": "start", "t": 1.0, "gen": 0, "rank": 0, "world_size": 1})
    (events / "g0-r0.jsonl").write_text(good + "\n{not json\n" + good + "\n")
    h = History.load(tmp_path)
    [d] = h.damaged
    assert d.file.endswith("g0-r0.jsonl") and d.line == 2 and "not valid JSON" in d.why
    assert len(h.events) == 2 and not h.torn


def test_a_changed_line_fails_its_checksum_and_nothing_is_judged(tmp_path: Path) -> None:
    """A digit of a sealed line changed (a flipped bit on disk): the line is left out, and every
    checker says unknown, naming the file and line, instead of judging what is left."""
    b = Builder(steps=4)
    b.gen(run=range(4))
    path = b.write(tmp_path) / "events" / "g0-r1.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    assert lines[6].startswith(b'{"ev":"begin",') and b'"step":1,' in lines[6]
    lines[6] = lines[6].replace(b'"step":1,', b'"step":3,')
    path.write_bytes(b"".join(lines))
    h = History.load(tmp_path)
    assert [(Path(d.file).name, d.line) for d in h.damaged] == [("g0-r1.jsonl", 7)]
    assert "checksum" in h.damaged[0].why
    verdicts = run_all(CheckContext(h))
    assert verdicts and all(v.status == "unknown" for v in verdicts.values()), verdicts
    assert all("g0-r1.jsonl:7" in v.message and "not judged" in v.message
               for v in verdicts.values())


def test_an_unsealed_line_among_sealed_ones_is_damage(tmp_path: Path) -> None:
    b = Builder(steps=2)
    b.gen(run=range(2))
    path = b.write(tmp_path) / "events" / "g0-r0.jsonl"
    with open(path, "a") as f:   # another process appends a plausible event, without a seal
        f.write(json.dumps({"ev": "end", "t": 9.0, "gen": 0, "rank": 0, "step": 1}) + "\n")
        f.write(path.read_text().splitlines()[0] + "\n")   # so that it is not the last line
    [d] = History.load(tmp_path).damaged
    assert "no checksum" in d.why


def test_malformed_events_are_errors(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="integer 'step'"):
        History.from_events([{"ev": "end", "gen": 0, "rank": 0}])
    with pytest.raises(HistoryError, match="no 'ev'"):
        History.from_events([{"gen": 0, "rank": 0}])
    with pytest.raises(HistoryError, match="no such run directory"):
        History.load(tmp_path / "missing")
    (tmp_path / "events").mkdir()
    with pytest.raises(HistoryError, match="no event files"):
        History.load(tmp_path)


def test_committed_needs_every_rank_of_the_world() -> None:
    b = Builder(world_size=3)
    b.gen(run=range(4), partial={4: [0, 2]}, cause="failure")
    h = b.history()
    assert h.committed(0) == {0, 1, 2, 3}
    assert h.ended(0) == {0, 1, 2, 3, 4}
    assert h.ended_by(0, 4) == {0, 2}


def test_generations_view() -> None:
    h = reshard_run().history()
    g0, g1 = h.generations[0], h.generations[1]
    assert (g0.world_size, g0.resume_step, g0.cause, g0.planned, g0.fault_id) == \
        (2, 0, "reshard", True, 0)
    assert (g1.world_size, g1.resume_step, g1.resume_source, g1.cause) == \
        (3, 13, "checkpoint", "complete")
    assert h.final_generation == g1
    assert h.describe_fault(0) == "shift_shards(all) at step 12 optimizer notice_s=1 to_world_size=3"
    assert h.max_rewind_steps(1) == 0   # undeclared -> 0


def test_kept_steps_after_a_rewind() -> None:
    b = Builder()
    b.gen(run=range(15), cause="failure")
    b.gen(resume=10, run=range(10, 20))
    h = b.history()
    kept = h.kept()
    assert [o for o in kept if o.gen == 0] == [Occurrence(s, 0) for s in range(10)]
    assert [o for o in kept if o.gen == 1] == [Occurrence(s, 1) for s in range(10, 20)]
    assert {s: occ.gen for s, (occ, _) in h.kept_losses().items()}[12] == 1


def test_kept_steps_use_the_lowest_later_resume() -> None:
    b = Builder()
    b.gen(run=range(21), cause="failure")
    b.gen(resume=15, run=range(15, 18), cause="failure")
    b.gen(resume=10, run=range(10, 20))
    kept = b.history().kept()
    assert max(o.step for o in kept if o.gen == 0) == 9
    assert not [o for o in kept if o.gen == 1]


def test_last_generation_keeps_only_committed_steps() -> None:
    b = Builder()
    b.gen(run=range(5), partial={5: [0]}, cause="failure")
    assert max(b.history().kept()).step == 4


def test_uncommitted_step_kept_when_the_next_generation_resumes_after_it() -> None:
    b = Builder()
    b.gen(run=range(5), partial={5: [0]}, cause="failure")
    b.gen(resume=6, run=range(6, 8))
    h = b.history()
    assert Occurrence(5, 0) in h.kept()
    assert h.kept_samples()[Occurrence(5, 0)] == {(0, s) for s in range(20, 24)}


def test_loss_prefers_rank_zero_and_samples_carry_epochs() -> None:
    h = History.from_events([
        {"ev": "record", "gen": 0, "rank": 1, "step": 0, "loss": 2.0, "samples": [3]},
        {"ev": "record", "gen": 0, "rank": 0, "step": 0, "loss": 1.0, "samples": [1], "epoch": 2},
        {"ev": "record", "gen": 0, "rank": 1, "step": 1, "loss": 5.0},
    ])
    assert h.loss(0, 0) == 1.0 and h.loss(0, 1) == 5.0
    assert h.samples(0, 0) == {1: [(0, 3)], 0: [(2, 1)]}


def test_resume_step_falls_back_and_takes_the_lowest() -> None:
    h = History.from_events([
        {"ev": "begin", "gen": 0, "rank": 0, "step": 3},
        {"ev": "resumed", "gen": 1, "rank": 0, "step": 7},
        {"ev": "resumed", "gen": 1, "rank": 1, "step": 5},
    ])
    assert (h.generations[0].resume_step, h.generations[0].resume_declared) == (3, False)
    assert h.generations[1].resume_step == 5
    assert h.generations[1].world_size == 2


def test_checkpoints_and_faults() -> None:
    h = reshard_run().history()
    saves, loads = h.checkpoints("save"), h.checkpoints("load")
    assert [(c.gen, c.rank, c.step) for c in saves] == [(0, 0, 12), (0, 1, 12)]
    assert loads[0].digest == DIGEST and loads[1].digest == {}
    assert [(f.gen, f.rank, f.step, f.kind) for f in h.faults_fired()] == \
        [(0, 0, 12, "shift_shards")]


def test_supervisor_detections_load_with_their_rank(tmp_path: Path) -> None:
    b = Builder()
    b.gen(run=range(3), partial={3: [0]}, cause="failure")
    b.detect(0, "died", 1, 3, "backward", expected=True, exit_code=-9)
    [d] = History.load(b.write(tmp_path)).detections()
    assert (d.gen, d.kind, d.rank, d.step, d.phase, d.exit_code, d.expected) == \
        (0, "died", 1, 3, "backward", -9, True)


def test_a_generation_only_the_supervisor_saw() -> None:
    b = Builder()
    b.gen(run=range(3), cause="failure")
    b.sup("gen_end", gen=1, cause="error", planned=False, fault_id=None, detail="gave up")
    h = b.history()
    assert h.generations[1].world_size == 0 and h.generations[1].resume_step is None
    assert h.committed(1) == frozenset() and max(h.kept()).step == 2


def test_generations_carry_the_supervisors_start_and_end_times() -> None:
    b = Builder()
    b.gen(run=range(2), cause="failure")
    b.gen(resume=1, run=range(1, 3), cause=None)     # the supervisor recorded no end
    h = b.history()
    starts = [e["t"] for e in b.events if e["ev"] == "gen_start"]
    [end] = [e["t"] for e in b.events if e["ev"] == "gen_end"]
    assert [(g.started_at, g.ended_at) for g in h.generations.values()] == \
        [(starts[0], end), (starts[1], None)]
    only_ranks = History.from_events([{"ev": "begin", "t": 5.0, "gen": 0, "rank": 0, "step": 0}])
    g0 = only_ranks.generations[0]
    assert (g0.started_at, g0.ended_at) == (None, None)


def test_supervisor_events_by_kind_and_generation() -> None:
    b = Builder()
    b.gen(run=range(2), cause="failure")
    b.detect(0, "died", 1, 1, "forward", expected=True)
    b.gen(resume=1, run=range(1, 3))
    h = b.history()
    assert [e["ev"] for e in h.supervisor_events()] == \
        ["scenario", "gen_start", "gen_end", "detect", "gen_start", "gen_end"]
    assert [e["gen"] for e in h.supervisor_events("gen_end")] == [0, 1]
    assert [e["ev"] for e in h.supervisor_events(gen=1)] == ["gen_start", "gen_end"]
    assert h.supervisor_events("rss") == []


def test_step_spans_pair_each_ranks_begin_with_its_end() -> None:
    h = History.from_events([
        {"ev": "begin", "t": 1.0, "gen": 0, "rank": 1, "step": 0},
        {"ev": "begin", "t": 1.1, "gen": 0, "rank": 0, "step": 0},
        {"ev": "end", "t": 1.5, "gen": 0, "rank": 0, "step": 0},
        {"ev": "end", "t": 1.6, "gen": 0, "rank": 1, "step": 0},
        {"ev": "end", "t": 1.7, "gen": 0, "rank": 1, "step": 9},    # never begun: no span
        {"ev": "begin", "t": 2.0, "gen": 0, "rank": 0, "step": 1},  # killed mid-step
        {"ev": "begin", "t": 3.0, "gen": 1, "rank": 0, "step": 1},
        {"ev": "begin", "t": 3.5, "gen": 1, "rank": 0, "step": 1},  # begun again: the last counts
        {"ev": "end", "t": 4.0, "gen": 1, "rank": 0, "step": 1},
    ])
    spans = h.step_spans()
    assert [(s.gen, s.rank, s.step, s.begin_t, s.end_t) for s in spans] == [
        (0, 0, 0, 1.1, 1.5), (0, 0, 1, 2.0, None), (0, 1, 0, 1.0, 1.6), (1, 0, 1, 3.5, 4.0)]
    assert [s.done for s in spans] == [True, False, True, True]
    assert spans[0].seconds == pytest.approx(0.4) and spans[1].seconds is None
    assert [(s.gen, s.step) for s in h.step_spans(rank=0)] == [(0, 0), (0, 1), (1, 1)]
    assert [(s.rank, s.step) for s in h.step_spans(gen=0, rank=1)] == [(1, 0)]


def test_times_of_a_ranks_events_of_a_kind() -> None:
    h = History.from_events([
        {"ev": "begin", "t": 2.0, "gen": 0, "rank": 1, "step": 0},
        {"ev": "begin", "t": 1.0, "gen": 0, "rank": 0, "step": 0},
        {"ev": "end", "t": 3.0, "gen": 0, "rank": 0, "step": 0},
        {"ev": "begin", "t": 4.0, "gen": 1, "rank": 0, "step": 1},
        {"ev": "begin", "gen": 1, "rank": 1, "step": 1},   # no time: counts as 0
    ])
    assert h.times("begin") == [2.0, 1.0, 4.0, 0.0]   # history order, not sorted
    assert h.times("begin", gen=0) == [2.0, 1.0] and h.times("begin", gen=1, rank=0) == [4.0]
    assert h.times("end", gen=1) == [] and h.times("fault") == []


def test_checkpoints_carry_seconds_bytes_and_the_workloads_other_fields() -> None:
    h = History.from_events([
        {"ev": "ckpt_save", "t": 1.0, "gen": 0, "rank": 0, "step": 4, "digest": DIGEST,
         "seconds": 0.25, "bytes": 2**20, "world_size": 2},
        {"ev": "ckpt_save", "t": 1.1, "gen": 0, "rank": 1, "step": 4, "digest": {},
         "kind": "emergency", "bytes": 10},                 # dflash's emergency snapshot
        {"ev": "ckpt_load", "t": 2.0, "gen": 1, "rank": 0, "step": 4, "digest": DIGEST,
         "seconds": 3, "source": "checkpoint", "saved_world_size": 2},
        {"ev": "ckpt_save", "t": 3.0, "gen": 1, "rank": 0, "step": 6, "seconds": None},
    ])
    save, emergency, late = h.checkpoints("save")
    assert (save.seconds, save.bytes, save.info) == (0.25, 2**20, {"world_size": 2})
    assert (emergency.kind, emergency.seconds, emergency.bytes, emergency.info) == \
        ("save", None, 10, {"kind": "emergency"})
    assert (late.seconds, late.bytes, late.info) == (None, None, {})
    [load] = h.checkpoints("load")
    assert (load.seconds, load.info) == (3, {"source": "checkpoint", "saved_world_size": 2})
    assert isinstance(load.seconds, int)   # as recorded, so numbers computed from it do not move
    assert [(c.kind, c.step) for c in h.checkpoints()] == \
        [("save", 4), ("save", 4), ("load", 4), ("save", 6)]   # both kinds, in history order
    assert [c.index for c in h.checkpoints()] == [0, 1, 2, 3]
    assert [c.kind for c in h.checkpoints(gen=1)] == ["load", "save"]
    assert [c.rank for c in h.checkpoints("save", gen=0, rank=1)] == [1]
    with pytest.raises(KeyError):
        h.checkpoints("emergency")


def test_faults_and_detections_carry_their_times(tmp_path: Path) -> None:
    b = Builder()
    b.gen(run=range(3), partial={3: [0]}, cause="failure",
          fault={"rank": 1, "step": 3, "phase": "backward", "kind": "kill", "id": 0})
    b.detect(0, "died", 1, 3, "backward", expected=True, exit_code=-9)
    [fault_t] = [e["t"] for e in b.events if e["ev"] == "fault"]
    [detect_t] = [e["t"] for e in b.events if e["ev"] == "detect"]
    for h in (b.history(), History.load(b.write(tmp_path))):
        [f] = h.faults_fired()
        [d] = h.detections()
        assert (f.t, d.t) == (fault_t, detect_t)
    untimed = History.from_events([
        {"ev": "fault", "gen": 0, "rank": 0, "step": 0, "kind": "kill"},
        {"ev": "detect", "gen": 0, "kind": "died", "rank": 0}])
    assert (untimed.faults_fired()[0].t, untimed.detections()[0].t) == (None, None)


# -- the typed view: History is the only reader of raw events ------------------------------------
def test_file_events_come_back_as_records_with_the_contracts_ops() -> None:
    from pytest_reshard.contract import FileOp
    from pytest_reshard.history import FileEvent, Saved, file_trail

    b = Builder(steps=2)
    b.gen(run=range(2))
    b.rank(0, 0, "file", op="close", path="ckpt/m.pt", n=3, at_step=1, size=4, crc=9)
    b.rank(0, 0, "ckpt_save", step=1, digest={})
    b.rank(0, 0, "file", op="rename", path="a", dst="b", n=4, at_step=1, killed="before")
    h = b.history()
    close, rename = h.file_events()
    assert isinstance(close, FileEvent) and close.op is FileOp.CLOSE
    assert (close.path, close.n, close.at_step, close.size, close.crc) == ("ckpt/m.pt", 3, 1, 4, 9)
    assert (rename.op, rename.dst, rename.killed) == (FileOp.RENAME, "b", "before")
    assert h.file_trail() == [close, Saved(0, 0, 1), rename]
    assert file_trail(h.events) == h.file_trail() == file_trail(h.file_trail())


def test_causes_and_detection_kinds_are_the_contracts_enums() -> None:
    from pytest_reshard.contract import Cause, Detected

    h = reshard_run().history()
    assert h.generations[0].cause is Cause.RESHARD and h.final_generation.cause is Cause.COMPLETE
    b = Builder(steps=3)
    b.gen(run=range(3))
    b.detect(0, "died", 1, 2, "backward", expected=True, exit_code=-9)
    b.detect(0, "something_new", 1, 2, "backward", expected=False)
    died, other = b.history().detections()
    assert died.kind is Detected.DIED and other.kind == "something_new"   # unknown names kept


def test_never_started_and_finished_are_decided_by_the_history() -> None:
    h = reshard_run().history()
    assert h.never_started() is None and h.finished() and h.reached_target()
    attached = Builder(steps=3)
    attached.sup("gen_start", gen=0, world_size=1, roles=["trainer"])
    attached.rank(0, 0, "start", world_size=1)
    attached.sup("gen_end", gen=0, cause="timeout", planned=False)
    h = attached.history()
    assert h.never_started() == ("the run never started: ranks attached (probe.attach()) but "
                                 "none began a step, so there is nothing to compare (see "
                                 "liveness)")
    assert not h.finished() and not h.reached_target()
    assert History.from_events([]).never_started() == \
        "the run never started: no rank recorded anything"


def test_signals_exits_notes_and_supervisor_records_are_typed() -> None:
    b = Builder(steps=2)
    b.gen(run=range(2))
    b.rank(0, 1, "signal", signal="SIGTERM", armed=True)
    b.rank(0, 1, "note", what="allocator", total_free=5)
    b.rank(0, 1, "exit", code=0, sigterm_replaced=True)
    b.sup("deliver", gen=0, fault_id=2, kind="preempt", grace_s=1.0)
    b.sup("unfired", fault_id=1, detail="never reached")
    b.sup("abort", detail="gave up")
    b.sup("rss", gen=0, rank=1, peak_bytes=10, budget_bytes=20)
    h = b.history()
    [sig] = h.signals(rank=1)
    assert (sig.signal, sig.armed) == ("SIGTERM", True)
    [note] = h.notes("allocator")
    assert note.fields["total_free"] == 5 and h.notes("other") == []
    [ex] = h.exits(gen=0, rank=1)
    assert (ex.code, ex.sigterm_replaced) == (0, True)
    assert [(d.gen, d.fault_id) for d in h.deliveries()] == [(0, 2)]
    assert [(u.fault_id, u.detail) for u in h.unfired()] == [(1, "never reached")]
    assert [a.detail for a in h.aborts()] == ["gave up"]
    assert [(r.rank, r.peak_bytes) for r in h.rss()] == [(1, 10)]


def test_one_line_encoder_and_the_run_folders_names(tmp_path: Path) -> None:
    from pytest_reshard.contract import Ev, RunDir, decode_event, encode_event, read_jsonl

    line = encode_event({"ev": Ev.BEGIN, "step": 3, "t": 1.5, "gen": 0, "rank": 1})
    body = b'{"ev":"begin","step":3,"t":1.5,"gen":0,"rank":1}'
    assert line == body[:-1] + b',"#":"%08x"}\n' % zlib.crc32(body)
    assert decode_event(line) == {"ev": "begin", "step": 3, "t": 1.5, "gen": 0, "rank": 1}
    assert encode_event(decode_event(line)) == line
    path = tmp_path / "e.jsonl"
    path.write_bytes(line)
    assert read_jsonl(path)[0] == [(1, {"ev": "begin", "step": 3, "t": 1.5, "gen": 0, "rank": 1})]
    run = RunDir(tmp_path)
    assert run.step_log(2) == tmp_path / "logs" / "g2-slurm.log"
    assert run.telemetry_counts(1, 3) == tmp_path / "telemetry" / "g1-r3.json"
    assert run.plot("loss") == tmp_path / "loss.png"


def test_a_sealed_file_reads_as_json_reads_it_whatever_its_parser(tmp_path: Path) -> None:
    # A whole file is parsed at once (by orjson where installed, which refuses NaN and integers
    # past 64 bits that json takes); each of its lines must read as json reads that line.
    import math

    from pytest_reshard.contract import decode_event, encode_event, read_jsonl

    events = [{"ev": "record", "step": 1, "loss": float("nan"), "t": 1.0, "gen": 0, "rank": 0},
              {"ev": "record", "step": 1, "big": 1 << 70, "t": 1.5, "gen": 0, "rank": 0},
              {"ev": "note", "what": "caf\u00e9 \U0001f600", "t": 2.0, "gen": 0, "rank": 0},
              {"ev": "end", "step": 1, "t": 0.1 + 0.2, "gen": 0, "rank": 0}]
    lines = [encode_event(e) for e in events]
    path = tmp_path / "g0-r0.jsonl"
    for k in range(len(lines)):   # each alone, then all of them
        path.write_bytes(lines[k])
        assert read_jsonl(path) == ([(1, decode_event(lines[k]))], [], [])
    path.write_bytes(b"".join(lines))
    got, torn, damaged = read_jsonl(path)
    assert (torn, damaged) == ([], [])
    assert [n for n, _ in got] == [1, 2, 3, 4]
    assert math.isnan(got[0][1].pop("loss")) and got[1][1]["big"] == 1 << 70
    assert [e for _, e in got][1:] == events[1:]


def test_a_ranks_event_times_read_from_its_columns_are_its_events_times() -> None:
    h = reshard_run().history()
    for gen in h.generations:
        for rank in h.ranks_seen(gen):
            events = h.rank_events(gen=gen, rank=rank)
            assert any(e["ev"] not in ("begin", "end", "point", "record") for e in events)
            assert h.times(None, gen=gen, rank=rank) == [float(e.get("t", 0.0)) for e in events]
