"""Software stacks to run the gate in: an existing venv, one built from requirements, an image.

    venv:PATH               an existing virtual environment with pytest-reshard installed
    venv:torch==2.14.1      pip requirements (comma-separated): a venv is built once and cached
    docker:IMAGE            a container image with Python, torch and pytest-reshard installed

``venv:REQUIREMENTS`` builds ``.reshard-envs/<name>-<hash>/`` with ``python -m venv`` and one
``pip install`` of the requirements plus this pytest-reshard (editable from its source tree when
it runs from one, else the same version from the index). The hash covers the requirements, the
Python and the source, so a changed spec gets a new venv; a half-built one (no marker file) is
rebuilt. pip's own configuration applies (indexes, constraints, ``--find-links``).

``docker:IMAGE`` runs each command in a fresh container through the docker SDK (``pip install
docker``; the ``docker`` extra), which honours ``DOCKER_HOST``: host networking (the ranks'
rendezvous stays on 127.0.0.1) and host IPC, every GPU requested (``DeviceRequest(count=-1,
capabilities=[["gpu"]])``) when the host has NVIDIA devices, the source tree mounted read-only and
the gate's folder read-write at the same paths, the caller's uid and gid, and ``python3`` from the
image's PATH unless ``docker:IMAGE#/path/to/python`` says otherwise. The container is removed
when the command ends, also on a timeout (then it is killed first).

No torch import here: each environment brings its own.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENVS_DIR = ".reshard-envs"
#: A venv built for a CUDA torch holds about 6 GB; refuse to start one with less free than this.
MIN_FREE_BYTES = 10 * 2**30
_MARKER = ".reshard-env.json"


class EnvError(RuntimeError):
    """An environment that cannot be used; the message says what to do."""


def source_tree() -> Path | None:
    """The source checkout this pytest-reshard runs from, or None for an installed copy."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "fixtures").is_dir() else None


@dataclass
class Env:
    """One software stack: ``run`` executes ``python ARGS`` inside it and returns the exit code."""

    spec: str

    def prepare(self, progress: Callable[[str], None]) -> None:
        """Build or check the environment (raises EnvError)."""

    def run(self, args: list[str], *, cwd: Path, env: Mapping[str, str], log: Path,
            timeout_s: float) -> int:
        raise NotImplementedError


@dataclass
class VenvEnv(Env):
    path: Path | None = None                                   # an existing venv
    requirements: list[str] = field(default_factory=list)      # or one to build
    root: Path = Path(ENVS_DIR)

    @property
    def python(self) -> Path:
        assert self.path is not None
        return self.path / "bin" / "python"

    def prepare(self, progress: Callable[[str], None]) -> None:
        if self.requirements:
            self.path = build_venv(self.requirements, self.root, progress)
        assert self.path is not None
        if not self.python.exists():
            raise EnvError(f"{self.spec}: no {self.python}; give the folder of a virtual "
                           "environment (the one holding bin/python)")
        check = subprocess.run([str(self.python), "-c", "import pytest_reshard"], cwd="/",
                               check=False, capture_output=True, text=True, timeout=120)
        if check.returncode != 0:
            raise EnvError(f"{self.spec}: pytest-reshard is not installed there "
                           f"({check.stderr.strip().splitlines()[-1:]}); install it with "
                           f"{self.python} -m pip install pytest-reshard")

    def run(self, args: list[str], *, cwd: Path, env: Mapping[str, str], log: Path,
            timeout_s: float) -> int:
        full = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
        full.update(env)
        full["PATH"] = f"{self.python.parent}{os.pathsep}{full.get('PATH', '')}"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(self.python), *args], cwd=cwd, env=full, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                return proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)   # the suite and every rank it started
                proc.wait(timeout=30)
                return 124


def build_venv(requirements: list[str], root: Path, progress: Callable[[str], None]) -> Path:
    """The cached venv for ``requirements`` (built on first use, under a lock)."""
    src = source_tree()
    key = hashlib.sha256(json.dumps({"requirements": requirements, "python": sys.version,
                                     "base": sys.base_prefix, "source": str(src)},
                                    sort_keys=True).encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", "-".join(requirements))[:40].strip("-")
    path = (root / f"{slug}-{key}").resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # a second gate waits for the first build
        if (path / _MARKER).exists():
            return path
        free = shutil.disk_usage(path.parent).free
        if free < MIN_FREE_BYTES:
            raise EnvError(f"building a venv for {' '.join(requirements)} needs about "
                           f"{MIN_FREE_BYTES / 2**30:.0f} GB free under {path.parent} (a CUDA "
                           f"torch is ~6 GB); {free / 2**30:.1f} GB are free")
        if path.exists():
            shutil.rmtree(path)                   # a build that never finished
        log = path.parent / f"{path.name}.log"
        progress(f"building {path} for {' '.join(requirements)} (once; log {log})")
        ours = ["-e", str(src)] if src else [f"pytest-reshard=={_version()}"]
        started = time.monotonic()
        with open(log, "wb") as out:
            for cmd in ([sys.executable, "-m", "venv", str(path)],
                        [str(path / "bin" / "python"), "-m", "pip", "install", *requirements,
                         *ours]):
                out.write(f"+ {shlex.join(cmd)}\n".encode())
                out.flush()
                try:
                    done = subprocess.run(cmd, check=False, stdout=out, stderr=subprocess.STDOUT,
                                          timeout=3600)
                except subprocess.TimeoutExpired:
                    raise EnvError(f"{shlex.join(cmd)} took over an hour; see {log}") from None
                if done.returncode != 0:
                    raise EnvError(f"{shlex.join(cmd)} failed ({done.returncode}); last lines "
                                   f"of {log}:\n{_tail(log)}")
        versions = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "freeze"],
                                  check=False, capture_output=True, text=True, timeout=120).stdout
        (path / _MARKER).write_text(json.dumps({"requirements": requirements,
                                                "built_s": round(time.monotonic() - started, 1),
                                                "freeze": versions.splitlines()}, indent=1))
        progress(f"built {path.name} in {time.monotonic() - started:.0f} s")
        return path


