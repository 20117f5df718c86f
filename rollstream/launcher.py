"""`rollstream up`: Redis (embedded unless a URL is given), producer processes, a trainer loop.

The trainer loop is a stand-in for a real trainer (`rollstream/trainer.py`): get a batch,
"train" for `train_step_s`, ack, publish the next version, print one line. `up --trainer`
runs the user's script in its place. Ctrl+C or SIGTERM stops the run, its producer processes
and the embedded server; producers also die with this process (PDEATHSIG). Starting and
stopping the processes is `rollstream/processes.py`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from rollstream.embedded import EmbeddedRedis, spawn
from rollstream.processes import (
    PRODUCER_WATCH_S,
    all_exited,
    any_failed,
    check_ports,
    child_env,
    interrupt_signals,
    metrics_line,
    producer_ports,
    producers_gone,
    producers_watched,
    start_producers,
    stop_processes,
)
from rollstream.trainer import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UpOptions, train_session
from schemas.config import RolloutConfig
from schemas.redisconn import mask_url, sync_client

logger = logging.getLogger(__name__)

__all__ = [  # with the names the benchmarks and the example trainer import from here
    "UpOptions", "default_producers", "interrupt_signals", "start_producers",
    "stop_processes", "train", "up", "up_trainer",
]


def default_producers(config: RolloutConfig) -> int:
    """Enough producers for the shards, at most one per core."""
    shards = sum(config.manager(m).num_shards for m in config.modes())
    return max(1, min(shards, os.cpu_count() or 1))


@contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


def _mode(config: RolloutConfig) -> str:
    return f"{'sync' if config.is_sync else 'async'} (ratio {config.ratio})"


def up(opts: UpOptions, out: TextIO = sys.stdout) -> int:
    """The whole run on this machine. Returns the exit status: 0 done, 1 a producer failed,
    130 interrupted (a trainer failure raises)."""
    count = opts.producers or default_producers(opts.config)
    try:
        with interrupt_signals():
            return _up(opts, count, out)
    except KeyboardInterrupt:  # before the trainer loop started, or during the cleanup
        print("interrupted", file=out, flush=True)
        return EXIT_INTERRUPTED


def _up(opts: UpOptions, count: int, out: TextIO) -> int:
    ports = producer_ports(opts.metrics_port, count)
    if opts.metrics_port is not None:
        check_ports(opts.metrics_addr, [opts.metrics_port, *ports])
    with redis_server(opts.redis_url) as url:
        client = sync_client(url, socket_timeout=30, socket_connect_timeout=5)
        procs = start_producers(url, opts.run, count, opts.log_level,  # they await the config
                                metrics_ports=ports, metrics_addr=opts.metrics_addr)
        try:
            header = (f"rollstream up: run {opts.run!r} at {mask_url(url)}, {count} producer(s), "
                      f"{_mode(opts.config)}")
            if opts.metrics_port is not None:
                header += "\n" + metrics_line(opts.metrics_addr, opts.metrics_port, ports)
            with producers_watched(procs):
                status = train_session(client, opts, header, out)
        finally:
            codes = stop_processes(procs)
            client.close()
        if any_failed(procs):
            print(f"error: producers exited with {codes}", file=sys.stderr, flush=True)
            if status == EXIT_OK:
                status = EXIT_FAILED
    return status


def train(opts: UpOptions, out: TextIO = sys.stdout) -> int:
    """Only the trainer loop, against a Redis where producers run (as in compose)."""
    assert opts.redis_url, "train needs a Redis URL"
    try:
        with interrupt_signals():
            client = sync_client(opts.redis_url, socket_timeout=30, socket_connect_timeout=5)
            try:
                return train_session(client, opts, f"rollstream train: run {opts.run!r}, "
                                     f"{_mode(opts.config)}, producers elsewhere", out)
            finally:
                client.close()
    except KeyboardInterrupt:
        print("interrupted", file=out, flush=True)
        return EXIT_INTERRUPTED


TRAINER_STOP_S = 30.0  # after Ctrl+C, the trainer script's time to clean up before SIGTERM


def up_trainer(script: Sequence[str], redis_url: str | None, run: str, producers: int,
               log_level: str, config_path: str | None = None,
               out: TextIO = sys.stdout, metrics_port: int | None = None,
               metrics_addr: str = "0.0.0.0") -> int:
    """`rollstream up --trainer SCRIPT`: Redis (embedded unless a URL is given), producers, and
    the user's script in place of the stand-in trainer. The script gets ROLLSTREAM_REDIS_URL,
    ROLLSTREAM_RUN (and ROLLSTREAM_CONFIG with `--config`) in its environment, its folder is
    on the producers' PYTHONPATH, and its exit status is returned (128 + N for signal N).
    With `metrics_port` P the producers serve /metrics on P+1 .. and the script finds P in
    ROLLSTREAM_METRICS_PORT (for `batcher.serve_metrics`)."""
    ports = producer_ports(metrics_port, producers)
    if metrics_port is not None:
        check_ports(metrics_addr, [metrics_port, *ports])
    try:
        with interrupt_signals():
            return _up_trainer(script, redis_url, run, producers, log_level, config_path, out,
                               (metrics_port, metrics_addr, ports))
    except KeyboardInterrupt:  # a second Ctrl+C, or one before the script started
        print("interrupted", file=out, flush=True)
        return EXIT_INTERRUPTED


def _up_trainer(script: Sequence[str], redis_url: str | None, run: str, producers: int,
                log_level: str, config_path: str | None, out: TextIO,
                metrics: tuple[int | None, str, list[int]]) -> int:
    folder = os.path.dirname(os.path.abspath(script[0]))
    metrics_port, metrics_addr, ports = metrics
    with redis_server(redis_url) as url:
        procs = start_producers(url, run, producers, log_level, pythonpath=[folder],
                                metrics_ports=ports, metrics_addr=metrics_addr)
        trainer: subprocess.Popen | None = None
        try:
            env = child_env(url, run, [folder])
            if config_path:
                env["ROLLSTREAM_CONFIG"] = os.path.abspath(config_path)
            if metrics_port is not None:
                env["ROLLSTREAM_METRICS_PORT"] = str(metrics_port)
            print(f"rollstream up: run {run!r}, {producers} producer(s), trainer "
                  f"{' '.join(script)}", file=out, flush=True)
            if metrics_port is not None:
                print(metrics_line(metrics_addr, None, ports) + f" (the trainer's: "
                      f"ROLLSTREAM_METRICS_PORT={metrics_port})", file=out, flush=True)
            trainer = spawn([sys.executable, *script], env=env)
            return _wait_trainer(trainer, procs)
        finally:
            if trainer is not None:
                stop_processes([trainer], what="trainer")
            stop_processes(procs)


def _wait_trainer(trainer: subprocess.Popen, procs: Sequence[subprocess.Popen]) -> int:
    """The trainer's exit status; Ctrl+C is passed on to it once (it runs in its own session,
    so only we get the terminal's signal) and it gets `TRAINER_STOP_S` to clean up. Once
    every producer has exited the run cannot go on: the trainer is stopped the same way
    and `ProducersExited` raised."""
    gone = interrupted = False
    try:
        while trainer.poll() is None:
            # all exited cleanly is a stop (the script's own `stop_run`, or an operator's):
            # the script ends itself then
            if all_exited(procs) and any_failed(procs):
                gone = True
                break
            try:
                trainer.wait(PRODUCER_WATCH_S)
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        interrupted = True
        _stop_trainer(trainer, "Ctrl+C")
    if gone:
        _stop_trainer(trainer, "every producer exited")
        raise producers_gone(procs)
    code = trainer.poll()
    if code is None:
        stop_processes([trainer], what="trainer")
        code = trainer.returncode
    if interrupted:
        return EXIT_INTERRUPTED  # however the trainer took it (a SIGKILL after ignoring all)
    return 128 - code if code < 0 else code


def _stop_trainer(trainer: subprocess.Popen, why: str) -> None:
    """SIGINT, then `TRAINER_STOP_S` for the script to clean up (SIGTERM after, by the
    caller's `stop_processes`)."""
    trainer.send_signal(signal.SIGINT)
    try:
        trainer.wait(TRAINER_STOP_S)
    except subprocess.TimeoutExpired:
        logger.warning("trainer pid %d still running %.0fs after %s; stopping it",
                       trainer.pid, TRAINER_STOP_S, why)
