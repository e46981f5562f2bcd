"""The framework guide's examples as files, so a test runs each one unchanged: a change to the
docs that breaks its own example fails a test instead of a user's first try."""
from __future__ import annotations

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide" / "frameworks.md"


def example(section: str) -> str:
    """The first ```python block under the ``## {section}`` heading of the frameworks guide."""
    text = GUIDE.read_text()
    start = text.index(f"\n## {section}\n")
    block = re.search(r"```python\n(.*?)```", text[start:], re.S)
    if block is None:
        raise LookupError(f"{GUIDE} has no ```python block under '## {section}'")
    return block.group(1)


def write(section: str, folder: Path, name: str) -> Path:
    """Write the ``section`` example to ``folder/name`` and return its path."""
    path = Path(folder) / name
    path.write_text(example(section))
    return path
