"""The site's generated pages (mkdocs-gen-files runs this at every build): the home page from the
README, the fault and checker references from their registries, and one page per finding from
``findings/``, so none of them can drift from the code."""
from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # findings/ is a folder of the repository, not an installed package

from findings import Finding, catalog  # noqa: E402
from pytest_reshard import chaos, checkers  # noqa: E402
from pytest_reshard.schedule import kinds  # noqa: E402


def write(path: str, text: str) -> None:
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(text)


def doc(obj: object) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip()


def home() -> None:
    """The README, its links made relative to the site's root."""
    write("index.md", (ROOT / "README.md").read_text().replace("](docs/", "]("))


def faults() -> None:
    lines = ["# Faults", "", doc(chaos), "",
             f"Registered kinds: {', '.join(f'`{k}`' for k in kinds.registered())}.", ""]
    for name in chaos.__all__:
        obj = getattr(chaos, name)
        if not inspect.isfunction(obj):
            continue
        lines += [f"## `chaos.{name}`", "", "```python", f"chaos.{name}{inspect.signature(obj)}",
                  "```", "", doc(obj), ""]
    write("reference/faults.md", "\n".join(lines))


def checker_reference() -> None:
    lines = ["# Checkers", "", doc(checkers).split("\n\nThe built-in checkers")[0], "",
             "| checker | column | runs on | assertion |", "|---|---|---|---|"]
    for c in checkers.registered():
        lines.append(f"| [`{c.name}`](#{c.name}) | {c.column} | {c.when} | "
                     f"`result.{c.assertion}()` |")
    lines.append("")
    for c in checkers.registered():
        fn = getattr(checkers, c.name, None)
        lines += [f"## {c.name}", "", doc(fn) if fn is not None else c.description, ""]
    write("reference/checkers.md", "\n".join(lines))


def upstream_link(ref: str) -> str:
    """``owner/repo#N`` as a link to the report; anything else as written."""
    m = re.match(r"([\w.-]+/[\w.-]+)#(\d+)", ref)
    if not m:
        return ref
    return ref.replace(m.group(0), f"[{m.group(0)}](https://github.com/{m.group(1)}/issues/"
                                   f"{m.group(2)})", 1)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


CKPT_CHAOS = ROOT / "findings" / "ckpt_chaos.json"   # bench/findings_vs_ckpt_chaos.py writes it


def ckpt_chaos_runs() -> dict:
    """ckpt-chaos's measured verdicts per entry (``{}`` before the benchmark has run)."""
    return json.loads(CKPT_CHAOS.read_text()) if CKPT_CHAOS.exists() else {}


def ckpt_chaos_name(runs: dict) -> str:
    return f"ckpt-chaos {runs.get('ckpt_chaos_version', '0.1.8')}"


def ckpt_chaos_verdict(runs: dict, slug: str) -> str:
    """"PASS x4", "HARD_FAIL x2, PASS x2", "not applicable: reason", or "not measured"."""
    entry = runs.get(slug)
    if entry is None:
        return "not measured"
    if entry.get("exit") is None and entry.get("note", "").startswith("not applicable"):
        return entry["note"]
    counts = ", ".join(f"{v} x{n}" for v, n in sorted(entry.get("verdicts", {}).items(),
                                                      key=lambda kv: (-kv[1], kv[0])))
    control = entry.get("control")
    if control not in (None, "PASS"):
        counts = f"{counts}; control {control}" if counts else f"control {control}"
    return counts or f"no verdict ({entry.get('note', '')})"


def ckpt_chaos_line(runs: dict, slug: str) -> str:
    """The finding page's row: the verdicts, then how they were measured."""
    verdict = ckpt_chaos_verdict(runs, slug)
    entry = runs.get(slug)
    if entry is None or entry.get("exit") is None:
        return verdict
    how = (f"`ckpt-chaos run` on the buggy `train.py`, {sum(entry['verdicts'].values())} crash "
           f"points (mode `before`), no result file; exit {entry['exit']}, "
           f"{entry['seconds']:.0f} s, measured {runs.get('measured', '?')}")
    return f"{verdict} ({how}{'; ' + entry['note'] if entry.get('note') else ''})"


def finding_page(slug: str, f: Finding, runs: dict) -> str:
    faults = ", ".join(str(x) for x in f.faults())
    train = (f.folder / "train.py").read_text()
    reproduce = (f.folder / "reproduce.py").read_text()
    fixed = " ".join(f.fixed_args)
    return f"""# {f.title}

| | |
|---|---|
| upstream | {cell(upstream_link(f.upstream))} |
| has the bug | {cell(f.affected)} |
| fixed | {cell(f.fixed)} |
| reproduced with | {cell(f.reproduced_with)} |
| the harness's verdict | `{f.checker}` fails: "...{cell(f.message)}..." |
| scenario | {f.world_size} ranks, {f.steps} steps, `{cell(faults)}` |
| {ckpt_chaos_name(runs)}'s verdict | {cell(ckpt_chaos_line(runs, slug))} |

{f.notes}

## Without the harness

```
python findings/{slug}/reproduce.py            # shows the bug, exits 1
python findings/{slug}/reproduce.py {fixed}    # the fix, exits 0
```

```python
{reproduce.rstrip()}
```

## Under the harness

`tests/scenarios/test_findings.py` runs `findings/{slug}/train.py` with the faults above: the
bug fails `{f.checker}`, and `{fixed}` passes every checker
(`python -m pytest tests/scenarios/test_findings.py -k {slug} --reshard-nightly`).

```python
{train.rstrip()}
```
"""


def findings() -> None:
    entries = catalog()
    runs = ckpt_chaos_runs()
    peer = ckpt_chaos_name(runs)
    lines = ["# Findings", "",
             "Real upstream bugs the harness finds, one folder each under `findings/`: a user's "
             "script under the harness that the named checker fails (and that passes every "
             "checker with the fix), and a reproduction without the harness. Each page says "
             "what broke, in which versions, how the harness saw it and what it needed.", "",
             f"The last column is what {peer}, our closest peer, says of the same buggy script, "
             f"measured ({runs.get('measured', 'not yet')}; `bench/findings_vs_ckpt_chaos.py`): "
             "its `run` mode kills the job before a few of its file events, resumes it with the "
             "same command and judges the resume. With no result file to compare (these scripts "
             "write none) it can tell only a resume that exits non-zero (`HARD_FAIL`) from one "
             "that exits 0 (`PASS`); an entry whose fault it cannot inject says why.", "",
             f"| finding | upstream | has the bug | fixed | checker | {peer} |",
             "|---|---|---|---|---|---|"]
    for slug, f in entries.items():
        lines.append(f"| [{cell(f.title)}]({slug}.md) | {cell(upstream_link(f.upstream))} | "
                     f"{cell(f.affected)} | {cell(f.fixed)} | `{f.checker}` | "
                     f"{cell(ckpt_chaos_verdict(runs, slug))} |")
        write(f"findings/{slug}.md", finding_page(slug, f, runs))
    lines += ["", "What the harness ran into that is no other project's bug is "
              "[found while building the harness](while-building.md).", ""]
    write("findings/index.md", "\n".join(lines))


home()
faults()
checker_reference()
findings()
