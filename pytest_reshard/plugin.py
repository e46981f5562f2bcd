"""The pytest plugin: markers, options, the ``reshard_run`` fixture, the verdict table.

Kept thin on purpose: nothing here imports torch; the harness loads when a test first asks for
``reshard_run``. Precedence for every setting: marker > command line > ini > default.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import pytest

from pytest_reshard.refcache import marker_options, resolve_workload
from pytest_reshard.schedule.strategies import PROFILES  # stdlib-only at import: no hypothesis, no torch

BACKENDS = ("auto", "gloo", "nccl")

#: The ini types pytest's ``Parser.addini`` takes.
_IniType = Literal["string", "paths", "pathlist", "args", "linelist", "bool", "int", "float"]
OPTIONS: list[tuple[str, _IniType, Any, str]] = [
    # (name, ini type, default, help) — every flag has an ini twin with the same help.
    ("reshard_artifacts", "string", "reshard-artifacts",
     "folder for per-test artifacts: history, verdict.json, replay command"),
    ("reshard_timeout", "string", "300", "seconds a scenario may run before it is ended (all ranks killed)"),
    ("reshard_seed", "string", "0", "schedule seed for scenarios that do not set one; 'last' "
     "reuses the previous run's"),
    ("reshard_backend", "string", "auto", "process-group backend: gloo, nccl, or auto (nccl when CUDA is available)"),
    ("reshard_launcher", "string", "fork", "how ranks start: fork (warm fork server), local (cold), "
     "torchrun, elastic (one agent per node), slurm (job steps of a SLURM allocation), "
     "slurm-fork (the same, ranks forked by a warm server on each node), or any registered "
     "launcher"),
    ("reshard_nodes", "string", "1", "nodes of a multi-node scenario (slurm, slurm-fork, "
     "elastic) that does not set nodes= (each runs world_size / nodes ranks)"),
    ("reshard_save_baseline", "string", "", "save this run's numbers as baseline NAME (regression gate)"),
    ("reshard_compare", "string", "", "compare this run's numbers with baseline NAME"),
    ("reshard_compare_fail", "string", "", "fail on regressions vs the baseline, e.g. "
     "'peak_mem:+150MB,step_time:+10%,throughput:-10%'"),
    ("reshard_baselines", "string", ".reshard-baselines", "folder that holds saved baselines"),
    ("reshard_profile", "string", "ci", "hypothesis profile of property-based chaos tests: ci (10 "
     "examples, derandomized) or nightly (50, with a database); env RESHARD_PROFILE beats ini"),
    ("reshard_reference_cache", "string", "", "keep clean reference runs in this folder across "
     "sessions, keyed on the script and the modules it imports, args, settings, torch, python "
     "(off when unset)"),
    ("reshard_checkpoint_scale", "string", "1/1024", "fraction of a real checkpoint's bytes that "
     "checkpoint_factory writes when a test gives no scale (1: production size)"),
]
_STATE = pytest.StashKey["_State"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("reshard", "pytest-reshard: chaos tests of distributed training")
    for name, kind, default, help_ in OPTIONS:
        flag = "--" + name.replace("_", "-")
        text = f"{help_} (ini: {name}; default {default or 'unset'})".replace("%", "%%")  # argparse
        group.addoption(flag, dest=name, default=None, help=text)
        parser.addini(name, help_, type=kind, default=default)
    group.addoption("--reshard-nightly", action="store_true", default=False,
                    help="also run tests marked nightly (long chaos runs)")
    group.addoption("--reshard-shard", default=None, metavar="I/N",
                    help="run only shard I of N (every N-th test by node id), to split a suite "
                         "between N machines that collect the same tests")


def _setting(config: pytest.Config, name: str) -> str:
    value = config.getoption(name)
    source = "--" + name.replace("_", "-")
    if value is None and name == "reshard_profile" and os.environ.get("RESHARD_PROFILE"):
        value, source = os.environ["RESHARD_PROFILE"], "env RESHARD_PROFILE"
    if value is None:
        value, source = config.getini(name), f"ini {name}"
    return _validate(name, str(value), source)


def _validate(name: str, value: str, source: str) -> str:
    try:
        if name == "reshard_timeout" and float(value) <= 0:
            raise ValueError
        if name == "reshard_seed" and value != "last":
            int(value)
    except ValueError:
        raise pytest.UsageError(f"{source}={value!r}: expected a "
                                f"{'positive number' if name == 'reshard_timeout' else 'integer or last'}"
                                ) from None
    if name == "reshard_backend" and value not in BACKENDS:
        raise pytest.UsageError(f"{source}={value!r}: choose one of {', '.join(BACKENDS)}")
    if name == "reshard_nodes" and (not value.isdigit() or int(value) < 1):
        raise pytest.UsageError(f"{source}={value!r}: expected a whole number of nodes, >= 1")
    if name == "reshard_launcher":
        from pytest_reshard.supervisor import launch  # stdlib-only at import, like the registry

        if value not in launch.registered():  # a user's register(...)ed launcher is one
            raise pytest.UsageError(f"{source}={value!r}: choose one of "
                                    f"{', '.join(launch.registered())}")
    if name == "reshard_compare_fail" and value:
        from pytest_reshard.gate.baseline import GateError, parse

        try:
            parse(value)
        except GateError as e:
            raise pytest.UsageError(f"{source}: {e}") from None
    if name == "reshard_profile" and value not in PROFILES:
        raise pytest.UsageError(f"{source}={value!r}: choose one of {', '.join(PROFILES)}")
    if name == "reshard_checkpoint_scale":
        from pytest_reshard.fixtures.checkpoint_profiles import parse_scale  # plain data, no torch

        try:
            parse_scale(value)
        except ValueError as e:
            raise pytest.UsageError(f"{source}={value!r}: {e}") from None
    return value


class _State:
    def __init__(self, config: pytest.Config) -> None:
        self.settings = {name: _setting(config, name) for name, *_ in OPTIONS}
        self.session: Any = None
        self.rows: list[dict[str, Any]] = []  # summary rows: ours, and on the controller the workers'
        self.metrics: dict[str, dict[str, Any]] = {}  # test name -> gate metrics
        self.changes: list[Any] = []  # gate comparisons against a baseline
        self.remote_changes: list[tuple[bool, str]] = []  # (regressed, text) from xdist workers
        self.png_skipped: str | None = None
        self.live: Any = None
        self.layout: Any = None  # this xdist worker's ports and GPUs (parallel.Layout)
        self.lock: Any = None    # this process's hold on its artifacts folder
        info = getattr(config, "workerinput", None)
        if info is not None:  # an xdist worker: claim disjoint ports and GPUs before any run
            from pytest_reshard.parallel import configure

            self.layout = configure(str(info["workerid"]), int(info["workercount"]))

    @property
    def root(self) -> Path:
        return Path(self.settings["reshard_artifacts"]).resolve()

    @property
    def artifacts(self) -> Path:
        """Where this process writes: the artifacts folder, or its worker's folder in it."""
        return self.root / self.layout.worker if self.layout else self.root

    def harness(self, config: pytest.Config) -> Any:
        if self.session is None:
            from pytest_reshard.session import Session

            reporter = config.pluginmanager.get_plugin("terminalreporter")
            progress = status = None
            if reporter is not None and config.get_verbosity() > 0 and self.layout is None:
                from pytest_reshard.reports.progress import LiveLine

                capman = config.pluginmanager.get_plugin("capturemanager")
                self.live = LiveLine(reporter, tty=bool(getattr(reporter, "isatty", False)),
                                     uncaptured=capman.global_and_fixture_disabled if capman
                                     else contextlib.nullcontext)
                progress, status = self.live.message, self.live.status
            cache = self.settings["reshard_reference_cache"]
            self.session = Session(self.artifacts, progress=progress, status=status,
                                   reference_cache=Path(cache).resolve() if cache else None)
        return self.session


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "reshard(world_size=4, steps=20, timeout=None, workload=None, seed=None, launcher=None, "
        "backend=None): defaults for the reshard_run fixture in this test",
        "chaos: a chaos scenario (real processes, injected faults); select with -m chaos",
        "gpu(count=1): needs `count` CUDA devices; skipped with a reason otherwise",
        "nightly: a long chaos run; skipped unless --reshard-nightly",
        "reshard_sweep(save_step=None, rank=0, flip=False, power=False): which save the "
        "file_point sweep crashes, on which rank (default: the second save, rank 0); flip: a "
        "byte flipped after each data file; power: a power loss before each event",
    ):
        config.addinivalue_line("markers", line)
    shard = config.getoption("reshard_shard", None)
    if shard:
        from pytest_reshard.parallel import parse_shard

        try:
            parse_shard(shard)
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
    state = config.stash[_STATE] = _State(config)
    _remember_seed(config, state)
    _use_profile(config.stash[_STATE].settings["reshard_profile"])
    _check_startup(config, state)


