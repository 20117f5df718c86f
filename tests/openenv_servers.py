"""Real OpenEnv env server processes for the tests and benchmarks (tests/openenv_server.py,
built with openenv-core's server API), their stdout read line by line so a test can wait for
what the server did (a reset, a step), never for a timer."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

SERVER = Path(__file__).resolve().parent / "openenv_server.py"
HAVE_OPENENV = importlib.util.find_spec("openenv") is not None


class EnvServer:
    """One `tests/openenv_server.py` process on a port of loopback."""

    def __init__(self, port: int, max_sessions: int = 1) -> None:
        self.port = port
        self.max_sessions = max_sessions
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []  # every line it printed, across restarts
        self._seen = threading.Condition()

    def start(self, timeout_s: float = 60.0) -> EnvServer:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--port", str(self.port),
             "--max-sessions", str(self.max_sessions)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused one too
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

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
