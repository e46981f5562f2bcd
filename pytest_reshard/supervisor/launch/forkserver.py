"""A warm, torch-preloaded fork server: relaunching a generation costs a fork, not an import.

Almost all of a rank's cold start is ``import torch`` (about 3 s on 2 cores). The server imports
torch and the workload once, then forks one child per rank on request; the child is a fresh
process (new session, own process group) that runs the workload as its ``__main__`` with the
rank's environment and then leaves the way ``python script.py`` does: through the interpreter's
own exit (``atexit`` handlers, joining non-daemon threads, flushing files, freeing the script's
objects while the interpreter finalizes), not ``os._exit``. The server is single-threaded
(forking a threaded process is unsafe) and reaps its children itself, reporting exit codes back
over its socket.

Lifetime: the server dies with the process that started it (``PR_SET_PDEATHSIG``), and every
rank dies with the server, so a killed pytest leaves nothing behind. Protocol: JSON lines over a
socketpair; requests ``{"op": "spawn", ...}`` -> ``{"pid": N}``; unsolicited ``{"exit": pid,
"code": c}`` (negative code = killed by that signal, as in ``subprocess``). On a SLURM node
(``slurm_fork.py``) the same server listens on an abstract unix socket instead (``serve_at``)
and outlives its clients, one node agent per generation.
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, NoReturn, Sequence

from pytest_reshard.procfs import killpg

if TYPE_CHECKING:  # pragma: no cover
    from importlib.machinery import ModuleSpec

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op off Linux)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may have died before prctl: then we were re-parented already.
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(70)


def exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


#: One thread per OpenMP/OpenBLAS/MKL pool: importing torch otherwise starts a pool, and forking
#: a process with threads is unsafe.
ONE_THREAD_PER_POOL = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: pyarrow's jemalloc starts a purging thread (``jemalloc_bg_thd``) when it loads, and
#: ``import datasets`` loads it (transformers' Trainer and torchtitan's data loader import
#: datasets). Without the thread jemalloc purges on allocation instead: same memory, same results.
NO_JEMALLOC_THREAD = {"JE_ARROW_MALLOC_CONF": "background_thread:false"}


#: Threads we know by name, and the setting that stops each.
KNOWN_THREADS = {"jemalloc_bg_thd": "pyarrow's jemalloc (import datasets): set "
                                    "JE_ARROW_MALLOC_CONF=background_thread:false"}


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The server's own environment (a rank's is the one its launch asks for): single-threaded
    pools, and jemalloc without its thread unless the user configured jemalloc themselves."""
    return {**NO_JEMALLOC_THREAD, **environ, **ONE_THREAD_PER_POOL}


def thread_names() -> list[str]:
    """The names of this process's threads other than the main one (``/proc``, Linux only)."""
    try:
        tasks = sorted(os.listdir("/proc/self/task"), key=int)
    except FileNotFoundError:
        return []
    names = []
    for tid in tasks:
        if int(tid) == os.getpid():
            continue
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:  # it ended meanwhile
            continue
    return names


