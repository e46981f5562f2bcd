"""The package's layering, checked on the source: each module imports only its own layer or a
lower one, so the pipeline reads one way (docs/architecture.md, "Layers"). Imports under
``if TYPE_CHECKING:`` are for annotations only and not counted."""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS = [
    ("pytest_reshard.contract", "pytest_reshard.verdict", "pytest_reshard.procfs"),
    ("pytest_reshard.rank", "pytest_reshard.probe", "pytest_reshard.filewatch", "pytest_reshard.telemetry",
     "pytest_reshard.schedule", "pytest_reshard.strategies", "pytest_reshard.chaos"),
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


#: What the rank side may import: a training script that imports the probe pulls in nothing else.
RANK_SIDE_MAY_IMPORT = ("pytest_reshard.contract", "pytest_reshard.procfs", "pytest_reshard.rank")
#: Optional device libraries the rank side may import inside a function, where it needs them
#: (telemetry's NVML reader); never at module level.
RANK_SIDE_LAZY = ("pynvml", "torch")


def rank_side_imports(path: Path):
    """(line, imported module, at module level?) for every import of a rank-side file, those
    under ``if TYPE_CHECKING:`` included: the rank side names nothing of the harness at all."""
    tree = ast.parse(path.read_text())
    nested = {id(n) for node in ast.walk(tree)
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
              for n in ast.walk(node) if n is not node}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            names += [node.module] if node.module != "pytest_reshard" else []
        for name in names:
            yield node.lineno, name, id(node) not in nested


RANK_SIDE = sorted((ROOT / "pytest_reshard" / "rank").glob("*.py"))


@pytest.mark.parametrize("path", RANK_SIDE, ids=[p.name for p in RANK_SIDE])
def test_the_rank_side_imports_only_the_standard_library_the_contract_and_itself(path):
    stdlib = sys.stdlib_module_names
    foreign = sorted(f"{path.name}:{line}: {target}" for line, target, top in rank_side_imports(path)
                     if target.split(".")[0] not in stdlib
                     and not any(target == o or target.startswith(o + ".") for o in RANK_SIDE_MAY_IMPORT)
                     and not (not top and target.split(".")[0] in RANK_SIDE_LAZY))
    assert not foreign, f"the rank side imports {foreign}; a training script must not pull them in"


def test_the_rank_side_rule_sees_the_whole_rank_package():
    assert {p.name for p in RANK_SIDE} >= {"__init__.py", "probe.py", "filewatch.py", "telemetry.py"}


def import_graph(*, include_type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports, function-level imports included (they run too).
    An import of a package's own ancestor is not an edge: the child is part of it."""
    paths = dict(modules())

    def resolve(target: str) -> str | None:
        while target and target not in paths:
            target = target.rpartition(".")[0]
        return target or None

    graph = {}
    for name, path in paths.items():
        found = {resolve(t) for _, t in imports(path) if t.startswith("pytest_reshard")}
        graph[name] = {t for t in found if t and t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    """Two modules that import each other (at the top or inside a function) are one module split
    in two: a reader cannot understand either alone, and the import order decides what works."""
    graph = import_graph()
    found = cycles(graph)
    described = ["\n  ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c) for c in found]
    assert not found, "import cycles:\n  " + "\n\n  ".join(described)


def test_only_the_contract_and_the_history_read_an_events_name():
    """Everyone else asks ``contract.name_of`` or the history's records: one reader of the wire."""
    readers = ("pytest_reshard.contract", "pytest_reshard.history")
    found = []
    for name, path in modules():
        if name.startswith(readers):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            key = node.slice if isinstance(node, ast.Subscript) else \
                node.args[0] if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get" \
                and node.args else None
            if isinstance(key, ast.Constant) and key.value == "ev":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "raw reads of an event's name: " + ", ".join(found)
