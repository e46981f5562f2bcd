"""``pytest-reshard gate``: the same suite in the old and the new stack, then what got worse.

    pytest-reshard gate --old venv:torch==2.13.0 --new venv:torch==2.14.1 \\
        --fail "peak_mem:+150MB,step_time:+10%,throughput:-10%"

In each environment (``pytest_reshard.gate.envs``) it runs the suite (default ``upgrade``: the
bundled LM under a fixed per-rank memory budget, steady and through a reshard), every rank in a
cold interpreter (``gate.COLD_LAUNCHER``: a rank forked from the harness's warm server
maps the memory the server preloaded and starts warm, so its figures would move with the
harness, not the stack), and saves its numbers as a baseline; the old stack also
writes a DCP checkpoint at world size 4, which the new stack loads at world size 3
(``pytest_reshard.checkpoints.compat``). Then it prints both stacks side by side and fails
(exit 1) when a number passed a limit of ``--fail``, a scenario failed or ran in one stack
only, or the checkpoint did not load into an equal state. ``--plant`` adds a regression
to the new stack on purpose (``memory=200MB,step_time=50ms``: every rank holds 200 MB more and
sleeps 50 ms a step), to see the gate catch it.

Everything lands in ``--dir`` (``.reshard-gate/``): ``old/`` and ``new/`` (logs, artifacts),
``baselines/``, ``checkpoint/``, and ``report.json`` and ``report.md`` (for a CI summary).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_reshard.gate import baseline as gate
from pytest_reshard.gate.envs import Env, EnvError, parse_env

PLANT_ENV = "RESHARD_GATE_PLANT"
_PLANT_UNITS: dict[str, dict[str, float]] = {"memory": {"b": 1, "kb": 2**10, "mb": 2**20, "gb": 2**30},
                "step_time": {"ms": 1e-3, "s": 1.0}}


def parse_plant(text: str) -> dict[str, float]:
    """``memory=200MB,step_time=50ms`` -> {"memory": bytes, "step_time": seconds} (ValueError)."""
    plant: dict[str, float] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        m = re.fullmatch(r"(?P<what>[a-z_]+)=(?P<num>\d+(?:\.\d+)?)(?P<unit>[a-zA-Z]+)", term)
        units = _PLANT_UNITS.get(m["what"]) if m else None
        if not m or units is None or m["unit"].lower() not in units:
            raise ValueError(f"--plant {term!r}: write memory=N(MB|GB) or step_time=N(ms|s), "
                             "comma-separated")
        plant[m["what"]] = float(m["num"]) * units[m["unit"].lower()]
    return plant


def planted_faults(plant: dict[str, float], generations: list[tuple[int, int]]) -> list[Any]:
    """The faults that plant the regression: in every generation (its first step, its step
    count), every rank holds ``memory`` more and sleeps ``step_time`` at each step's forward."""
    from pytest_reshard import chaos

    faults = []
    for first, count in generations:
        if plant.get("memory"):
            faults.append(chaos.memory_pressure(target="all", at_step=first,
                                                bytes=int(plant["memory"])))
        if plant.get("step_time"):
            faults.append(chaos.slow_rank(target="all", at_step=first, steps=count,
                                          delay_ms=plant["step_time"] * 1e3))
    return faults


def launcher_of(args: list[str]) -> str | None:
    """The ``--reshard-launcher`` among pytest arguments, if any."""
    for i, arg in enumerate(args):
        if arg.startswith("--reshard-launcher="):
            return arg.partition("=")[2]
        if arg == "--reshard-launcher" and i + 1 < len(args):
            return args[i + 1]
    return None


@dataclass
class StackRun:
    label: str
    env: Env
    suite_rc: int | None = None
    seconds: float = 0.0
    summary: str = ""


def _pytest_summary(log: Path) -> str:
    lines = [ln.strip("= ") for ln in log.read_text(errors="replace").splitlines()
             if re.match(r"^=+ .*\b(passed|failed|error|errors|skipped|no tests ran)\b.* in ", ln)]
    return lines[-1] if lines else "(no pytest summary; see the log)"


