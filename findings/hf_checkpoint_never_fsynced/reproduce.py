"""The bug without the harness, in one process: a Trainer trains 2 steps and saves
checkpoint-2; every fsync and fdatasync the process makes is counted by the path it syncs.
Exits 1 when no file of checkpoint-2 and not the folder was synced (transformers 5.24.0: none
is), or 0 with ``--fixed`` (train.py's on_save callback syncs them). A power loss cannot be
shown in a process; what it takes is what was never synced."""
import os
import sys
import tempfile
from pathlib import Path

synced: list[str] = []
for name in ("fsync", "fdatasync"):
    original = getattr(os, name)

    def counted(fd, original=original):
        synced.append(os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}"))
        return original(fd)
    setattr(os, name, counted)

fixed = "--fixed" in sys.argv
with tempfile.TemporaryDirectory() as d:
    os.chdir(d)
    sys.argv = [str(Path(__file__).parent / "train.py"), "--steps", "2"] + \
        (["--fixed"] if fixed else [])
    import runpy
    runpy.run_path(sys.argv[0], run_name="__main__")
    folder = Path(d, "hf-out", "checkpoint-2").resolve()
    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    mine = {os.path.relpath(s, folder) for s in synced if s.startswith(str(folder))}
    print(f"checkpoint-2 holds {len(files)} files: {', '.join(files)}")
    print(f"fsynced: {', '.join(sorted(mine)) or 'none of them, nor the folder'}")
    missing = [f for f in files if f not in mine] + ([] if "." in mine else ["the folder"])
    if missing:
        print(f"never synced: {', '.join(missing)}: a power loss may take them, though the "
              "Trainer reported the checkpoint saved")
        sys.exit(1)
    sys.exit(0)
