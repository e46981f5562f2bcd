"""The package's layering, checked on the source: each module imports only its own layer or a
lower one, so the pipeline reads one way (docs/architecture.md, "Layers"). Imports under
``if TYPE_CHECKING:`` are for annotations only and not counted."""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS = [
    ("pytest_reshard.contract", "pytest_reshard.verdict"),
    ("pytest_reshard.probe", "pytest_reshard.filewatch", "pytest_reshard.telemetry", "pytest_reshard.schedule",
     "pytest_reshard.chaos"),
    ("pytest_reshard.supervisor", "pytest_reshard.workloads", "pytest_reshard.fixtures",
     "pytest_reshard.adapters"),
    ("pytest_reshard.history",),
    ("pytest_reshard.checkers",),
    ("pytest_reshard.result", "pytest_reshard.reports"),
    ("pytest_reshard.session", "pytest_reshard.refcache", "pytest_reshard.checkpoints",
     "pytest_reshard.gate"),
    ("pytest_reshard.plugin", "pytest_reshard.cli", "pytest_reshard.parallel", "pytest_reshard.sweep",
     "pytest_reshard.chaos.suites", "pytest_reshard"),
]
#: Folders installed under another name (see pyproject's package-dir).
SOURCES = {"pytest_reshard": ROOT / "pytest_reshard", "pytest_reshard.chaos": ROOT / "chaos",
           "pytest_reshard.fixtures": ROOT / "fixtures"}


def layer_of(module: str) -> int | None:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def modules():
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("").parts
            if package == "pytest_reshard" and rel[0] in ("chaos", "fixtures"):
                continue
            name = ".".join((package, *rel))
            yield name.removesuffix(".__init__"), path


def imports(path: Path):
    """(line, imported module) for every import outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"
            for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:  # from pytest_reshard import checkers
                yield node.lineno, f"{node.module}.{alias.name}"


def test_no_module_imports_a_layer_above_its_own():
    wrong = []
    for name, path in modules():
        mine = layer_of(name)
        assert mine is not None, f"{name} is in no layer: add it to LAYERS"
        for line, target in imports(path):
            theirs = layer_of(target) if target.startswith("pytest_reshard") else None
            if theirs is not None and theirs > mine and target != "pytest_reshard":
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} (layer {mine}) imports "
                             f"{target} (layer {theirs})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", ["probe.py", "filewatch.py"])
def test_the_probe_imports_only_the_standard_library_and_the_contract(module):
    stdlib = sys.stdlib_module_names
    found = {target for _, target in imports(ROOT / "pytest_reshard" / module)}
    ours = ("pytest_reshard.contract", "pytest_reshard.filewatch")
    foreign = sorted(t for t in found
                     if t.split(".")[0] not in stdlib and t not in ours
                     and not t.startswith(tuple(o + "." for o in ours)))
    assert not foreign, f"the probe imports {foreign}; a training script must not pull them in"
