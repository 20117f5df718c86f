"""Helpers for the LLM tests: stand-in servers on loopback, plain HTTP calls, configs."""

from __future__ import annotations

import errno
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from helpers import PORT_TRIES, free_port, small_config

from rollstream.fake_llm import FakeLLMOptions, FakeLLMServer
from schemas.config import RolloutConfig

MODEL = "fake-model"


def fake_llm_factory() -> Iterator[Callable[..., FakeLLMServer]]:
    """Fixture body: `start(**options)` starts a stand-in server on a thread; all are
    stopped at teardown. Use as `fake_llm = pytest.fixture(fake_llm_factory)`.

    Each listens on a `free_port()`, not on port 0: a test stops a server and starts it
    again on its port (a server that comes back), or keeps its URL as one that refuses, and
    a port from the kernel's ephemeral range is another process's for the taking meanwhile."""
    started: list[FakeLLMServer] = []

    def start(**options: Any) -> FakeLLMServer:
        for _ in range(PORT_TRIES - 1):
            try:
                server = FakeLLMServer(FakeLLMOptions(**options), port=free_port()).start()
                break
            except OSError as exc:  # the port was taken after free_port() looked
                if exc.errno != errno.EADDRINUSE:
                    raise
        else:
            server = FakeLLMServer(FakeLLMOptions(**options), port=free_port()).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def http(url: str, body: Any = None, *, headers: dict[str, str] | None = None,
         timeout_s: float = 10.0) -> tuple[int, Any]:
    """(status, decoded JSON or text) of a GET (no body) or a JSON POST."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def llm_config(base_urls: list[str], *, policy: dict[str, Any] | None = None,
               **overrides: Any) -> RolloutConfig:
    """`small_config` driven by the openai policy (short timeouts, few tokens)."""
    block = {"type": "openai", "base_urls": base_urls, "model": MODEL, "max_tokens": 64,
             "timeout_s": 5.0, "max_retries": 2, **(policy or {})}
    return small_config(policy=block, **overrides)