class ForkServer:
    """Client side. ``spawn`` a rank, ``poll`` for exits, ``close`` to end everything."""

    def __init__(self, preload: Sequence[str] = ("pytest_reshard.supervisor.launch.warmup",),
                 startup_timeout: float = 120.0) -> None:
        ours, theirs = socket.socketpair()
        self._sock = ours
        self._buffer = b""
        # One conversation at a time: a session's clean reference run may use the server from
        # another thread while the chaos run does (requests and their replies stay paired).
        self._lock = threading.RLock()
        self._replies: list[dict] = []
        self._exits: dict[int, int] = {}
        self.preload = tuple(preload)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_reshard.supervisor.launch.forkserver", str(theirs.fileno()),
             str(os.getpid()), *self.preload],
            pass_fds=[theirs.fileno()], start_new_session=True,
            env=server_environment(os.environ),
        )
        theirs.close()
        reply = self._read_reply(startup_timeout)
        if reply.get("ready") is not True:
            self.close()
            raise RuntimeError(f"fork server failed to start: {reply.get('error', reply)}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def spawn(self, argv: Sequence[str], env: dict[str, str], cwd: str, log: Path,
              timeout: float = 10.0) -> int:
        """Fork a rank that runs ``python argv...`` (``-m module`` or a script path)."""
        return self.spawn_many([(argv, env, cwd, log)], timeout)[0]

    def spawn_many(self, ranks: Sequence[tuple[Sequence[str], dict[str, str], str, Path]],
                   timeout: float = 10.0) -> list[int]:
        """Fork one rank per ``(argv, env, cwd, log)``, in order: every request is sent at once
        and the server forks them back to back, without a round trip between two forks. The
        pids, in the same order; ``timeout`` bounds the wait for each reply."""
        with self._lock:
            return self._spawn_many(ranks, timeout)

    def _spawn_many(self, ranks: Sequence[tuple[Sequence[str], dict[str, str], str, Path]],
                    timeout: float) -> list[int]:
        self._sock.sendall(b"".join((json.dumps({"op": "spawn", "argv": list(argv), "env": env,
                                                 "cwd": cwd, "log": str(log)}) + "\n").encode()
                                    for argv, env, cwd, log in ranks))
        pids = []
        for argv, _, _, _ in ranks:
            reply = self._read_reply(timeout)
            if "pid" not in reply:
                raise RuntimeError(f"fork server could not spawn {list(argv)}: "
                                   f"{reply.get('error', reply)}")
            pids.append(int(reply["pid"]))
        return pids

    def poll(self) -> dict[int, int]:
        """Exit codes of every child that has exited so far (pid -> code)."""
        with self._lock:
            self._replies.extend(self._pump(0.0))
            return dict(self._exits)

    def close(self) -> None:
        """End the server; its children get SIGKILL through PDEATHSIG."""
        if self._proc.poll() is None:
            self._proc.kill()  # first: a thread waiting on the server then reads its end
            self._proc.wait(timeout=10)
        if self._lock.acquire(timeout=10):
            try:
                self._sock.close()
            finally:
                self._lock.release()
        else:  # a reader that never woke: close under it (it fails, as the server is gone)
            self._sock.close()

    # -- plumbing --------------------------------------------------------------------------
    def _send(self, msg: dict) -> None:
        self._sock.sendall((json.dumps(msg) + "\n").encode())

    def _pump(self, timeout: float) -> list[dict]:
        replies = []
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if ready:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise RuntimeError("fork server exited unexpectedly")
            self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            msg = json.loads(line)
            if "exit" in msg:
                self._exits[int(msg["exit"])] = int(msg["code"])
            else:
                replies.append(msg)
        return replies

    def _read_reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            if self._replies:  # one read may bring several (the replies to spawn_many)
                return self._replies.pop(0)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"fork server did not answer within {timeout:.0f} s")
            self._replies.extend(self._pump(min(left, 0.5)))
            if not self._replies and self._proc.poll() is not None:
                raise RuntimeError(f"fork server exited with code {self._proc.returncode}")


# ---------------------------------------------------------------------------------------------
# Server side.

def _run_child(req: dict, out: int | None = None) -> NoReturn:
    """In the forked child: become the rank, run its main, and exit as a cold interpreter would.

    The script runs as this process's real ``__main__`` and stays installed (``runpy.run_path``
    would run it in a temporary module and free its globals the moment it returns, while the
    interpreter is live), and the child leaves by ``SystemExit`` through the interpreter's own
    exit: ``atexit`` handlers run, non-daemon threads are joined, open files are flushed, and
    what the script still holds is freed during finalization, exactly as after ``python
    script.py`` under torchrun (with the default process group, which the warm-up keeps until
    then as a cold rank does: ``warmup._keep_default_group``). Its output goes to ``out`` (its
    client's), else to the request's ``log`` file. Never returns."""
    import runpy
    import types

    os.setsid()
    log = out if out is not None else os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                                              0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    if "torch" in sys.modules and "OMP_NUM_THREADS" in os.environ:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    argv = req["argv"]
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.modules["__main__"] = types.ModuleType("__main__")
            known = _cached(("m", argv[1]))
            if known is not None:  # what runpy does below, with the server's code object
                code, spec = known
                assert spec is not None and spec.origin  # _cached checked a module's origin
                sys.argv[0] = spec.origin
                runpy._run_code(code, sys.modules["__main__"].__dict__, None,  # type: ignore[attr-defined]
                                "__main__", spec)
            else:
                # What ``python -m`` itself calls: runs the module in ``__main__``'s namespace
                # and sets sys.argv[0] to its file.
                runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            known = _cached(("s", os.path.abspath(argv[0])))
            _run_script(argv[0], known[0] if known is not None else None)
    except SystemExit:
        raise  # the interpreter reports its code (and prints a message) as for python script.py
    except BaseException as e:
        # As the interpreter does for an uncaught exception: print it (from the script's first
        # frame), keep it (sys.last_*, so what its frames hold is freed at finalization, not
        # now) and exit 1.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
            tb = tb.tb_next
        e.with_traceback(tb)  # what the hook prints is the exception's own traceback
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
        sys.excepthook(type(e), e, tb)
        raise SystemExit(1) from None
    raise SystemExit(0)


