"""The Lightning adapter's planned-stop save stays the one ``ckpt_path="last"`` resumes from
(Lightning takes the ``last*.ckpt`` with the latest mtime), without importing Lightning."""
import os

from pytest_reshard.adapters.lightning import newest_last


def _touch(path, ns):
    path.write_bytes(b"x")
    os.utime(path, ns=(ns, ns))


def _newest_last(folder):
    lasts = [p for p in folder.iterdir() if p.name.startswith("last") and p.suffix == ".ckpt"]
    return max(lasts, key=lambda p: p.stat().st_mtime_ns).name


def test_a_later_last_ckpt_is_outdated_by_the_stops_save(tmp_path, capsys):
    t = 1_700_000_000 * 10**9
    _touch(tmp_path / "last-stop.ckpt", t)
    _touch(tmp_path / "last.ckpt", t + 5_000)           # 5 us later: the epoch-end save
    _touch(tmp_path / "epoch=1-step=6.ckpt", t + 9 * 10**9)   # not a "last": ignored
    newest_last(str(tmp_path / "last-stop.ckpt"))
    assert _newest_last(tmp_path) == "last-stop.ckpt"
    # by more than Lightning's datetime resolution (microseconds)
    gap = (tmp_path / "last-stop.ckpt").stat().st_mtime_ns - (tmp_path / "last.ckpt").stat().st_mtime_ns
    assert gap >= 1_000_000
    assert "last.ckpt was written after it" in capsys.readouterr().err


def test_an_older_last_ckpt_leaves_the_stops_save_untouched(tmp_path, capsys):
    t = 1_700_000_000 * 10**9
    _touch(tmp_path / "last.ckpt", t)
    _touch(tmp_path / "last-stop.ckpt", t + 10**9)
    newest_last(str(tmp_path / "last-stop.ckpt"))
    assert (tmp_path / "last-stop.ckpt").stat().st_mtime_ns == t + 10**9
    assert capsys.readouterr().err == ""
