"""The processes of a local run: starting producers (and their environment and /metrics
ports), stopping processes (SIGTERM, then SIGKILL), turning SIGINT/SIGTERM into
KeyboardInterrupt, and watching that some producer still runs.

Used by `rollstream up` (`rollstream/launcher.py`), the benchmarks and the example trainer.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rollstream.embedded import spawn
from schemas.errors import ConfigError, ProducersExited

logger = logging.getLogger(__name__)

PRODUCER_WATCH_S = 0.5  # how often `up` looks whether any of its producers still runs


def start_producers(url: str, run: str, count: int, log_level: str,
                    pythonpath: Sequence[str] = (), metrics_ports: Sequence[int] = (),
                    metrics_addr: str = "0.0.0.0") -> list[subprocess.Popen]:
    """Producer processes in their own session (a terminal's Ctrl+C reaches only us).

    The Redis URL and run name travel in their environment, never on argv (`ps` shows argv;
    a URL can hold a password); `pythonpath` folders come first on their PYTHONPATH (a
    policy's module). Producer i serves /metrics on `metrics_ports[i]` when given."""
    cmd = [sys.executable, "-m", "rollstream", "--log-level", log_level, "produce"]
    env = child_env(url, run, pythonpath)
    ports: list[int | None] = [*metrics_ports] or [None] * count
    return [spawn(cmd if port is None else
                  [*cmd, "--metrics-port", str(port), "--metrics-addr", metrics_addr], env=env)
            for port in ports[:count]]


def producer_ports(metrics_port: int | None, count: int) -> list[int]:
    """The producers' /metrics ports under `up --metrics-port P`: P+1 .. P+count."""
    return [] if metrics_port is None else [metrics_port + 1 + i for i in range(count)]


def check_ports(addr: str, ports: Sequence[int]) -> None:
    """`ConfigError` naming the first port of `ports` that cannot be bound on `addr` (before
    anything starts, rather than a producer failing later)."""
    for i, port in enumerate(ports):
        if not 0 < port <= 65535:
            raise ConfigError(f"--metrics-port: port {port} is out of range (the trainer "
                              "takes P, the producers P+1 .. P+N)")
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((addr, port))
            except socket.gaierror as exc:  # the address, not the port
                raise ConfigError(f"--metrics-addr {addr!r}: not an address of this machine: "
                                  f"{exc.strerror or exc}") from None
            except OSError as exc:
                who = "the trainer" if i == 0 else f"producer {i}"
                raise ConfigError(f"--metrics-port: port {port} on {addr} (for {who}) is not "
                                  f"free: {exc.strerror or exc}") from None


def metrics_line(addr: str, trainer_port: int | None, ports: Sequence[int]) -> str:
    where = "localhost" if addr in ("0.0.0.0", "::", "") else addr
    parts = [f"trainer http://{where}:{trainer_port}/metrics"] if trainer_port else []
    if ports:
        parts.append(f"producers :{ports[0]}" + (f"-{ports[-1]}" if len(ports) > 1 else ""))
    return "metrics: " + ", ".join(parts)


def child_env(url: str, run: str, pythonpath: Sequence[str] = ()) -> dict[str, str]:
    """This environment plus the run's URL and name, and `pythonpath` first on PYTHONPATH."""
    env = {**os.environ, "ROLLSTREAM_REDIS_URL": url, "ROLLSTREAM_RUN": run}
    env.pop("ROLLSTREAM_METRICS_PORT", None)  # each child is given its own port, or none
    paths = [*pythonpath, *filter(None, [env.get("PYTHONPATH")])]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


STOP_S = 15.0  # after SIGTERM, a process's time to exit before `stop_processes` SIGKILLs it


def stop_processes(procs: list[subprocess.Popen], timeout_s: float | None = None,
                   what: str = "producer") -> list[int]:
    """SIGTERM each, wait (`STOP_S` unless given), then SIGKILL what is left. Returns the exit
    codes."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + (STOP_S if timeout_s is None else timeout_s)
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("%s pid %d ignored SIGTERM; killing it", what, proc.pid)
            proc.kill()
            proc.wait()
    return [proc.returncode for proc in procs]


@contextmanager
def interrupt_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so the same cleanup runs for both.

    Installed explicitly: a process started with SIGINT ignored (`nohup`, `&` in a script)
    inherits the ignore, and Python then installs no handler of its own for Ctrl+C."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, raise_interrupt)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def all_exited(procs: Sequence[subprocess.Popen]) -> bool:
    return bool(procs) and all(proc.poll() is not None for proc in procs)


def any_failed(procs: Sequence[subprocess.Popen]) -> bool:
    """A producer that exited other than by a stop (0) or our SIGTERM."""
    return any(proc.poll() not in (None, 0, -signal.SIGTERM) for proc in procs)


def producers_gone(procs: Sequence[subprocess.Popen]) -> ProducersExited:
    codes = [proc.returncode for proc in procs]
    return ProducersExited(f"every producer exited (exit codes {codes}) while the trainer "
                           "waited for a batch; their log lines above say why")


@contextmanager
def producers_watched(procs: Sequence[subprocess.Popen]) -> Iterator[None]:
    """Raises `ProducersExited` in the main thread once every producer has exited, instead of
    letting the trainer wait out get_batch's timeout for a batch nobody will fill. A watcher
    thread simulates SIGUSR1 for the main thread (`_thread.interrupt_main`), whose handler
    raises as Ctrl+C's raises KeyboardInterrupt: the wait ends within one read's block."""
    import _thread

    ended = threading.Event()  # the block below is done: the run ends anyway

    def raise_gone(signum: int, frame: object) -> None:
        if not ended.is_set():
            raise producers_gone(procs)

    def watch() -> None:
        while not all_exited(procs):
            if ended.wait(PRODUCER_WATCH_S):  # (the block's end wakes it: no sleep to
                return  # wait out when `up` ends)
        if not ended.is_set():
            _thread.interrupt_main(signal.SIGUSR1)

    # everything inside the try: a Ctrl+C landing as the watch starts (up's start) left it
    # running and armed, and once the cleanup had stopped the producers it raised
    # ProducersExited over the KeyboardInterrupt (exit 1 instead of 130)
    watcher = threading.Thread(target=watch, name="producer-watch", daemon=True)
    previous: Any = None
    try:
        previous = signal.signal(signal.SIGUSR1, raise_gone)
        watcher.start()
        yield
    finally:
        ended.set()
        if watcher.ident is not None:
            watcher.join()
        if previous is not None:
            signal.signal(signal.SIGUSR1, previous)