def run_gate(old: Env, new: Env, *, suite: str, limits: list[gate.Limit], workdir: Path,
             plant: str = "", checkpoint: bool = True, extra: list[str] | None = None,
             timeout_s: float = 1800.0, out: Callable[[str], None] = print,
             via: Env | None = None) -> int:
    """``via``: a stack between the two that changes one thing (the new version built as the
    old one), run too, so the report says which step cost what; old -> new alone is judged."""
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in ("old", "via", "new", "baselines", "checkpoint", "report.json", "report.md"):
        target = workdir / stale
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    baselines = workdir / "baselines"
    stacks = [StackRun("old", old), *([StackRun("via", via)] if via else []),
              StackRun("new", new)]
    for stack in stacks:
        out(f"[{stack.label}] preparing {stack.env.spec}")

        def progress(msg: str, s: StackRun = stack) -> None:
            out(f"[{s.label}] {msg}")

        stack.env.prepare(progress)
    compat: dict[str, Any] | None = None
    for stack in stacks:
        here = workdir / stack.label
        here.mkdir()
        env = {PLANT_ENV: plant} if plant and stack.label == "new" else {}
        action = {"old": "save", "new": "load"}.get(stack.label, "none") if checkpoint else "none"
        started = time.monotonic()
        out(f"[{stack.label}] suite {suite}" + (f", checkpoint {action}" if checkpoint else "")
            + f" in {stack.env.spec}" + (f" with a planted regression ({plant})" if env else ""))
        rc = stack.env.run(["-m", "pytest_reshard.gate.stacks", "stack", stack.label,
                            "--dir", str(workdir), "--suite", suite, "--checkpoint", action,
                            "--timeout", str(timeout_s), "--", *(extra or [])],
                           cwd=here, env=env, log=here / "stack.log", timeout_s=2 * timeout_s + 60)
        stack.seconds = time.monotonic() - started
        done = _read_json(here / "stack.json") or {}
        stack.suite_rc = done.get("suite_exit")
        stack.summary = _pytest_summary(here / "suite.log") if done else \
            f"the stack did not run (exit {rc}); last lines of {here / 'stack.log'}:\n" \
            + _tail(here / "stack.log")
        out(f"[{stack.label}] {stack.summary.splitlines()[0]} (suite exit {stack.suite_rc}, "
            f"{stack.seconds:.0f} s in all; logs in {here})")
        log = here / f"checkpoint-{action}.log"
        if action == "save" and done.get("checkpoint_exit") != 0:
            compat = {"status": "fail", "message": f"the old stack could not write the checkpoint "
                      f"(exit {done.get('checkpoint_exit')}):\n{_tail(log)}"}
            checkpoint = False
        elif action == "load":
            compat = _read_json(workdir / "checkpoint" / "verdict.json") or {
                "status": "fail", "message": f"the load did not report (exit "
                f"{done.get('checkpoint_exit')}); last lines of {log}:\n{_tail(log)}"}
    return report(stacks, baselines, limits, compat, workdir, out)


def run_stack(label: str, workdir: Path, suite: str, checkpoint: str, extra: list[str],
              timeout_s: float) -> int:
    """Inside one stack (one container, one venv): the suite, then the checkpoint step.
    Writes ``LABEL/stack.json`` with their exit codes; the gate reads it."""
    here = workdir / label
    here.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {"label": label}
    started = time.monotonic()
    done["suite_exit"] = _call(
        [sys.executable, "-m", "pytest_reshard.cli", suite, "--artifacts", str(here / "artifacts"),
         "--", f"--reshard-save-baseline={label}", f"--reshard-baselines={workdir / 'baselines'}",
         *([] if launcher_of(extra) else [f"--reshard-launcher={gate.COLD_LAUNCHER}"]), *extra],
        here / "suite.log", here, timeout_s)
    done["suite_seconds"] = round(time.monotonic() - started, 1)
    if checkpoint != "none":
        done["checkpoint_exit"] = _call(
            [sys.executable, "-m", "pytest_reshard.checkpoints.compat", checkpoint,
             str(workdir / "checkpoint")], here / f"checkpoint-{checkpoint}.log", here, timeout_s)
    (here / "stack.json").write_text(json.dumps(done, indent=2))
    return 0


def _call(cmd: list[str], log: Path, cwd: Path, timeout_s: float) -> int:
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the suite and every rank it started
            proc.wait(timeout=30)
            return 124