def _check_startup(config: pytest.Config, state: "_State") -> None:
    """What would fail every scenario, rejected before any runs (exit 4, naming the option):
    an artifacts folder that cannot be written or is another session's, a baseline that does not
    exist, nccl asked for where there is no CUDA device."""
    if any(config.getoption(o, False) for o in ("help", "collectonly", "markers", "showfixtures",
                                                  "show_fixtures_per_test")):
        return  # nothing runs: no folder is made or held
    from pytest_reshard.session import ArtifactsInUse, lock_artifacts

    s = state.settings
    try:
        state.lock = lock_artifacts(state.artifacts)
    except ArtifactsInUse as e:
        raise pytest.UsageError(f"--reshard-artifacts: {e}") from None
    except OSError as e:
        raise pytest.UsageError(f"--reshard-artifacts={s['reshard_artifacts']!r}: cannot write "
                                f"there ({type(e).__name__}: {e}); pass a folder this user may "
                                "create and write") from None
    if s["reshard_compare"]:
        path = Path(s["reshard_baselines"]) / f"{s['reshard_compare']}.json"
        if not path.is_file():
            saved = sorted(p.stem for p in Path(s["reshard_baselines"]).glob("*.json"))
            raise pytest.UsageError(
                f"--reshard-compare={s['reshard_compare']!r}: no baseline {path} "
                f"({'saved ones: ' + ', '.join(saved) if saved else 'none is saved there'}); "
                "save one first with --reshard-save-baseline=NAME")
    if s["reshard_backend"] == "nccl":
        import torch  # only when nccl is asked for by name

        if not torch.cuda.is_available():
            raise pytest.UsageError("--reshard-backend=nccl: no CUDA device is available here "
                                    "(torch.cuda.is_available() is False), so no scenario could "
                                    "run on NCCL; drop the option (auto picks gloo on CPU) or run "
                                    "on a GPU runner")


