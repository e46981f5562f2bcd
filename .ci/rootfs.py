"""Write a root filesystem tar for the CI's docker image to stdout (for ``docker import``).

    python .ci/rootfs.py .venv | docker import --change 'ENV PATH=/opt/venv/bin:/usr/bin:/bin' - reshard-ci:local

No registry is reachable here, and debootstrap takes minutes, so the image is made of what CI
already built: the Python the venv runs on (at the same path, without its own site-packages, test
suite and static library), the venv itself as /opt/venv (torch CPU, numpy, pytest; its editable
pytest-reshard points at the checkout, which the docker backend mounts at the same path), the
shared libraries all of them link against (the ldd closure, so no distribution is needed), /tmp
and a passwd file. About 1 GB, mostly torch.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

SKIP = re.compile(r"/(site-packages|test|tests|idlelib|tkinter|ensurepip|config-[^/]*)(/|$)|"
                  r"\.a$|/__pycache__/.*\.opt-[12]\.pyc$")


def shared_libraries(files: list[Path]) -> set[str]:
    """System libraries the ELF files need (paths outside the trees we copy)."""
    libs: set[str] = set()
    for chunk in range(0, len(files), 200):
        out = subprocess.run(["ldd", *map(str, files[chunk:chunk + 200])], capture_output=True,
                             text=True, check=False).stdout
        for m in re.finditer(r"(?:=>\s*)?(/\S+)\s+\(0x", out):
            libs.add(m.group(1))
    return libs


def elf_files(root: Path) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and (path.suffix == ".so" or ".so." in path.name
                                                         or path.parent.name == "bin"):
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    found.append(path)
    return found


def main() -> int:
    venv = Path(sys.argv[1]).resolve()
    home = next(line.split("=", 1)[1].strip() for line in (venv / "pyvenv.cfg").read_text()
                .splitlines() if line.startswith("home"))
    python_root = Path(home).resolve().parent   # .../versions/3.11.7 (bin/ is home)
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        write(tar, venv, python_root)
    return 0


def write(tar: tarfile.TarFile, venv: Path, python_root: Path) -> None:
    def add_dir(name: str, mode: int = 0o755) -> None:
        info = tarfile.TarInfo(name.lstrip("/"))
        info.type, info.mode = tarfile.DIRTYPE, mode
        tar.addfile(info)

    def add_file(name: str, data: bytes, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(name.lstrip("/"))
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))

    add_dir("tmp", 0o1777)
    add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    add_file("etc/group", b"root:x:0:\n")
    tar.add(python_root, arcname=str(python_root).lstrip("/"),
            filter=lambda t: None if SKIP.search("/" + t.name) else t)
    tar.add(venv, arcname="opt/venv",  # torch's C++ headers and its own tests: not run here
            filter=lambda t: None if re.search(r"/torch/(include|test)(/|$)", "/" + t.name) else t)
    wanted = shared_libraries([*elf_files(venv), *elf_files(python_root / "bin"),
                               *elf_files(python_root / "lib")])
    for lib in sorted(wanted):
        if lib.startswith((str(venv), str(python_root))):
            continue
        tar.add(os.path.realpath(lib), arcname=lib.lstrip("/"))   # the file, under its soname


if __name__ == "__main__":
    sys.exit(main())
