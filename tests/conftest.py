"""Test fixtures: a real Redis server, a run name of each test's own, producers.

The server is the one at ROLLSTREAM_TEST_REDIS_URL when set (CI sets it when a server answers
at 127.0.0.1:6379), else an embedded redis-server this suite starts and stops itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from helpers import ProducerThread, small_config
from proxy import RedisProxy

from producers.producer import Producer
from rollstream.embedded import EmbeddedRedis
from schemas.config import RolloutConfig
from schemas.keys import Keys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("schemas", "producers", "consumer", "rollstream")


def pytest_configure(config: pytest.Config) -> None:
    """Compile the packages' bytecode once, before any test starts a process.

    The suite starts ~390 Python processes (producers, the CLI, stand-in servers); with
    PYTHONDONTWRITEBYTECODE set (this machine's and CI's environment) none of them writes the
    `.pyc` it compiles, so each compiled every module of ours it imported again: ~0.55 s of
    imports a producer instead of ~0.39 (docs/decisions/testing.md). Python still checks each
    `.pyc` against its source, so an edited module is compiled afresh, never stale."""
    import compileall

    for package in PACKAGES:
        compileall.compile_dir(os.path.join(ROOT, package), quiet=1)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("ROLLSTREAM_TEST_REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
def run(redis_url: str) -> Iterator[str]:
    """A run name of this test's own; its keys are deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=Keys(name).pattern(), count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    yield client
    client.close()


@pytest.fixture
def config_factory() -> Callable[..., RolloutConfig]:
    return small_config


@pytest.fixture
def producer_thread(redis_url: str,
                    producer_at: Callable[..., ProducerThread]) -> Callable[..., ProducerThread]:
    """Producers in threads of this process (fast to start), stopped at teardown."""
    return lambda **kwargs: producer_at(redis_url, **kwargs)


@pytest.fixture
def producer_process(redis_url: str, run: str) -> Iterator[Callable[..., subprocess.Popen]]:
    """Real `rollstream produce` processes; killed at teardown if still running."""
    procs: list[subprocess.Popen] = []

    def start(*extra: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "rollstream", "--log-level", "INFO", "produce",
               "--redis-url", redis_url, "--run", run, *extra]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=10)
        print(f"--- producer pid {proc.pid} exit {proc.returncode}:\n{out}")  # on failure


@pytest.fixture
def proxy(redis_url: str) -> Iterator[RedisProxy]:
    """A loopback proxy in front of the test Redis (tests/proxy.py); closed at teardown."""
    with RedisProxy(redis_url) as started:
        yield started


@pytest.fixture
def producer_at(run: str) -> Iterator[Callable[..., ProducerThread]]:
    """Like `producer_thread`, but the producer talks to the Redis URL it is given (a proxy)."""
    started: list[ProducerThread] = []

    def start(url: str, **kwargs: Any) -> ProducerThread:
        kwargs.setdefault("handle_signals", False)
        kwargs.setdefault("poll_interval_s", 0.05)
        thread = ProducerThread(Producer(url, run, **kwargs)).start()
        started.append(thread)
        return thread

    yield start
    for thread in started:
        if thread.thread.is_alive():
            thread.stop()
