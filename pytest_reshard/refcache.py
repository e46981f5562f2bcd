"""An opt-in cache of clean reference runs across sessions (``--reshard-reference-cache=DIR``).

A reference run is a fault-free run of the same workload, seed and data; a chaos suite repeats the
same few for every session. This cache keeps each one under a key made of everything that shapes
its result, and it is invalid (a miss, so the run happens again) as soon as any of them changes:

- the scenario less its faults (workload, world size and roles, steps, seed, args, backend,
  limits; not the judging thresholds, the device classes and their throttle);
- the workload's code: a script's bytes and those of every module it imports from its own folder
  (recursively), or, for a workload run as a module (``lm``, ``dflash``), the source of the whole
  ``pytest_reshard`` package;
- the stack: the versions of pytest-reshard, torch and Python, and the interpreter's path.

What is not in the key is not seen: data a script reads from elsewhere (a dataset on disk), the
environment, the machine. Point the cache at a fresh folder when those change, or leave it off.
Only runs whose last generation completed are kept.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from pytest_reshard.history import History

__all__ = ["ReferenceCache", "workload_files", "resolve_workload"]


class ReferenceCache:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def key(self, scenario: dict[str, Any], workload_files: list[Path]) -> str:
        """The cache key of a clean scenario (``Scenario.to_dict()``, faults already gone)."""
        import torch

        from importlib.metadata import version

        h = hashlib.sha256(json.dumps(scenario, sort_keys=True).encode())
        for part in (version("pytest-reshard"), torch.__version__, sys.version, sys.executable):
            h.update(b"\0" + part.encode())
        for path in sorted(workload_files):
            h.update(b"\0" + str(path).encode() + b"\0" + path.read_bytes())
        return h.hexdigest()[:20]

    def get_or_run(self, key: str, run: Callable[[Path], History]) -> History:
        """The cached history for ``key``, or ``run(folder)``'s, kept if it completed."""
        hit = self.folder / key
        if (hit / "events").is_dir():
            return History.load(hit)
        with tempfile.TemporaryDirectory(dir=self.folder, prefix=".run-") as tmp:
            history = run(Path(tmp) / "run")
            if history.finished():
                try:
                    (Path(tmp) / "run").rename(hit)
                    return History.load(hit)
                except OSError:  # another session stored it first: theirs is as good
                    pass
            return History.load(Path(tmp) / "run") if (Path(tmp) / "run").exists() else history


def marker_options(node: Any, name: str) -> dict[str, Any]:
    """The keyword arguments of every ``name`` marker on ``node``: the module's, then the class's,
    then the test's own, each overriding the one before."""
    options: dict[str, Any] = {}
    for marker in reversed(list(node.iter_markers(name))):
        options.update(marker.kwargs)
    return options


def resolve_workload(workload: str, test_file: Path) -> str:
    """A bundled workload's name as it is; a script's path relative to the test file (else to
    the working directory), made absolute."""
    from pytest_reshard import workloads

    if workloads.get(workload) is None and not os.path.isabs(workload):
        candidate = test_file.parent / workload
        return str(candidate if candidate.exists() else Path(workload).resolve())
    return workload


def workload_files(argv: list[str]) -> list[Path]:
    """The files whose bytes shape a rank's run: a script and the modules it imports from its
    own folder (recursively); for ``-m module``, every source file of ``pytest_reshard``."""
    if argv[0] == "-m":
        package = Path(__file__).resolve().parent
        roots = [package, package.parent / "chaos", package.parent / "fixtures"]
        return sorted(p for root in roots if root.is_dir() for p in root.rglob("*.py"))
    script = Path(argv[0]).resolve()
    seen: set[Path] = set()
    todo = [script]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError:
            continue  # the run will fail and not be cached; its bytes are in the key anyway
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and \
                node.level == 0 else []
            for name in names:
                local = script.parent.joinpath(*name.split("."))
                todo += [local.with_suffix(".py"), local / "__init__.py"]
    return sorted(seen)
