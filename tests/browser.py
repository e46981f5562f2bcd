"""A real headless Chromium, driven over the DevTools protocol on a pipe (no extra packages).

``--remote-debugging-pipe`` makes Chromium read protocol commands from fd 3 and write replies
and events to fd 4, each a JSON message ended by a NUL byte. That is enough to open a page,
collect console errors, query the rendered DOM and take a screenshot, with nothing but the
standard library. Every wait is bounded; the browser's whole process group is killed on every
path out (``close``).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any

CANDIDATES = ("chromium", "google-chrome", "google-chrome-stable", "chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-pipe"]


def find() -> str | None:
    """The browser to use: ``$RESHARD_CHROMIUM``, else the first of CANDIDATES on PATH."""
    exe = os.environ.get("RESHARD_CHROMIUM")
    if exe:
        return exe
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def group_alive(pgid: int) -> bool:
    """Any process (not yet reaped) left in the process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _high(*fds: int) -> tuple[int, ...]:
    """The same pipe ends as fds >= 10, so moving them onto 3 and 4 cannot clobber one."""
    out = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return out


class Browser:
    def __init__(self, exe: str, *, timeout_s: float = 30.0, width: int = 1100,
                 height: int = 900) -> None:
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="reshard-chromium-")
        cmd_r, self._cmd_w = _high(*os.pipe())  # we write commands; Chromium reads fd 3
        self._out_r, out_w = _high(*os.pipe())  # Chromium writes fd 4; we read
        args = [*FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                "about:blank"]
        # Chromium insists on fds 3 and 4: bash (dash cannot name fds >= 10) moves the pipe ends
        # there, then execs it.
        script = f'exec "$0" "$@" 3<&{cmd_r} 4>&{out_w} {cmd_r}<&- {out_w}>&-'
        self.proc = subprocess.Popen(["bash", "-c", script, exe, *args], pass_fds=(cmd_r, out_w),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    # -- protocol --------------------------------------------------------------------------
    def send(self, method: str, params: dict[str, Any] | None = None, *,
             session: bool = True) -> dict[str, Any]:
        """Send a command and wait (bounded) for its reply; events seen meanwhile are kept."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        reply = self._until(lambda m: m.get("id") == self._next_id, f"the reply to {method}")
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str) -> dict[str, Any]:
        for e in self.events:
            if e.get("method") == method:
                return e
        return self._until(lambda m: m.get("method") == method, f"the event {method}")

    def _until(self, match: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                m = json.loads(raw)
                if "method" in m:
                    self.events.append(m)
                if match(m):
                    return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} from Chromium within {self.timeout_s:.0f} s")
            ready, _, _ = select.select([self._out_r], [], [], left)
            if ready:
                chunk = os.read(self._out_r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the pipe while we waited for {what} "
                                       f"(exit code {self.proc.poll()})")
                self._buf += chunk

    # -- pages -----------------------------------------------------------------------------
    def open(self, url: str) -> None:
        """Open ``url`` in a fresh tab with console, log and page events on; wait for load."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target["targetId"], "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        return base64.b64decode(data["data"])

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (failed loads) so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console." + p["type"] + ": " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e["method"] == "Runtime.exceptionThrown":
                out.append("exception: " + p["exceptionDetails"].get("text", ""))
            elif e["method"] == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out

    def close(self) -> None:
        """Ask politely, then kill the whole process group; always remove the profile."""
        try:
            if self.proc.poll() is None:
                try:
                    self.send("Browser.close", session=False)
                except (OSError, RuntimeError, TimeoutError):
                    pass
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # zygotes and renderers too
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait(timeout=10)
            deadline = time.monotonic() + 10  # orphaned children are reaped by init: wait for it
            while group_alive(self.proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            for fd in (self._cmd_w, self._out_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
