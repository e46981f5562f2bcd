"""filewatch in a real process: the file events a save makes, and a kill at the Nth of them.

The watcher patches ``open`` and installs an audit hook for the life of a process, so each case
runs in a fresh interpreter of its own, never in pytest's."""
import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, os, shutil, sys, pathlib
    from pytest_reshard import filewatch
    root = pathlib.Path(sys.argv[1])
    out = open(sys.argv[2], "a")   # opened before the watcher: not a watched file

    def emit(**fields):
        out.write(json.dumps(fields) + "\\n"); out.flush()

    w = filewatch.install(root, emit, lambda: 7)
    if len(sys.argv) > 3 and sys.argv[3].isdigit():
        w.arm(int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    elif len(sys.argv) > 3:    # PATH:OP
        path, _, op = sys.argv[3].partition(":")
        w.arm(0, sys.argv[4], int(sys.argv[5]), match=(path, op or None))
    os.makedirs(root / "tmp")
    with open(root / "tmp" / "data.bin", "wb") as f:
        f.write(b"x" * 1000)
        f.write(b"y" * 1000)
        f.flush()
        os.fsync(f.fileno())
    (root / "tmp" / "note.txt").write_text("hello")
    import torch
    torch.save({"w": torch.ones(4)}, root / "tmp" / "extra.pt")
    os.replace(root / "tmp", root / "step1")
    os.symlink("step1", root / "latest")
    open(root / "step1" / "data.bin", "rb").read()
    shutil.rmtree(root / "step1")
    os.remove(root / "latest")
    open(os.path.join(sys.argv[1], "..", "outside.txt"), "w").close()
""")


def run(tmp_path, *arm):
    root = tmp_path / "work"
    root.mkdir()
    log = tmp_path / "events.jsonl"
    script = tmp_path / "save.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(root), str(log), *map(str, arm)],
                          capture_output=True, text=True, timeout=120)
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, root, events


def test_every_file_event_of_a_save_is_seen_in_order(tmp_path):
    proc, _, events = run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = [(e["op"], e["path"]) for e in events]
    assert seen == [
        ("mkdir", "tmp"), ("open", "tmp/data.bin"), ("write", "tmp/data.bin"),
        ("fsync", "tmp/data.bin"), ("close", "tmp/data.bin"),
        ("open", "tmp/note.txt"), ("write", "tmp/note.txt"), ("close", "tmp/note.txt"),
        ("open", "tmp/extra.pt"), ("write", "tmp/extra.pt"), ("close", "tmp/extra.pt"),
        ("rename", "tmp"), ("symlink", "latest"), ("read", "step1/data.bin"),
        ("rmtree", "step1"), ("read", "step1"), ("rmdir", "step1"), ("unlink", "latest")]
    close = events[4]
    assert close["size"] == 2000 and close["written"] == 2000 and isinstance(close["crc"], int)
    assert events[11]["dst"] == "step1"
    assert all(e["at_step"] == 7 for e in events)
    assert [e["n"] for e in events if e["op"] != "read"] == list(range(1, 17))


def test_a_kill_before_the_nth_event_leaves_the_files_as_a_crash_there_would(tmp_path):
    proc, root, events = run(tmp_path, 12, "before", 0)   # the rename of tmp -> step1
    assert proc.returncode == -9
    assert events[-1]["op"] == "rename" and events[-1]["killed"] == "before"
    assert sorted(p.name for p in (root / "tmp").iterdir()) == ["data.bin", "extra.pt", "note.txt"]
    assert not (root / "step1").exists()


@pytest.mark.parametrize("named, op", [("tmp/extra.pt:open", "open"), ("extra.pt:close", "close"),
                                       ("latest", "symlink")])
def test_a_kill_named_by_file_fires_at_that_files_first_matching_event(tmp_path, named, op):
    proc, _, events = run(tmp_path, named, "before", 0)
    assert proc.returncode == -9
    hit = events[-1]
    assert hit["killed"] == "before" and hit["op"] == op, events[-3:]
    assert hit["path"].endswith(named.split(":")[0]), hit


@pytest.mark.parametrize("event, path, size, tear", [(3, "data.bin", 2000, 1500),
                                                     (10, "extra.pt", None, 0)])
def test_a_torn_write_keeps_only_the_first_bytes(tmp_path, event, path, size, tear):
    proc, root, events = run(tmp_path, event, "torn", tear)
    assert proc.returncode == -9
    assert events[-1]["op"] == "write" and events[-1]["killed"] == "torn"
    torn = (root / "tmp" / path).stat().st_size
    if size is not None:      # written through Python: cut inside the second write()
        assert torn == tear
    else:                     # a native writer (torch.save): the whole file cut to half
        assert 0 < torn == events[-1]["tear_bytes"]


SAFETENSORS = textwrap.dedent("""
    import json, sys, pathlib
    from pytest_reshard import filewatch
    root = pathlib.Path(sys.argv[1])
    out = open(sys.argv[2], "a")
    w = filewatch.install(root, lambda **f: (out.write(json.dumps(f) + "\\n"), out.flush()), lambda: 3)
    if len(sys.argv) > 3:
        w.arm(int(sys.argv[3]), sys.argv[4], 0)
    import torch
    from safetensors.torch import save_file
    save_file({"w": torch.ones(1000)}, str(root / "model.safetensors"))
""")


@pytest.mark.parametrize("arm, left", [((), "model"), ((2, "torn"), "torn temporary"),
                                       ((4, "before"), "whole temporary")])
def test_a_safetensors_save_is_a_temporary_renamed_into_place_as_the_real_writer_does(
        tmp_path, arm, left):
    """safetensors 0.8 writes ``.tmpXXXXXX`` and renames it (no fsync): a crash can leave that
    temporary, torn or whole, but never a torn ``model.safetensors``."""
    root = tmp_path / "work"
    root.mkdir()
    log = tmp_path / "events.jsonl"
    (tmp_path / "save.py").write_text(SAFETENSORS)
    proc = subprocess.run([sys.executable, str(tmp_path / "save.py"), str(root), str(log), *map(str, arm)],
                          capture_output=True, text=True, timeout=120)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    tmp = events[0]["path"]
    assert tmp.startswith(".tmp") and len(tmp) == 10, events
    assert [e["op"] for e in events] == ["open", "write", "close", "rename"][:len(events)]
    files = {p.name: p.stat().st_size for p in root.iterdir()}
    if left == "model":
        assert proc.returncode == 0, proc.stderr
        assert events[-1]["dst"] == "model.safetensors" and list(files) == ["model.safetensors"]
        assert files["model.safetensors"] == events[2]["size"]
    else:
        assert proc.returncode == -9 and list(files) == [tmp], (proc.stderr, files)
        whole = len(events) == 4
        assert whole == (left == "whole temporary") and 0 < files[tmp], files
