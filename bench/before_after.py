"""One benchmark against two commits, interleaved: what a change bought, side by side in one run.

    python bench/before_after.py --before fb43081 --after HEAD --repeats 3 -- \\
        bench/relaunch.py --repeats 1 --launchers fork

Each commit's package (``pytest_reshard``, ``fixtures``, ``chaos``, ``tests/workloads``) is
exported with ``git archive`` into a temporary folder laid out as the installed package, and the
benchmark (this checkout's file, the same for both) runs in that folder with it first on
``PYTHONPATH``: its fork server, its ranks and its cold interpreters import that commit's code
(``RESHARD_BENCH_TREE`` names the export, for a benchmark that runs a script of tests/workloads).
Runs alternate before/after so both see the same machine noise. A benchmark taking part prints
one line ``JSON {"figure": seconds, ...}`` (its ``--json`` flag); this prints each figure's
median per commit and their ratio, and the machine's load average while it ran.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("pytest_reshard", "fixtures", "chaos", "tests/workloads")


def export(rev: str, into: Path) -> Path:
    """The commit's package under ``into/pkg`` (importable as pytest_reshard); ``into`` also
    holds its ``tests/workloads``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *PARTS], check=True,
                             capture_output=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=120)
    pkg = into / "pkg" / "pytest_reshard"
    shutil.copytree(into / "pytest_reshard", pkg)
    shutil.copytree(into / "fixtures", pkg / "fixtures")
    shutil.copytree(into / "chaos", pkg / "chaos")
    return into


def run_once(tree: Path, bench: list[str], timeout: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "pkg"), os.environ.get("PYTHONPATH", "")]),
           "RESHARD_BENCH_TREE": str(tree)}
    # In the package's folder: ``python -m`` puts the working directory first on sys.path, and
    # this checkout's would shadow the exported package.
    script = str((ROOT / bench[0]).resolve())
    proc = subprocess.run([sys.executable, script, *bench[1:]], cwd=tree / "pkg", env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("JSON ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(bench)} failed ({proc.returncode}) on {tree}:\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][5:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True)
    p.add_argument("--after", default="HEAD")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark run")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="-- bench/SCRIPT.py ARGS (with --json)")
    args = p.parse_args()
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if "--json" not in bench:
        bench.append("--json")
    revs = {"before": args.before, "after": args.after}
    figures: dict[str, dict[str, list[float]]] = {k: {} for k in revs}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {k: export(rev, Path(tmp) / k) for k, rev in revs.items()}
        for i in range(args.repeats):
            for k, tree in trees.items():
                got = run_once(tree, bench, args.timeout)
                for name, value in got.items():
                    figures[k].setdefault(name, []).append(value)
                print(f"run {i} {k:6s} ({revs[k]}): "
                      + ", ".join(f"{n} {v:.3f}" for n, v in got.items()), flush=True)
                loads.append(os.getloadavg()[0])
    print(f"{' '.join(bench)}: median of {args.repeats}, {revs['before']} -> {revs['after']} "
          f"(1-min load average {min(loads):.1f}..{max(loads):.1f} on {os.cpu_count()} CPUs)")
    for name in dict.fromkeys([*figures["before"], *figures["after"]]):
        b, a = (statistics.median(figures[k][name]) if name in figures[k] else None for k in revs)
        ratio = f"{b / a:.2f}x" if a and b is not None else ""
        print(f"  {name:40s} {'-' if b is None else f'{b:9.3f}':>9s} -> "
              f"{'-' if a is None else f'{a:9.3f}':>9s}   {ratio}")


if __name__ == "__main__":
    main()
