"""``pytest-reshard``: the main job (a bundled chaos suite) and replays of saved scenarios.

    pytest-reshard smoke                 # bundled smoke suite against both bundled workloads, on CPU
    pytest-reshard dflash                # the target + drafter pipeline under role-aware chaos
    pytest-reshard smoke -- -k preempt   # extra pytest arguments after --
    pytest-reshard replay reshard-artifacts/<test>/scenario.json
    pytest-reshard sweep train.py --world-size 2 --steps 8   # a crash at every file event of a save
    pytest-reshard gate --old venv:torch==2.13.0 --new venv:torch==2.14.1   # upgrade gate
    pytest-reshard judge DIR [--reference DIR]   # judge a production job recorded with RESHARD_RECORD=DIR
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from pytest_reshard.contract import RunDir



def _suites_dir() -> Path:
    from pytest_reshard.chaos import suites

    return Path(suites.__file__).parent


def suites() -> list[str]:
    return sorted(p.stem for p in _suites_dir().glob("*.py") if not p.stem.startswith("_"))


def run_suite(name: str, artifacts: str, extra: list[str]) -> int:
    import pytest

    path = Path(name).resolve() if name.endswith(".py") else _suites_dir() / f"{name}.py"
    if not path.exists():
        print(f"pytest-reshard: no suite {name!r}; bundled suites: {', '.join(suites())}",
              file=sys.stderr)
        return 2
    return int(pytest.main([str(path), "--rootdir", str(path.parent), "-o", "addopts=",
                            "--import-mode=importlib", "-p", "no:cacheprovider", "-v",
                            f"--reshard-artifacts={artifacts}", *extra]))


def replay(scenario_path: str, artifacts: str) -> int:
    from pytest_reshard.reports.table import verdict_table
    from pytest_reshard.session import Session
    from pytest_reshard.supervisor import Scenario

    path = Path(scenario_path)
    if path.is_dir():
        path = RunDir(path).scenario
    if not path.exists():
        print(f"pytest-reshard: {path} not found; pass a scenario.json from an artifacts folder",
              file=sys.stderr)
        return 2
    scenario = Scenario.from_dict(json.loads(path.read_text()))
    with Session(Path(artifacts).resolve(), progress=lambda m: print(f"  {m}", flush=True)) as s:
        result = s.run(scenario, f"replay-{scenario.schedule.hash}")
    print("\n".join(verdict_table([result])))
    print(f"artifacts: {result.run_dir}")
    if result.report is not None:
        print(f"report: {result.report}")
    return 0 if result.verdict.status == "pass" else 1


SWEEP_TEST = '''"""A crash at every file event of one save of {name} (written by pytest-reshard sweep)."""
import pytest


@pytest.mark.reshard(workload={workload!r}, world_size={world_size}, steps={steps}, args={args!r})
@pytest.mark.reshard_sweep(save_step={save_step!r}, rank={rank}, flip={flip}, power={power})
def test_crash_at_file_event(reshard_run, file_point):
    file_point.judge(reshard_run(faults=[file_point.fault()]))
'''


def sweep(args: argparse.Namespace, extra: list[str]) -> int:
    """Write the sweep of ``args.target`` as a test module in the artifacts folder, and run it."""
    script = Path(args.target or "")
    if not script.is_file():
        print(f"pytest-reshard sweep: {args.target!r} is not a file; pass the training script "
              "to sweep (pytest-reshard sweep train.py --world-size 2 --steps 8)", file=sys.stderr)
        return 2
    folder = Path(args.artifacts).resolve() / "_sweep"
    folder.mkdir(parents=True, exist_ok=True)
    test = folder / f"test_sweep_{script.stem}.py"
    test.write_text(SWEEP_TEST.format(
        name=script.name, workload=str(script.resolve()), world_size=args.world_size,
        steps=args.steps, args=shlex.split(args.args), save_step=args.save_step, rank=args.rank,
        flip=args.flip, power=args.power))
    print(f"the sweep as a test (copy it into your suite): {test}", flush=True)
    return run_suite(str(test), args.artifacts, extra)


JUDGE_EXIT = """exit status: 0 no check failed (some may be unknown: read them), 1 a check failed,
2 could not judge: the folder holds no recording it can read, or a damaged one (nothing is
judged; the message names the first damaged line), 3 with --strict: no check failed but some are
unknown"""


def judge_main(argv: list[str]) -> int:
    """``pytest-reshard judge DIR``: the checkers on a job recorded in record mode."""
    from pytest_reshard.history import HistoryError
    from pytest_reshard.reports.table import verdict_table
    from pytest_reshard.session.judge import judge, summary

    parser = argparse.ArgumentParser(
        prog="pytest-reshard judge", epilog=JUDGE_EXIT,
        description="Judge a job recorded with RESHARD_RECORD=DIR (or probe.attach(record=DIR)) "
                    "under any launcher: print the verdict table, write verdict.json and "
                    "report.html.")
    parser.add_argument("folder", help="the folder the job recorded into")
    parser.add_argument("--reference", default=None,
                        help="a recording of the same job run without failures: the clean run "
                             "loss_continuity and exactly_once_samples compare with")
    parser.add_argument("--out", default=None,
                        help="where verdict.json and report.html go (default: the folder)")
    parser.add_argument("--json", action="store_true",
                        help="print the verdicts as JSON instead of the table")
    parser.add_argument("--html", action="store_true",
                        help="print only the path of report.html (for a script that opens it)")
    parser.add_argument("--no-html", action="store_true", help="do not write report.html")
    parser.add_argument("--strict", action="store_true",
                        help="exit 3 when no check failed but some are unknown")
    args = parser.parse_args(argv)
    try:
        result = judge(args.folder, reference=args.reference, out=args.out,
                       html=not args.no_html)
    except HistoryError as e:
        print(f"pytest-reshard judge: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary(result), indent=2, default=str))
    elif args.html:
        print(result.report or "")
    else:
        for g in result.history.generations.values():
            print(f"generation {g.gen}: {g.world_size} ranks, resumed at step {g.resume_step}, "
                  f"ended by {g.cause}{' (planned)' if g.planned else ''}: {g.detail}")
        print("\n".join(verdict_table([result])))
        print(f"verdicts: {RunDir(result.run_dir).verdict}")
        if result.report is not None and result.verdict.status == "pass":
            print(f"report: {result.report}")   # the table names it when something did not pass
    if result.history.damaged:   # every check is unknown: not a verdict on the job
        d = result.history.damaged[0]
        print(f"pytest-reshard judge: could not judge {args.folder}: its recording is damaged at "
              f"{d.file}:{d.line} ({d.why}); judge a complete copy of the recording, or keep "
              "one job per folder", file=sys.stderr)
        return 2
    status = result.verdict.status
    return 1 if status == "fail" else 3 if args.strict and status == "unknown" else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest-reshard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", help=f"a suite ({', '.join(suites())}), 'replay', 'sweep', "
                        "'gate' (see pytest-reshard gate --help) or 'judge' (pytest-reshard judge "
                        "--help)")
    parser.add_argument("target", nargs="?", help="for replay: a scenario.json or its folder; "
                        "for sweep: the training script")
    parser.add_argument("--artifacts", default="reshard-artifacts", help="artifacts folder")
    sweep_opts = parser.add_argument_group("sweep SCRIPT: a crash at every file event of a save")
    sweep_opts.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    sweep_opts.add_argument("--steps", type=int, default=8, help="training steps (default 8)")
    sweep_opts.add_argument("--save-step", type=int, default=None,
                            help="the step whose save is swept (default: the second save)")
    sweep_opts.add_argument("--rank", type=int, default=0, help="the rank killed (default 0)")
    sweep_opts.add_argument("--flip", action="store_true",
                            help="also flip a byte of each data file after it is written")
    sweep_opts.add_argument("--power", action="store_true",
                            help="also cut the machine's power before each event: what was not "
                                 "fsynced is lost (power_loss)")
    sweep_opts.add_argument("--args", default="", help="the script's own arguments, one string")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gate"]:  # its own options: pytest-reshard gate --help
        from pytest_reshard.gate.stacks import main as gate_main

        return gate_main(argv[1:])
    if argv[:1] == ["judge"]:  # its own options: pytest-reshard judge --help
        return judge_main(argv[1:])
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    if args.command == "sweep":
        return sweep(args, extra)
    if args.command == "replay":
        if not args.target:
            parser.error("replay needs the path of a scenario.json")
        return replay(args.target, args.artifacts)
    return run_suite(args.command, args.artifacts, extra)


if __name__ == "__main__":
    sys.exit(main())