def report(stacks: list[StackRun], baselines: Path, limits: list[gate.Limit],
           compat: dict[str, Any] | None, workdir: Path, out: Callable[[str], None]) -> int:
    docs = [_read_json(baselines / f"{s.label}.json") for s in stacks]
    problems: list[str] = []
    for stack, doc in zip(stacks, docs):
        if doc is None:
            problems.append(f"the {stack.label} stack ({stack.env.spec}) saved no numbers: "
                            f"{stack.summary}; see {workdir / stack.label / 'suite.log'}:\n"
                            + _tail(workdir / stack.label / "suite.log"))
        elif stack.suite_rc != 0:
            problems.append(f"the suite failed in the {stack.label} stack ({stack.env.spec}): "
                            f"{stack.summary}; see {workdir / stack.label / 'suite.log'}")
    lines: list[str] = []
    changes: list[gate.Change] = []
    if all(docs):
        old_doc, new_doc = docs[0], docs[-1]
        assert old_doc is not None and new_doc is not None  # all(docs)
        lines, changes, unmatched = gate.diff_table(old_doc, new_doc, limits,
                                                    labels=(f"old ({stacks[0].env.spec})",
                                                            f"new ({stacks[-1].env.spec})"))
        problems += unmatched
        if len(docs) == 3:
            assert docs[1] is not None
            lines += ["", f"one change at a time: old -> via ({stacks[1].env.spec}) -> new",
                      *gate.steps_table(old_doc, docs[1], new_doc)]
        else:
            lines += gate.mixed_change_note(old_doc, new_doc)
    regressed = [c for c in changes if c.regressed]
    out("")
    out("== pytest-reshard gate: old vs new ==")
    for line in lines:
        out(line)
    if compat is not None:
        out(f"checkpoint written by old, loaded by new: {compat['status'].upper()}: "
            f"{compat['message']}")
        if compat["status"] != "pass":
            problems.append(f"checkpoint compatibility: {compat['message']}")
    for c in regressed:
        out(f"REGRESSED {c.describe()}")
    for p in problems:
        out(f"FAILED {p}")
    ok = not regressed and not problems
    out(f"gate: {'PASS' if ok else 'FAIL'} ({len(regressed)} regression(s), "
        f"{len(problems)} other failure(s)); details in {workdir}")
    result = {"ok": ok, "table": lines, "regressions": [c.describe() for c in regressed],
              "problems": problems, "checkpoint": compat,
              "stacks": [{"label": s.label, "env": s.env.spec, "suite_exit": s.suite_rc,
                          "summary": s.summary, "seconds": round(s.seconds, 1)} for s in stacks]}
    (workdir / "report.json").write_text(json.dumps(result, indent=2))
    md = ["## pytest-reshard gate: " + ("pass" if ok else "**FAIL**"), "", "```", *lines, "```"]
    md += [f"- REGRESSED {c.describe()}" for c in regressed] + [f"- FAILED {p.splitlines()[0]}"
                                                              for p in problems]
    (workdir / "report.md").write_text("\n".join(md) + "\n")
    return 0 if ok else 1


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _stack_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_reshard.gate.stacks stack")
    parser.add_argument("label")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--checkpoint", choices=("save", "load", "none"), default="none")
    parser.add_argument("--timeout", type=float, default=1800.0)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    return run_stack(args.label, args.dir, args.suite, args.checkpoint, extra, args.timeout)


def main(argv: list[str]) -> int:
    if argv[:1] == ["stack"]:  # what the gate runs inside each stack
        return _stack_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="pytest-reshard gate", description=__doc__.split("\n")[0],
        epilog="environments: venv:PATH | venv:REQUIREMENTS (built once under .reshard-envs/) | "
               "docker:IMAGE[#PYTHON]; extra pytest arguments go after --")
    parser.add_argument("--old", required=True, help="the stack in use, e.g. venv:torch==2.13.0")
    parser.add_argument("--new", required=True, help="the candidate, e.g. venv:torch==2.14.1")
    parser.add_argument("--suite", default="upgrade",
                        help="bundled suite (or a .py file) run in both (default upgrade)")
    parser.add_argument("--fail", default="peak_mem:+150MB,step_time:+10%,throughput:-10%",
                        help="limits, as --reshard-compare-fail (default: peak_mem:+150MB,"
                        "step_time:+10%%,throughput:-10%%)")
    parser.add_argument("--plant", default="", help="plant a regression in the new stack: "
                        "memory=200MB,step_time=50ms")
    parser.add_argument("--via", default=None, help="a stack between the two that changes one "
                        "thing (the new torch version built as the old one), to tell which step "
                        "cost what")
    parser.add_argument("--dir", default=".reshard-gate", help="where results go")
    parser.add_argument("--envs", default=".reshard-envs", help="where built venvs are cached")
    parser.add_argument("--no-checkpoint", action="store_true",
                        help="skip the cross-stack checkpoint load")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds each command in a stack may run (default %(default)s)")
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    try:
        if launcher_of(extra) == gate.WARM_LAUNCHER:
            raise gate.GateError(
                f"--reshard-launcher={gate.WARM_LAUNCHER}: the gate runs every rank in a cold "
                "interpreter, as production does; a rank forked from the warm server maps the "
                "memory the harness preloaded and starts warm, so its memory, step time and "
                "relaunch would measure the harness, not the stack. Leave the launcher out "
                f"(the gate uses {gate.COLD_LAUNCHER}), or name another cold one (torchrun)")
        limits = gate.parse(args.fail)
        if args.plant:
            parse_plant(args.plant)
        workdir = Path(args.dir).resolve()
        old, new = (parse_env(s, mounts=[workdir], root=Path(args.envs))
                    for s in (args.old, args.new))
        via = parse_env(args.via, mounts=[workdir], root=Path(args.envs)) if args.via else None
        return run_gate(old, new, suite=args.suite, limits=limits, workdir=workdir,
                        plant=args.plant, checkpoint=not args.no_checkpoint, extra=extra,
                        timeout_s=args.timeout, via=via)
    except (gate.GateError, ValueError, EnvError) as e:
        print(f"pytest-reshard gate: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