def _version() -> str:
    from importlib.metadata import version

    return version("pytest-reshard")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


@dataclass
class DockerEnv(Env):
    image: str = ""
    python: str = "python3"
    gpus: str = "auto"          # auto (when the host has NVIDIA devices) | all | none
    mounts: list[Path] = field(default_factory=list)   # read-write, besides the source tree
    client: Any = None

    def prepare(self, progress: Callable[[str], None]) -> None:
        self.client = docker_client()
        import docker

        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            progress(f"pulling {self.image}")
            try:
                self.client.images.pull(self.image)
            except docker.errors.APIError as e:
                raise EnvError(f"{self.spec}: no image {self.image!r} on the engine and it cannot "
                               f"be pulled ({e.explanation or e}); build, load or import it "
                               "first") from None

    def wants_gpus(self) -> bool:
        if self.gpus == "auto":
            return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None
        return self.gpus == "all"

    def container_options(self, args: list[str], *, cwd: Path,
                          env: Mapping[str, str]) -> dict[str, Any]:
        """What ``containers.run`` gets (pure: unit-tested without an engine)."""
        volumes = {}
        src = source_tree()
        if src is not None:
            volumes[str(src)] = {"bind": str(src), "mode": "ro"}
        for path in self.mounts:
            volumes[str(path)] = {"bind": str(path), "mode": "rw"}
        options: dict[str, Any] = {
            "image": self.image, "command": [self.python, *args], "detach": True, "network_mode": "host",
            "ipc_mode": "host", "init": True, "working_dir": str(cwd), "volumes": volumes,
            "environment": {"PYTHONUNBUFFERED": "1", "HOME": str(cwd), **env},
            "user": f"{os.getuid()}:{os.getgid()}", "labels": {"pytest-reshard": "gate"},
            "name": f"reshard-gate-{uuid.uuid4().hex[:10]}"}
        if self.wants_gpus():
            import docker

            options["device_requests"] = [docker.types.DeviceRequest(count=-1,
                                                                     capabilities=[["gpu"]])]
        return options

    def run(self, args: list[str], *, cwd: Path, env: Mapping[str, str], log: Path,
            timeout_s: float) -> int:
        import docker
        import requests

        container = self.client.containers.run(**self.container_options(args, cwd=cwd, env=env))
        rc = 124
        try:
            rc = int(container.wait(timeout=timeout_s)["StatusCode"])
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            container.kill()
        finally:
            try:
                log.write_bytes(container.logs(stdout=True, stderr=True))
            finally:
                try:   # slow on the vfs storage driver: it deletes a full copy of the image
                    container.remove(force=True)
                except (docker.errors.APIError, requests.exceptions.RequestException) as e:
                    raise EnvError(f"could not remove container {container.name}: {e}; remove "
                                   f"it with: docker rm -f {container.name}") from None
        return rc


def docker_client() -> Any:
    """A docker SDK client for ``DOCKER_HOST`` (or the default socket) that answers a ping."""
    try:
        import docker
    except ImportError:
        raise EnvError("docker: environments need the docker SDK: pip install docker "
                       "(or pytest-reshard[docker])") from None
    try:
        client = docker.from_env(timeout=600)  # vfs: creating and removing copy GBs
        client.ping()
    except docker.errors.DockerException as e:
        where = os.environ.get("DOCKER_HOST", "the default socket /var/run/docker.sock")
        raise EnvError(f"docker: no engine answers at {where} ({e}); start dockerd or set "
                       "DOCKER_HOST") from None
    return client


def parse_env(spec: str, *, mounts: list[Path] | None = None, root: Path | None = None) -> Env:
    """``venv:PATH``, ``venv:REQ[,REQ...]`` (a requirement may be a direct reference, ``torch @
    file:///wheels/torch-2.13.0-....whl``) or ``docker:IMAGE[#PYTHON]`` -> an Env (EnvError)."""
    kind, _, value = spec.partition(":")
    if not value:
        raise EnvError(f"{spec!r}: write venv:PATH, venv:REQUIREMENTS (torch==2.14.1) or "
                       "docker:IMAGE")
    if kind == "venv":
        direct = " @ " in value  # a direct reference: torch @ file:///wheels/torch-....whl
        looks_like_path = not direct and ("/" in value or value.startswith(".")
                                          or Path(value).is_dir())
        if looks_like_path:
            path = Path(value).expanduser().resolve()
            if not path.is_dir():
                raise EnvError(f"{spec!r}: no folder {path}; give an existing venv, or pip "
                               "requirements such as venv:torch==2.14.1 to build one")
            return VenvEnv(spec, path=path)
        reqs = [r.strip() for r in value.split(",") if r.strip()]
        return VenvEnv(spec, requirements=reqs, root=root or Path(ENVS_DIR))
    if kind == "docker":
        image, _, python = value.partition("#")
        return DockerEnv(spec, image=image, python=python or "python3", mounts=list(mounts or []))
    raise EnvError(f"{spec!r}: unknown environment kind {kind!r}; use venv: or docker:")