def _remember_seed(config: pytest.Config, state: "_State") -> None:
    """Resolve ``--reshard-seed=last`` from pytest's cache, and remember this run's seed."""
    cache = getattr(config, "cache", None)
    if state.settings["reshard_seed"] == "last":
        last = cache.get("reshard/seed", None) if cache is not None else None
        if last is None:
            raise pytest.UsageError("--reshard-seed=last: no previous seed is recorded (the "
                                    "cache is empty or disabled); pass a number")
        state.settings["reshard_seed"] = str(last)
    if cache is not None:
        cache.set("reshard/seed", int(state.settings["reshard_seed"]))


def _use_profile(name: str) -> None:
    """Make ``name`` the profile of ``pytest_reshard.schedule.strategies``; register the hypothesis
    profiles only if hypothesis is importable (neither it nor torch is imported otherwise)."""
    import importlib.util

    from pytest_reshard.schedule import strategies  # stdlib only at import

    strategies.ACTIVE_PROFILE = name
    if importlib.util.find_spec("hypothesis") is not None:
        strategies.register_profiles()


def pytest_report_header(config: pytest.Config) -> str:
    s = config.stash[_STATE].settings
    return (f"reshard: seed={s['reshard_seed']} backend={s['reshard_backend']} "
            f"launcher={s['reshard_launcher']} profile={s['reshard_profile']} artifacts={s['reshard_artifacts']}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("reshard_shard", None)
    if not shard:
        return
    from pytest_reshard.parallel import shard as keep_of

    keep = keep_of([item.nodeid for item in items], shard)
    dropped = [item for item in items if item.nodeid not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid in keep]


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("nightly") and not item.config.getoption("reshard_nightly"):
        pytest.skip("nightly chaos run: pass --reshard-nightly to run it")
    gpu = item.get_closest_marker("gpu")
    if gpu is not None:
        count = gpu.args[0] if gpu.args else gpu.kwargs.get("count", 1)
        import torch  # only for tests that ask for GPUs

        have = torch.cuda.device_count()
        if have < count:
            layout = item.config.stash[_STATE].layout
            share = "" if layout is None or layout.gpus is None else (
                f" (xdist worker {layout.worker} has {len(layout.gpus)} of the machine's "
                f"{layout.gpu_total}: they are split between {layout.count} workers; run it "
                f"with fewer workers)")
            pytest.skip(f"needs {count} CUDA device(s), found {have}{share}")


@pytest.fixture
def reshard_run(request: pytest.FixtureRequest, record_property: Callable[[str, Any], None]) -> Callable[..., Any]:
    """Run a workload under chaos: ``reshard_run("train.py" | "lm" | "dflash", faults=[...])``.

    Keyword arguments override the ``reshard`` marker: world_size, steps, seed, timeout,
    launcher, backend, args (the workload's own command-line arguments), and any Scenario
    field (hang_s, stall_s, failure_grace_s, roles, ...). Returns a Result whose
    ``assert_*`` methods check the recorded history.
    """
    state: _State = request.config.stash[_STATE]
    defaults = marker_options(request.node, "reshard")
    count = 0

    def run(workload: str | None = None, faults: Any = (), **overrides: Any) -> Any:
        nonlocal count
        from pytest_reshard import workloads
        from pytest_reshard.session import scenario_from

        opts = {**defaults, **overrides}
        workload = workload or opts.pop("workload", None)
        opts.pop("workload", None)
        if workload is None:
            raise pytest.UsageError("reshard_run needs a workload: a script path or one of "
                                    f"{', '.join(workloads.registered())}")
        workload = resolve_workload(workload, Path(request.node.path))
        s = state.settings
        seed = opts.pop("seed", None)
        launcher = opts.pop("launcher", None) or s["reshard_launcher"]
        from pytest_reshard.supervisor import launch

        if launch.facts(launcher)["multi_node"]:
            opts.setdefault("nodes", int(s["reshard_nodes"]))
        scenario = scenario_from(
            workload, faults=faults,
            world_size=int(opts.pop("world_size", 4)), steps=int(opts.pop("steps", 20)),
            seed=int(s["reshard_seed"] if seed is None else seed),
            timeout_s=float(opts.pop("timeout", None) or s["reshard_timeout"]),
            launcher=launcher,
            backend=_resolve_backend(opts.pop("backend", None) or s["reshard_backend"]),
            args=[str(a) for a in opts.pop("args", ())], **opts)
        count += 1
        name = request.node.nodeid + (f"-{count}" if count > 1 else "")
        harness = state.harness(request.config)
        try:
            result = harness.run(scenario, name, replay=_replay_command(
                request, f"--reshard-seed={scenario.schedule.seed}"))
        finally:
            if state.live is not None:
                state.live.finish()
        from pytest_reshard.reports.table import summary_row

        state.rows.append(summary_row(result, worker=state.layout.worker if state.layout else None,
                                      swept="file_point" in request.fixturenames))
        state.png_skipped = harness.png_skipped
        record_property("reshard_verdict", result.verdict.status)
        record_property("reshard_schedule_hash", scenario.schedule.hash)
        if result.report is not None:
            record_property("reshard_report", str(result.report))
        _gate(state, name, result)
        return result

    return run


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "file_point" in metafunc.fixturenames:
        from pytest_reshard.sweep import parametrize

        parametrize(metafunc, metafunc.config.stash[_STATE])


def _gate(state: "_State", name: str, result: Any) -> None:
    """Record the run's numbers; against a baseline, fail naming what regressed by how much."""
    s = state.settings
    if not (s["reshard_save_baseline"] or s["reshard_compare"]):
        return
    from pytest_reshard.gate import baseline as gate
    from pytest_reshard.result import ReshardAssertionError

    state.metrics[name] = gate.metrics(result.history)
    if not s["reshard_compare"]:
        return
    baseline = gate.load(Path(s["reshard_baselines"]) / f"{s['reshard_compare']}.json")
    limits = gate.parse(s["reshard_compare_fail"]) if s["reshard_compare_fail"] else []
    changes = gate.compare(baseline, name, state.metrics[name], limits)
    state.changes.extend(changes)
    bad = [c for c in changes if c.regressed]
    if bad:
        raise ReshardAssertionError(
            f"regressed against baseline {s['reshard_compare']!r}:\n"
            + "\n".join("  " + c.describe() for c in bad))


def _replay_command(request: pytest.FixtureRequest, *options: str) -> str:
    """``pytest NODE OPTIONS`` that works from the folder pytest was started in: the node id's
    file part is relative to the rootdir, which need not be that folder."""
    import shlex

    nodeid = request.node.nodeid
    path, sep, rest = nodeid.partition("::")
    here = request.config.invocation_params.dir
    where = os.path.relpath(Path(request.config.rootpath) / path, here)
    rootdir = [] if Path(request.config.rootpath) == Path(here) else \
        [f"--rootdir={os.path.relpath(request.config.rootpath, here)}"]
    return shlex.join(["pytest", where + sep + rest, *rootdir, *options])


def _resolve_backend(backend: str) -> str:
    from pytest_reshard.session import resolve_backend

    try:
        return resolve_backend(backend)
    except ValueError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def _reshard_checkpoint_launcher() -> Any:
    from pytest_reshard.checkpoints.factory import fork_launcher

    launcher = fork_launcher()  # the server starts on the first write
    yield launcher
    launcher.close()


@pytest.fixture
def checkpoint_factory(request: pytest.FixtureRequest, tmp_path: Path,
                       _reshard_checkpoint_launcher: Any) -> Iterator[Any]:
    """Write a sharded DCP checkpoint shaped like a real model family, with real I/O:
    ``checkpoint_factory("llama3-70b", scale=1/1024, world_size=4)`` -> ``WrittenCheckpoint`` (path,
    digests, GB/s); ``written.load(world_size=3).assert_bit_exact()`` reshards it. Profiles:
    ``pytest_reshard.fixtures.checkpoint_profiles``; no scale: ``--reshard-checkpoint-scale``."""
    from pytest_reshard.checkpoints.factory import CheckpointFactory
    from pytest_reshard.fixtures.checkpoint_profiles import parse_scale

    scale = request.config.stash[_STATE].settings["reshard_checkpoint_scale"]
    yield CheckpointFactory(tmp_path / "checkpoints", _reshard_checkpoint_launcher,
                            parse_scale(scale))
    shutil.rmtree(tmp_path / "checkpoints", ignore_errors=True)  # GBs at production scale


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a worker finished
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the controller: gather what the worker ran, for one summary of the whole session."""
    state: _State = node.config.stash[_STATE]
    out = getattr(node, "workeroutput", None) or {}
    state.rows.extend(out.get("reshard_rows", ()))
    state.metrics.update(out.get("reshard_metrics", {}))
    state.remote_changes.extend((bool(r), str(t)) for r, t in out.get("reshard_changes", ()))
    state.png_skipped = state.png_skipped or out.get("reshard_png_skipped")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state: _State = config.stash[_STATE]
    if not state.rows or state.layout is not None:  # a worker: the controller summarises
        return
    from pytest_reshard.reports.html import write_index
    from pytest_reshard.reports.table import markdown_summary, verdict_table

    rows = sorted(state.rows, key=lambda r: r["name"]) if any(r.get("worker") for r in state.rows) \
        else state.rows
    terminalreporter.section("reshard verdicts")
    for line in verdict_table(rows):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"artifacts: {state.settings['reshard_artifacts']}")
    terminalreporter.write_line(f"reports: {write_index(state.root, rows)}")
    if state.png_skipped:
        terminalreporter.write_line(f"PNG plots skipped: {state.png_skipped}")
    from pytest_reshard.reports.sweep import matrix_lines, write_matrix

    matrix = matrix_lines(rows)
    if matrix:
        terminalreporter.section("reshard file-event sweeps")
        for line in matrix:
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"matrix: {write_matrix(state.root, rows)}")
    changes = [(c.regressed, c.describe()) for c in state.changes] + state.remote_changes
    if changes:
        terminalreporter.section(f"reshard baseline {state.settings['reshard_compare']!r}")
        for regressed, text in changes:
            terminalreporter.write_line(("REGRESSED " if regressed else "") + text)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:  # GitHub Actions shows this file on the run's page
        with open(summary, "a") as f:
            f.write(markdown_summary(rows))
            if changes:  # the regression gate's comparison, on the same page
                f.write(f"### against baseline `{state.settings['reshard_compare']}`\n\n"
                        + "".join(f"- {'**REGRESSED** ' if regressed else ''}{text}\n"
                                  for regressed, text in changes) + "\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    state: _State = session.config.stash[_STATE]
    out = getattr(session.config, "workeroutput", None)
    if out is not None:  # an xdist worker: hand everything to the controller (plain data)
        out["reshard_rows"] = state.rows
        out["reshard_metrics"] = state.metrics
        out["reshard_changes"] = [[c.regressed, c.describe()] for c in state.changes]
        out["reshard_png_skipped"] = state.png_skipped
        return  # the controller saves the baseline, once, with every worker's numbers
    name = state.settings["reshard_save_baseline"]
    if name and state.metrics:
        from pytest_reshard.gate import baseline as gate

        gate.save(Path(state.settings["reshard_baselines"]) / f"{name}.json", state.metrics)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None and state.session is not None:
        state.session.close()
    if state is not None and state.lock is not None:
        state.lock.close()
