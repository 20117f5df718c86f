"""Real OpenEnv env server processes for the tests and benchmarks (tests/openenv_server.py,
built with openenv-core's server API), their stdout read line by line so a test can wait for
what the server did (a reset, a step), never for a timer.

Importing openenv-core costs seconds (its `env_server` package imports gradio and fastmcp),
paid again by every server process started with `python tests/openenv_server.py`. A test
module that starts many servers hands `EnvServer` a `ForkServer`: one process that imported
it all once and forks each server from there, so a start costs a fork and uvicorn's startup.
A forked server is the same server in a process of its own, with its own pid to SIGSTOP or
SIGKILL and its own stdout; only its parent differs."""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

SERVER = Path(__file__).resolve().parent / "openenv_server.py"
HAVE_OPENENV = importlib.util.find_spec("openenv") is not None
# one thread at the fork server's forks: numpy's OpenBLAS and pyarrow's jemalloc (which
# gradio imports) start none with these (see tests/openenv_server.py)
FORK_ENV = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}


class ForkServer:
    """One `tests/openenv_server.py --fork-server` process (protocol in that module's doc).
    It imports in the background from here on; the first fork waits for it."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--fork-server", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), env={**os.environ, **FORK_ENV},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        theirs.close()
        self.sock = ours
        self.output: list[str] = []  # what the fork server itself said (a traceback)
        self._lock = threading.Lock()  # one request and its answer at a time
        self._forked = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.output.append(line.rstrip("\n"))

    def fork(self, argv: list[str], timeout_s: float) -> Forked:
        """A server process serving as `tests/openenv_server.py *argv` would, its stdout and
        stderr at `Forked.stdout`."""
        read, write = os.pipe()
        try:
            with self._lock:
                self.sock.settimeout(timeout_s)
                request = json.dumps({"argv": argv}).encode()
                socket.send_fds(self.sock, [request], [write])
                self._forked = True
                message, fds, _, _ = socket.recv_fds(self.sock, 4096, 1)
        except BaseException as exc:
            os.close(read)
            self.close()  # a request without its answer: its later answers would be out of step
            raise AssertionError(f"the fork server did not answer ({exc!r}): "
                                 f"{self.output[-10:]}") from None
        finally:
            os.close(write)
        for fd in fds:
            os.set_inheritable(fd, False)
        answer: dict[str, Any] = json.loads(message) if message else {"error": "it exited"}
        if "error" in answer:
            os.close(read)
            for fd in fds:
                os.close(fd)
            raise AssertionError(f"the fork server: {answer['error']}; {self.output[-10:]}")
        return Forked(answer["pid"], fds[0], os.fdopen(read, encoding="utf-8"))

    def close(self) -> None:
        """Its end of the socket closed, it exits, and its servers die with it. One that
        never forked is killed (it may still be importing)."""
        self.sock.close()
        if not self._forked:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class Forked:
    """A server process forked by the fork server, held by a pidfd: signals reach that very
    process (never one that reused its pid), and the pidfd tells when it has exited. Not a
    child of this process: the fork server reaps it. The subset of `subprocess.Popen` that
    `EnvServer` uses."""

    def __init__(self, pid: int, pidfd: int, out: IO[str]) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.stdout = out
        self.returncode: int | None = None  # -1 once it exited (its status is the fork server's)

    def poll(self) -> int | None:
        if self.returncode is None:
            watch = select.poll()
            watch.register(self.pidfd, select.POLLIN)
            if watch.poll(0):
                self.returncode = -1
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.pidfd < 0:
            return  # waited for and closed: gone
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            pass  # exited already

    def wait(self, timeout: float) -> int:
        """Wait until it has exited and the fork server has reaped it: gone, pid and all."""
        if self.pidfd < 0:
            return -1
        deadline = time.monotonic() + timeout
        watch = select.poll()
        watch.register(self.pidfd, select.POLLIN)
        if not watch.poll(timeout * 1000):
            raise subprocess.TimeoutExpired(f"env server pid {self.pid}", timeout)
        self.returncode = -1
        while True:
            try:
                signal.pidfd_send_signal(self.pidfd, 0)  # a zombie still takes a signal
            except ProcessLookupError:
                return self.returncode
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"env server pid {self.pid} (unreaped)",
                                                timeout)
            time.sleep(0.005)

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


class EnvServer:
    """One `tests/openenv_server.py` server process on a port of loopback: started as a
    process of its own, or forked by `forks` when given. `stop_when_full`: it SIGSTOPs
    itself once, mid-step, when all its sessions are mid-episode (it prints `stopped`)."""

    def __init__(self, port: int, max_sessions: int = 1, forks: ForkServer | None = None,
                 stop_when_full: bool = False) -> None:
        self.port = port
        self.max_sessions = max_sessions
        self.forks = forks
        self.argv = ["--port", str(port), "--max-sessions", str(max_sessions)]
        if stop_when_full:
            self.argv.append("--stop-when-full")
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | Forked | None = None
        self.lines: list[str] = []  # every line it printed, across restarts
        self._seen = threading.Condition()

    def start(self, timeout_s: float = 60.0) -> EnvServer:
        if isinstance(self.proc, Forked):
            self.proc.close()
        if self.forks is not None:
            self.proc = self.forks.fork(self.argv, timeout_s)
        else:
            self.proc = subprocess.Popen([sys.executable, str(SERVER), *self.argv],
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"env server exited {self.proc.returncode}: "
                                     f"{self.lines[-5:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"env server on {self.port} did not answer /health")

    def _read(self, proc: subprocess.Popen | Forked) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                with self._seen:
                    self.lines.append(line.rstrip("\n"))
                    self._seen.notify_all()

    def wait_line(self, prefix: str, after: int = 0, timeout_s: float = 60.0) -> int:
        """Wait until a line from index `after` on starts with `prefix`; its index."""
        deadline = time.monotonic() + timeout_s
        with self._seen:
            while True:
                for i in range(after, len(self.lines)):
                    if self.lines[i].startswith(prefix):
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"env server {self.port} printed no {prefix!r} "
                                         f"line; last: {self.lines[-5:]}")
                self._seen.wait(left)

    def kill(self) -> None:
        """SIGKILL; it is gone (its port free) when this returns."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused one too
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        if isinstance(self.proc, Forked):
            self.proc.close()

    def pause(self) -> None:
        """SIGSTOP: the server holds its connections and answers nothing (a hung server)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def count(self, prefix: str) -> int:
        with self._seen:
            return sum(1 for line in self.lines if line.startswith(prefix))
