"""crash_consistency and the sweep's crash points, on hand-written run folders (no processes).

A run folder here holds what a real one does: the ranks' events (file events included) and the
work folder as each generation left it (``disk-g*.json``)."""
import json

import pytest

from pytest_reshard.checkers.crash_consistency import crash_consistency, manifests, written
from pytest_reshard.history import History
from pytest_reshard.sweep import FilePoint, points


def save(step, folder, crc, *, pointer=True, commit=True):
    """The file events of an atomic save: a temporary folder renamed into place, then `latest`."""
    tmp = f".tmp-{folder}"
    out = [("mkdir", tmp, {}), ("open", f"{tmp}/a", {}), ("write", f"{tmp}/a", {"offset": 0}),
           ("close", f"{tmp}/a", {"size": 10, "crc": crc, "written": 10})]
    if commit:
        out.append(("rename", tmp, {"dst": folder}))
    if pointer:
        out += [("open", "latest.tmp", {}), ("write", "latest.tmp", {"offset": 0}),
                ("close", "latest.tmp", {"size": 2, "crc": 100 + step, "written": 2}),
                ("rename", "latest.tmp", {"dst": "latest"})]
    return [(step, op, path, extra) for op, path, extra in out]


class Run:
    """Events of one rank, generation by generation; ``write(tmp_path)`` makes the folder."""

    def __init__(self):
        self.events, self.t, self.gen, self.disks = [], 1000.0, -1, {}

    def _add(self, ev, **fields):
        self.t += 0.01
        self.events.append({"ev": ev, "t": self.t, **fields})

    def generation(self, *, steps, files=(), load=None, resume=None, cause="complete",
                   disk=None, started=True, saved=()):
        self.gen += 1
        g = self.gen
        self._add("gen_start", gen=g, world_size=1, roles=["trainer"], launcher="local")
        if started:
            self._add("start", gen=g, rank=0, world_size=1, role="trainer", pid=1)
        if load is not None:
            self._add("ckpt_load", gen=g, rank=0, step=load, digest={})
        if resume is not None:
            self._add("resumed", gen=g, rank=0, step=resume, source="checkpoint")
        by_step = {}
        for step, op, path, extra in files:
            by_step.setdefault(step, []).append((op, path, extra))
        n = 0
        for s in steps:
            self._add("begin", gen=g, rank=0, step=s)
            for op, path, extra in by_step.pop(s, ()):
                if op == "read":
                    self._add("file", gen=g, rank=0, op=op, path=path, at_step=s)
                    continue
                n += 1
                self._add("file", gen=g, rank=0, op=op, path=path, n=n, at_step=s, **extra)
                if extra.get("killed"):
                    break
            else:
                self._add("end", gen=g, rank=0, step=s)
                if s in saved:   # the workload records the save as complete
                    self._add("ckpt_save", gen=g, rank=0, step=s, digest={})
                continue
            break
        for op, path, extra in by_step.pop(None, ()):   # before any step (a resume's reads)
            self._add("file", gen=g, rank=0, op=op, path=path, at_step=None, **extra)
        self._add("gen_end", gen=g, cause=cause, planned=cause != "failure", fault_id=None,
                  detail="")
        if disk is not None:
            self.disks[g] = disk

    def history(self, tmp_path):
        events = tmp_path / "events"
        events.mkdir(parents=True, exist_ok=True)
        sup = [e for e in self.events if "rank" not in e]
        (events / "supervisor.jsonl").write_text("".join(json.dumps(e) + "\n" for e in sup))
        for g in range(self.gen + 1):
            mine = [e for e in self.events if e.get("gen") == g and "rank" in e]
            (events / f"g{g}-r0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in mine))
        for g, disk in self.disks.items():
            (events / f"disk-g{g}.json").write_text(json.dumps(disk))
        return History.load(tmp_path)


def reference(tmp_path):
    run = Run()
    run.generation(steps=range(6), files=save(1, "step1", 1) + save(3, "step3", 3))
    return manifests(run.history(tmp_path / "ref").file_events())


def test_manifests_keep_final_names_and_drop_temporaries(tmp_path):
    wanted = reference(tmp_path)
    assert wanted == {1: {"step1/a": 10, "latest": 2}, 3: {"step3/a": 10, "latest": 2}}


def file_events(*rows):
    """Bare events of rank 0: (step, op, path, extra) -> a file event; ("saved", step) -> the
    workload's record of a completed save."""
    return [{"ev": "ckpt_save", "gen": 0, "rank": 0, "step": r[1]} if r[0] == "saved" else
            {"ev": "file", "gen": 0, "rank": 0, "op": r[1], "path": r[2], "at_step": r[0], **r[3]}
            for r in rows]


def test_an_async_saves_late_marker_belongs_to_the_save_that_made_its_folder():
    events = file_events(
        (4, "mkdir", "step4", {}), (4, "close", "step4/data", {"size": 5, "crc": 1}),
        (8, "close", "step4/.done", {"size": 0, "crc": 0}),
        (8, "mkdir", "step8", {}), (8, "close", "step8/data", {"size": 5, "crc": 2}))
    assert manifests(events) == {4: {"step4/data": 5, "step4/.done": 0}, 8: {"step8/data": 5}}


def test_a_recorded_save_names_the_files_written_before_it_however_late():
    # an async save of step 3 whose thread only starts writing in step 4, then records it
    events = file_events(
        (1, "mkdir", "s2", {}), (1, "close", "s2/data", {"size": 5, "crc": 1}), ("saved", 1),
        (4, "mkdir", "s4", {}), (4, "close", "s4/data", {"size": 5, "crc": 2}),
        (4, "open", "s4/.done", {"raw": True}), ("saved", 3),
        (5, "mkdir", "s6", {}))
    assert manifests(events) == {1: {"s2/data": 5}, 3: {"s4/data": 5, "s4/.done": None}}
    assert written(events).files["s4/.done"] == (None, None, 3)   # made by touch(): unverified


def test_written_forgets_a_file_whose_write_was_torn():
    events = file_events((1, "open", "m.pt", {}), (1, "close", "m.pt", {"size": 4, "crc": 9}),
                         (3, "open", "m.pt", {}), (3, "write", "m.pt", {"killed": "torn"}))
    assert written(events).files == {"m.pt": None}
    assert written(events[:2]).files == {"m.pt": (4, 9, 1)}
    # killed before an event: it never happened (a close's data is all written, though)
    assert written(events[:2] + file_events((3, "open", "m.pt", {"killed": "before"}))).files \
        == {"m.pt": (4, 9, 1)}
    assert written(events[:2] + file_events(
        (3, "rename", "m.pt", {"dst": "n.pt", "killed": "before"}))).files == {"m.pt": (4, 9, 1)}


def test_an_in_place_file_holds_one_save_at_a_time(tmp_path):
    # torch.save over model.pt: killed before save 3 opens it, it still holds save 1
    wanted = {1: {"model.pt": 10}, 3: {"model.pt": 10}}
    run = Run()
    run.generation(steps=range(4), cause="failure", files=[
        (1, "open", "model.pt", {}), (1, "close", "model.pt", {"size": 10, "crc": 1}),
        (3, "open", "model.pt", {"killed": "before"})], disk={"model.pt": [10, 1]})
    run.generation(steps=range(2, 6), load=1, resume=2, disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "pass", v.message


def test_a_checkpoint_deleted_before_the_next_is_complete_is_named(tmp_path):
    wanted = {1: {"step1/a": 10}, 3: {"step3/a": 10}}
    run = Run()
    run.generation(steps=range(4), cause="failure", saved=[1], files=[
        (1, "mkdir", "step1", {}), (1, "close", "step1/a", {"size": 10, "crc": 1}),
        (3, "rmtree", "step1", {}), (3, "mkdir", "step3", {}),
        (3, "open", "step3/a", {"killed": "before"})], disk={})
    run.generation(steps=range(6), disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "fail"
    assert "no checkpoint was complete" in v.message
    assert "though the save of step 1 had been completed" in v.message
    assert "step 1: `step1/a` removed by `rmtree step1` in step 3" in v.message


def crashed_in_second_save(run, **kill):
    """Generation 0 completes save 1, then dies inside save 3 before it is committed."""
    files = save(1, "step1", 1) + save(3, "step3", 3, commit=False, pointer=False)
    files[-1] = (*files[-1][:3], {**files[-1][3], **kill}) if kill else files[-1]
    run.generation(steps=range(4), files=files, cause="failure",
                   disk={"step1/a": [10, 1], "latest": [2, 101], ".tmp-step3/a": [10, 3]})


def test_a_resume_from_the_newest_complete_checkpoint_passes(tmp_path):
    wanted = reference(tmp_path)
    run = Run()
    crashed_in_second_save(run)
    run.generation(steps=range(2, 6), load=1, resume=2, disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "pass", v.message
    assert "resumed from step 1" in v.message


def test_a_resume_from_an_incomplete_checkpoint_fails_naming_what_was_missing(tmp_path):
    wanted = reference(tmp_path)
    run = Run()
    crashed_in_second_save(run)
    run.generation(steps=range(4, 6), load=3, resume=4, disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "fail"
    assert "resumed from step 3" in v.message and "`step3/a` missing" in v.message


def test_a_resume_older_than_the_newest_complete_checkpoint_is_a_rewind_naming_it(tmp_path):
    wanted = reference(tmp_path)
    run = Run()
    crashed_in_second_save(run)
    run.generation(steps=range(6), disk={})     # from scratch, step 1's checkpoint ignored
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "fail"
    assert "resumed from scratch, a rewind beyond the newest complete checkpoint: step 1 " \
           "(latest, step1/)" in v.message


def test_a_job_that_cannot_start_names_the_torn_file_it_read(tmp_path):
    # an in-place save: model.pt overwritten, torn half-way; the next generation dies reading it
    wanted = {1: {"model.pt": 10}, 3: {"model.pt": 10}}
    run = Run()
    run.generation(steps=range(4), cause="failure", files=[
        (1, "open", "model.pt", {}), (1, "write", "model.pt", {"offset": 0}),
        (1, "close", "model.pt", {"size": 10, "crc": 1, "written": 10}),
        (3, "open", "model.pt", {}),
        (3, "write", "model.pt", {"offset": 0, "killed": "torn", "tear_bytes": 5})],
        disk={"model.pt": [5, 77]})
    run.generation(steps=(), cause="failure", files=[(None, "read", "model.pt", {})], disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "fail"
    assert "could not start again: generation 1 read `model.pt`, torn" in v.message
    assert "killed after 5 bytes of `write model.pt`" in v.message


def test_a_planned_exit_must_leave_its_last_save_complete(tmp_path):
    wanted = {2: {"step2/data": 5, "step2/.done": 0}, 4: {"step4/data": 5, "step4/.done": 0}}
    run = Run()
    run.generation(steps=range(5), cause="reshard", files=[
        (2, "mkdir", "step2", {}), (2, "close", "step2/data", {"size": 5, "crc": 1}),
        (4, "close", "step2/.done", {"size": 0, "crc": 0}),
        (4, "mkdir", "step4", {}), (4, "close", "step4/data", {"size": 5, "crc": 2})],
        disk={"step2/data": [5, 1], "step2/.done": [0, 0], "step4/data": [5, 2]})
    run.generation(steps=range(3, 6), load=2, resume=3, disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "fail"
    assert "ended as planned (reshard) after its save of step 4" in v.message
    assert "`step4/.done` missing" in v.message


def test_a_crash_in_the_first_save_may_start_from_scratch(tmp_path):
    wanted = {1: {"step1/a": 10}, 3: {"step3/a": 10}}
    run = Run()
    run.generation(steps=range(2), cause="failure", files=[
        (1, "mkdir", "step1", {}), (1, "open", "step1/a", {"killed": "before"})], disk={})
    run.generation(steps=range(6), disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "pass", v.message
    assert "started from scratch: no checkpoint was complete" in v.message


def test_without_a_reference_it_says_unknown(tmp_path):
    run = Run()
    crashed_in_second_save(run)
    run.generation(steps=range(2, 6), load=1, resume=2, disk={})

    def none(roles):
        raise LookupError("the clean reference run did not finish")

    v = crash_consistency(run.history(tmp_path / "run"), none)
    assert v.status == "unknown" and "did not finish" in v.message


def sweep_events():
    run = Run()
    run.generation(steps=range(6), files=save(1, "step1", 1) + save(3, "step3", 3))
    return run.events


def test_points_number_every_event_of_the_second_save_and_tear_its_writes():
    found = points([e for e in sweep_events() if "rank" in e])
    assert [(p.event, p.op, p.mode) for p in found] == [
        (1, "mkdir", "before"), (2, "open", "before"), (3, "write", "before"),
        (3, "write", "torn"), (4, "close", "before"), (5, "rename", "before"),
        (6, "open", "before"), (7, "write", "before"), (7, "write", "torn"),
        (8, "close", "before"), (9, "rename", "before")]
    torn = found[3]
    assert torn.tear_bytes == 5 and torn.step == 3
    assert torn.fault().params == {"event": 3, "mode": "torn", "tear_bytes": 5}
    assert torn.id == "s3-e03-torn-write-a"


def test_points_name_the_saves_there_are_when_the_step_saved_nothing():
    with pytest.raises(ValueError, match="saved in steps 1, 3"):
        points([e for e in sweep_events() if "rank" in e], save_step=2)


def test_a_file_point_id_masks_random_names_but_not_step_numbers():
    assert FilePoint(9, 1, "mkdir", "ckpt/.tmp-step-00000009-02d6e1d142e2").id == \
        "s9-e01-before-mkdir-.tmp-step-00000009-*"


# -- cases found in review: each gave a wrong verdict once ----------------------------------------
def flat_reference(tmp_path):
    """Flat files in a folder the first save creates: ``ckpt/step{K}.pt`` (a container)."""
    run = Run()
    run.generation(steps=range(6), files=[(1, "mkdir", "ckpt", {})] + [
        (s, op, f"ckpt/step{s}.pt", x) for s in (1, 3, 5) for op, x in
        (("open", {}), ("close", {"size": 10, "crc": s}))])
    return manifests(run.history(tmp_path / "ref").rank_events())


@pytest.mark.parametrize("load, status", [(3, "fail"), (1, "pass")])
def test_files_of_several_saves_in_one_folder_are_each_their_own(tmp_path, load, status):
    wanted = flat_reference(tmp_path)
    assert wanted == {1: {"ckpt/step1.pt": 10}, 3: {"ckpt/step3.pt": 10},
                      5: {"ckpt/step5.pt": 10}}
    run = Run()
    run.generation(steps=range(4), cause="failure", files=[
        (1, "mkdir", "ckpt", {}), (1, "open", "ckpt/step1.pt", {}),
        (1, "close", "ckpt/step1.pt", {"size": 10, "crc": 1}), (3, "open", "ckpt/step3.pt", {}),
        (3, "write", "ckpt/step3.pt", {"killed": "torn", "tear_bytes": 5})],
        disk={"ckpt/step1.pt": [10, 1], "ckpt/step3.pt": [5, 77]})
    run.generation(steps=range(load + 1, 6), load=load, resume=load + 1, disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == status, v.message


def test_a_file_renamed_in_from_outside_the_work_folder_is_part_of_the_save(tmp_path):
    def save(s):
        return [(s, "mkdir", f"step{s}", {}), (s, "close", f"step{s}/meta", {"size": 2, "crc": s}),
                (s, "rename", "(outside)", {"dst": f"step{s}/optim.pt"})]
    ref = Run()
    ref.generation(steps=range(6), files=save(1) + save(3))
    wanted = manifests(ref.history(tmp_path / "ref").rank_events())
    assert wanted[3] == {"step3/meta": 2, "step3/optim.pt": None}
    run = Run()
    files = save(1) + save(3)
    files[-1] = (3, "rename", "(outside)", {"dst": "step3/optim.pt", "killed": "before"})
    run.generation(steps=range(4), cause="failure", files=files,
                   disk={"step1/meta": [2, 1], "step1/optim.pt": [50, 9], "step3/meta": [2, 3]})
    run.generation(steps=range(4, 6), load=3, resume=4, disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "fail" and "`step3/optim.pt` missing" in v.message, v.message


def test_a_symlink_pointer_is_part_of_the_save_that_moves_it(tmp_path):
    def save(s, pointer=True):
        out = [(s, "mkdir", f"step{s}", {}), (s, "close", f"step{s}/a", {"size": 10, "crc": s})]
        if pointer:
            out += [(s, "symlink", "latest.tmp", {"target": f"step{s}"}),
                    (s, "rename", "latest.tmp", {"dst": "latest"})]
        return out
    ref = Run()
    ref.generation(steps=range(6), files=save(1) + save(3))
    wanted = manifests(ref.history(tmp_path / "ref").rank_events())
    run = Run()   # killed before step 3's symlink: `latest` still points at step1
    run.generation(steps=range(4), cause="failure", files=save(1) + save(3, pointer=False) + [
        (3, "symlink", "latest.tmp", {"target": "step3", "killed": "before"})],
        disk={"step1/a": [10, 1], "step3/a": [10, 3], "latest": [-1, "-> step1"]})
    run.generation(steps=range(2, 6), load=1, resume=2, disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "pass", v.message


def test_a_generation_without_a_disk_record_does_not_hide_a_fail(tmp_path):
    wanted = reference(tmp_path)
    run = Run()
    crashed_in_second_save(run)
    run.generation(steps=range(4, 5), load=3, resume=4, cause="failure")   # no disk record
    run.generation(steps=range(4, 6), load=3, resume=4, disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "fail" and "`step3/a` missing" in v.message, v.message


def test_a_log_written_every_step_is_no_part_of_a_checkpoint(tmp_path):
    """A workload that records no saves and appends a log under the work folder every step."""
    def steps(upto, kill=None):
        out = []
        for s in range(upto):
            out.append((s, "close", "log.txt", {"size": 10 * (s + 1), "crc": s}))
            if s in (1, 3, 5):
                out += [x for x in save(s, f"step{s}", s) if x != kill]
        return out
    ref = Run()
    ref.generation(steps=range(6), files=steps(6))
    wanted = manifests(ref.history(tmp_path / "ref").rank_events())
    assert all("log.txt" not in files for files in wanted.values()), wanted
    run = Run()
    run.generation(steps=range(5), cause="failure", files=steps(5),
                   disk={"step1/a": [10, 1], "step3/a": [10, 3], "latest": [2, 103],
                         "log.txt": [50, 4]})
    run.generation(steps=range(4, 6), load=3, resume=4, disk={})
    v = crash_consistency(run.history(tmp_path / "run"), lambda roles: wanted)
    assert v.status == "pass", v.message