_OWN_FILES = {__file__, "<frozen runpy>", getattr(sys.modules.get("runpy"), "__file__", None)}


# What the server compiled once, for every rank it forks: ("m", module) or ("s", script path) ->
# (the source's (mtime_ns, size, inode), code, spec or None). A rank runs a cached code object only
# while its source file is unchanged; otherwise it compiles as a cold interpreter would.
_CODE: dict[tuple[str, str], tuple[tuple[int, int, int], object, ModuleSpec | None]] = {}


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def _cached(key: tuple[str, str]) -> tuple[object, ModuleSpec | None] | None:
    entry = _CODE.get(key)
    if entry is None:
        return None
    stamp, code, spec = entry
    origin = getattr(spec, "origin", None) if key[0] == "m" else key[1]
    return (code, spec) if origin and _stamp(origin) == stamp else None


def _compile_once(argv: Sequence[str], cwd: str) -> None:
    """In the server, before forking: the code a rank would compile (or read from its .pyc) on
    its way to ``main``, made once for every rank and generation. Only for a module the server
    has imported already (a preload: nothing new runs here) or a script file (compiling runs
    nothing); anything that fails is left to the rank, which then reports it itself."""
    try:
        if argv[0] == "-m":
            name = argv[1]
            module = sys.modules.get(name)
            spec = getattr(module, "__spec__", None)
            if ("m", name) in _CODE or module is None or hasattr(module, "__path__") \
                    or spec is None or not spec.origin or not hasattr(spec.loader, "get_code"):
                return
            stamp = _stamp(spec.origin)
            code = spec.loader.get_code(name)
            if stamp is not None and code is not None and _stamp(spec.origin) == stamp:
                _CODE[("m", name)] = (stamp, code, spec)
        else:
            path = os.path.join(cwd, argv[0])
            path = os.path.abspath(path)
            stamp = _stamp(path)
            if stamp is None or (("s", path) in _CODE and _CODE[("s", path)][0] == stamp):
                return
            import io

            with io.open_code(path) as f:
                code = compile(f.read(), path, "exec", dont_inherit=True)
            if _stamp(path) == stamp:
                _CODE[("s", path)] = (stamp, code, None)
    except Exception:
        return


def _run_script(path: str, code: object = None) -> None:
    """Run the file ``path`` as this process's ``__main__``, as ``python path`` does (``code``:
    the server's compilation of it, still current)."""
    import builtins
    import importlib.machinery
    import io
    import types

    path = os.path.abspath(path)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    if code is None:
        with io.open_code(path) as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)  # type: ignore[arg-type]


def _prepare(preload: Sequence[str]) -> str | None:
    """Import the preloads and freeze what they left; why forking would be unsafe, or None."""
    try:
        for name in preload:
            importlib.import_module(name)
    except BaseException as e:  # report, don't hang the client
        return f"preload {name}: {e!r}"
    threads = thread_names()
    if threads:  # forking a threaded process can deadlock the children: refuse
        known = [f"{name} is {KNOWN_THREADS[name]}" for name in sorted(set(threads) & set(KNOWN_THREADS))]
        return (f"preloading {list(preload)} started {len(threads)} thread(s) ({', '.join(threads)}), "
                "and forking a process with threads is unsafe. "
                + ("; ".join(known) + ". " if known else
                   "Find the import that starts one (python -c 'import MODULE' and list "
                   "/proc/PID/task/*/comm) and stop it with that library's setting in the "
                   "environment. ")
                + "Or run cold with --reshard-launcher=local (slower: every rank imports torch).")
    # What the preloads left is the ranks' shared, read-only base: collect its garbage once, then
    # freeze it, so that no rank's collector scans it again (a full collection in every rank,
    # and the one that ends every interpreter, would otherwise walk all of torch and write to
    # each page of it, copying the pages fork shares) and its exit costs a fraction of a cold one.
    gc.collect()
    gc.freeze()
    return None


