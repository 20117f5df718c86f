"""Real inference servers as processes for the tests: llama.cpp's `llama-server` built by
scripts/build_llama_server.sh, serving the tiny model of scripts/tiny_model.py.

The binary is found through ROLLSTREAM_LLAMA_SERVER (set by .ci/run), else in the build
script's default cache. Without it the tests skip, unless ROLLSTREAM_REQUIRE_REAL_SERVERS=1
(CI sets it after building), where a missing binary fails them: CI must not pass by skipping.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the sdist scripts/build_llama_server.sh builds from
REQUIRE_ENV = "ROLLSTREAM_REQUIRE_REAL_SERVERS"
BINARY_ENV = "ROLLSTREAM_LLAMA_SERVER"


def default_cache() -> Path:
    """Where scripts/build_llama_server.sh puts its output when not told otherwise."""
    root = os.environ.get("ROLLSTREAM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rollstream")
    return Path(root) / "llama-server"


def llama_server_binary() -> Path:
    """The llama-server to run, or skip (fail when CI requires real servers)."""
    given = os.environ.get(BINARY_ENV)
    path = Path(given) if given else default_cache() / LLAMA_CPP_PYTHON_VERSION / "bin/llama-server"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    why = (f"no llama-server at {path}: run `bash scripts/build_llama_server.sh` "
           f"(or set {BINARY_ENV})")
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {why}")
    pytest.skip(why)


def load_tiny_model_script():
    spec = importlib.util.spec_from_file_location("tiny_model", ROOT / "scripts/tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render_chat_template(config_dir: Path, messages: list[dict],
                         add_generation_prompt: bool = True) -> str:
    """Render a tokenizer_config.json's chat template as transformers does (sandboxed
    environment, trim_blocks and lstrip_blocks, loop controls)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    config = json.loads((config_dir / "tokenizer_config.json").read_text())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    return env.from_string(config["chat_template"]).render(
        messages=messages, add_generation_prompt=add_generation_prompt)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(base_url: str, path: str, body: Any = None, timeout_s: float = 60.0,
            method: str | None = None) -> tuple[int, Any]:
    """(status, parsed JSON body) of one request; HTTP errors are answers, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base_url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def llama_server_argv(binary: Path, model: Path, port: int, *, n_ctx: int = 512,
                      alias: str = "tiny", extra: tuple[str, ...] = ()) -> list[str]:
    """One slot (-np 1: the slot's context is all of -c), one thread, loopback only."""
    return [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(n_ctx), "-np", "1", "-t", "1", "-a", alias, "--no-webui", *extra]


@contextmanager
def running(argv: list[str], base_url: str, log: Path, *, health: str = "/health",
            timeout_s: float = 60.0) -> Iterator[subprocess.Popen]:
    """Start a server process, wait until `health` answers 200, stop it on exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited {proc.returncode} at start: "
                                   f"{log.read_text(errors='replace')[-2000:]}")
            try:
                if request(base_url, health, timeout_s=2.0)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not answer {health} in {timeout_s:.0f} s: "
                                   f"{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
