"""What a power loss leaves (``supervisor/power.py``), from file events alone."""
from pytest_reshard.supervisor.power import apply, undo_of


def ev(t, op, path, **fields):
    return {"ev": "file", "gen": 0, "rank": 0, "t": float(t), "op": op, "path": path, **fields}


CUT = ev(99, "open", "x", killed="power")


def test_a_save_synced_renamed_and_its_folder_synced_loses_nothing():
    undo = undo_of([ev(1, "open", "d/m.tmp"), ev(2, "write", "d/m.tmp"),
                    ev(3, "fsync", "d/m.tmp", size=10), ev(4, "close", "d/m.tmp", size=10),
                    ev(5, "rename", "d/m.tmp", dst="d/m"), ev(6, "fsync", "d", folder=True), CUT])
    assert (undo.renames, undo.removed, undo.cut) == ([], [], {})


def test_an_unsynced_file_is_removed_and_an_unsynced_folder_undoes_its_renames_newest_first():
    undo = undo_of([ev(1, "open", "m.tmp"), ev(2, "fsync", "m.tmp", size=5),
                    ev(3, "rename", "m.tmp", dst="m"),
                    ev(4, "open", "m.tmp"), ev(5, "fsync", "m.tmp", size=5),
                    ev(6, "rename", "m.tmp", dst="m", kept="k1"),
                    ev(7, "open", "log"), ev(8, "write", "log"), ev(9, "close", "log", size=3), CUT])
    assert undo.renames == [("m", "m.tmp", "k1"), ("m", "m.tmp", None)]
    assert undo.removed == ["log"] and "never fsynced" in undo.reasons["log"]
    assert "the rename is undone" in undo.reasons["m"]


def test_a_file_an_undone_rename_brings_back_is_as_durable_as_it_was():
    """The older save, renamed into place and its folder synced, but its data never: when the
    newer save's rename is undone, what comes back is that older file, and it is empty."""
    undo = undo_of([ev(1, "open", "d/m.tmp"), ev(2, "write", "d/m.tmp"),
                    ev(3, "close", "d/m.tmp", size=10), ev(4, "rename", "d/m.tmp", dst="d/m"),
                    ev(5, "fsync", "d", folder=True),
                    ev(6, "open", "d/m.tmp"), ev(7, "write", "d/m.tmp"),
                    ev(8, "close", "d/m.tmp", size=10),
                    ev(9, "rename", "d/m.tmp", dst="d/m", kept="k1"),
                    ev(10, "fsync", "d", folder=True, killed="power")])
    assert undo.renames == [("d/m", "d/m.tmp", "k1")]
    assert undo.cut == {"d/m": 0} and undo.removed == ["d/m.tmp"]
    assert undo.reasons["d/m"].endswith("the rename is undone; the file it had replaced comes "
                                        "back, and that one was never fsynced: left empty")
    # synced before the newer save: it comes back whole
    synced = undo_of([ev(1, "open", "d/m.tmp"), ev(2, "write", "d/m.tmp"),
                      ev(3, "fsync", "d/m.tmp", size=10), ev(4, "rename", "d/m.tmp", dst="d/m"),
                      ev(5, "fsync", "d", folder=True),
                      ev(6, "open", "d/m.tmp"), ev(7, "write", "d/m.tmp"),
                      ev(9, "rename", "d/m.tmp", dst="d/m", kept="k1"),
                      ev(10, "fsync", "d", folder=True, killed="power")])
    assert synced.cut == {} and synced.removed == ["d/m.tmp"]


def test_data_after_the_last_fsync_and_after_the_cut_is_lost_and_a_rewritten_old_file_is_empty():
    undo = undo_of([ev(1, "open", "a", existed=7, append=True), ev(2, "write", "a"),
                    ev(3, "open", "b", existed=9), ev(4, "write", "b"),
                    ev(5, "open", "c"), ev(6, "write", "c"), ev(7, "fsync", "c", size=4),
                    ev(8, "write", "c"), CUT, ev(100, "fsync", "c", size=8)])
    assert undo.cut == {"a": 7, "b": 0, "c": 4}
    assert undo.reasons["c"] == "written after its last fsync at 4 bytes"


def test_apply_undoes_renames_brings_back_what_they_replaced_and_cuts_files(tmp_path):
    work, kept = tmp_path / "work", tmp_path / "kept"
    work.mkdir()
    kept.mkdir()
    (work / "m").write_bytes(b"new")
    (kept / "k1").write_bytes(b"old")
    (work / "log").write_bytes(b"xyz")
    (work / "c").write_bytes(b"12345678")
    undo = undo_of([ev(1, "open", "m.tmp"), ev(2, "fsync", "m.tmp", size=3),
                    ev(3, "rename", "m.tmp", dst="m", kept="k1"), ev(4, "open", "log"),
                    ev(5, "open", "c"), ev(6, "fsync", "c", size=4), ev(7, "write", "c"), CUT])
    assert apply(undo, work, kept) == []
    assert {p.name: p.read_bytes() for p in work.iterdir()} == \
        {"m": b"old", "m.tmp": b"new", "c": b"1234"}
    assert not kept.exists()