def serve(fd: int, parent: int, preload: Sequence[str]) -> None:
    """The server of one client, on the socket ``fd``: it ends (and its ranks with it) when that
    client goes."""
    die_with_parent(parent)
    sock = socket.socket(fileno=fd)
    error = _prepare(preload)
    if error is not None:
        sock.sendall((json.dumps({"ready": False, "error": error}) + "\n").encode())
        return
    sock.sendall(b'{"ready": true}\n')
    _Forks({sock: _Client()}).run()


def serve_at(name: str, preload: Sequence[str]) -> None:
    """The server of every client that connects to the abstract unix socket ``name`` (a node's
    agents, one per generation): a client's ranks die with its connection, the server lives on.
    A client's first line (``{"op": "hello"}``) carries the descriptor its ranks write their
    output to (``SCM_RIGHTS``); requests then are those of ``serve``, without ``log``."""
    die_with_parent(os.getppid())
    error = _prepare(preload)
    if error is not None:
        raise SystemExit(f"fork server {name}: {error}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    print(f"fork server {name}: ready (pid {os.getpid()})", flush=True)
    _Forks({}, listener).run()


class _Client:
    def __init__(self, out: int | None = None, buffer: bytes = b"") -> None:
        self.out = out          # the descriptor its ranks write to (None: each request's log)
        self.buffer = buffer
        self.children: set[int] = set()


class _Forks:
    """The single-threaded loop: accept clients, fork their ranks, report each exit to the
    client that asked for the rank."""

    def __init__(self, clients: dict[socket.socket, _Client],
                 listener: socket.socket | None = None) -> None:
        self.clients, self.listener = clients, listener
        self.owner: dict[int, socket.socket] = {}   # rank pid -> its client's socket

    def run(self) -> None:
        me = os.getpid()
        while True:
            watched = [*self.clients, *([self.listener] if self.listener is not None else [])]
            ready, _, _ = select.select(watched, [], [], 0.01)
            for sock in ready:
                if sock is self.listener:
                    self._accept()
                    continue
                try:
                    chunk = sock.recv(1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:  # client gone: take its ranks with it
                    self._drop(sock)
                    if self.listener is None:
                        return
                    continue
                self._requests(sock, chunk, me)
            self._reap()

    def _accept(self) -> None:
        assert self.listener is not None
        conn, _ = self.listener.accept()
        conn.settimeout(10)  # the hello follows the connect at once
        try:
            hello, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1)
        except OSError:
            conn.close()
            return
        conn.settimeout(None)
        if not fds:
            conn.close()
            return
        self.clients[conn] = _Client(fds[0], hello)
        self._requests(conn, b"", os.getpid())

    def _requests(self, sock: socket.socket, chunk: bytes, me: int) -> None:
        client = self.clients[sock]
        client.buffer += chunk
        while b"\n" in client.buffer:
            line, client.buffer = client.buffer.split(b"\n", 1)
            req = json.loads(line)
            if req.get("op") != "spawn":
                continue
            _compile_once(req["argv"], req["cwd"])
            pid = os.fork()
            if pid == 0:
                self._become(client, me, req)
            client.children.add(pid)
            self.owner[pid] = sock
            self._tell(sock, {"pid": pid})

    def _become(self, client: _Client, server: int, req: dict) -> NoReturn:
        """In the child: hold nothing of the server's (another client's socket or output would
        stay open as long as this rank lives), then run the rank."""
        for sock, other in self.clients.items():
            sock.close()
            if other is not client and other.out is not None:
                os.close(other.out)
        if self.listener is not None:
            self.listener.close()
        die_with_parent(server)
        # Raises SystemExit: it unwinds out of the server's loop and the interpreter exits with
        # the rank's code, finalizing as after ``python script.py``.
        _run_child(req, client.out)

    def _tell(self, sock: socket.socket, msg: dict) -> None:
        if sock not in self.clients:
            return
        try:
            sock.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        client = self.clients.pop(sock, None)
        if client is None:
            return
        for pid in client.children:
            killpg(pid)
        if client.out is not None:
            os.close(client.out)
        sock.close()

    def _reap(self) -> None:
        while self.owner:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            sock = self.owner.pop(pid, None)
            if sock is not None and sock in self.clients:
                self.clients[sock].children.discard(pid)
                self._tell(sock, {"exit": pid, "code": exit_code(status)})


if __name__ == "__main__":
    if sys.argv[1] == "--at":  # python -m ...forkserver --at NAME PRELOAD...
        serve_at(sys.argv[2], sys.argv[3:])
    else:
        serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
