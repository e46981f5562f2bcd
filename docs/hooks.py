"""MkDocs hook: one navigation entry per catalogue entry, under Findings, so the pages the
generator writes (``gen_pages.py``) have a place in the sidebar without a list kept by hand."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def on_config(config):
    sys.path.insert(0, str(ROOT))   # findings/ is a folder of the repository, not a package
    from findings import catalog

    for section in config["nav"]:
        if isinstance(section, dict) and "Findings" in section:
            section["Findings"][1:1] = [{slug.replace("_", " "): f"findings/{slug}.md"}
                                        for slug in catalog()]
    return config
