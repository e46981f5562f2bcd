"""Reports people look at: chart data read from histories, the SVG and HTML built from it, the
PNGs (or why they were skipped), the session index, and the live progress line. Pure parts,
on hand-built histories; the browser test (test_report_browser.py) renders a real one."""
import sys
from pathlib import Path





def test_reports_modules_do_not_import_matplotlib_or_torch_until_drawing():
    import subprocess

    code = ("import sys, pytest_reshard.reports.html, pytest_reshard.reports.charts, pytest_reshard.reports.progress; "
            "assert 'matplotlib' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=Path(__file__).parent)
