"""The docs site builds with MkDocs in strict mode: a broken link or anchor, a page outside the
docs folder, a generated page (a finding, a fault, a checker) whose source breaks, fail here."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    pages = {p.parent.name for p in (tmp_path / "site" / "findings").glob("*/index.html")}
    from findings import catalog
    assert set(catalog()) <= pages, sorted(set(catalog()) - pages)
