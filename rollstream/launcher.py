"""`rollstream up`: Redis (embedded unless a URL is given), producer processes, a trainer loop.

The trainer loop is a stand-in for a real trainer: get a batch, "train" for `train_step_s`,
ack, publish the next version, print one line. Ctrl+C or SIGTERM stops the run, its producer
processes and the embedded server; producers also die with this process (PDEATHSIG).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from consumer import Batch, Batcher
from rollstream.embedded import EmbeddedRedis, spawn
from schemas.config import RolloutConfig
from schemas.redisconn import SyncClient, mask_url, sync_client

logger = logging.getLogger(__name__)


@dataclass
class UpOptions:
    config: RolloutConfig
    redis_url: str | None
    run: str
    producers: int | None = None
    steps: int | None = None
    seconds: float | None = None
    train_step_s: float = 0.0
    timeout_s: float = 120.0
    val_every: int = 0
    log_level: str = "WARNING"


def default_producers(config: RolloutConfig) -> int:
    """Enough producers for the shards, at most one per core."""
    shards = sum(config.manager(m).num_shards for m in config.modes())
    return max(1, min(shards, os.cpu_count() or 1))


def start_producers(url: str, run: str, count: int, log_level: str,
                    pythonpath: Sequence[str] = ()) -> list[subprocess.Popen]:
    """Producer processes in their own session (a terminal's Ctrl+C reaches only us).

    The Redis URL and run name travel in their environment, never on argv (`ps` shows argv;
    a URL can hold a password); `pythonpath` folders come first on their PYTHONPATH (a
    policy's module)."""
    cmd = [sys.executable, "-m", "rollstream", "--log-level", log_level, "produce"]
    env = child_env(url, run, pythonpath)
    return [spawn(cmd, env=env) for _ in range(count)]


def child_env(url: str, run: str, pythonpath: Sequence[str] = ()) -> dict[str, str]:
    """This environment plus the run's URL and name, and `pythonpath` first on PYTHONPATH."""
    env = {**os.environ, "ROLLSTREAM_REDIS_URL": url, "ROLLSTREAM_RUN": run}
    paths = [*pythonpath, *filter(None, [env.get("PYTHONPATH")])]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 15.0) -> list[int]:
    """SIGTERM each, wait, then SIGKILL what is left. Returns the exit codes."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("producer pid %d ignored SIGTERM; killing it", proc.pid)
            proc.kill()
            proc.wait()
    return [proc.returncode for proc in procs]


def format_step(label: str, batch: Batch) -> str:
    m = batch.metrics
    tags = " ".join(f"{name.split('/')[1]}={value:.2f}" for name, value in sorted(m.items())
                    if name.startswith("env/") and name.endswith("/success"))
    return (f"{label:<9} v{batch.version:<4} wait {m['time/get_batch_cost']:6.2f}s  "
            f"trajs {len(batch):>5}  success {tags}  "
            f"stale_dropped {int(m.get('scheduler/stale_dropped', 0))}  "
            f"staleness_max {int(m.get('scheduler/staleness/max', 0))}")


def trainer_loop(batcher: Batcher, opts: UpOptions, out: TextIO) -> int:
    """Run train steps until `steps` or `seconds` is reached; returns the steps done."""
    started = time.monotonic()
    step = 0
    while opts.steps is None or step < opts.steps:
        if opts.seconds is not None and time.monotonic() - started >= opts.seconds:
            break
        batch = batcher.get_batch("train", timeout_s=opts.timeout_s)
        if opts.train_step_s > 0:
            time.sleep(opts.train_step_s)  # stand-in for the policy update
        batcher.ack(batch)
        batcher.publish_version()
        print(format_step(f"step {step}", batch), file=out, flush=True)
        step += 1
        if opts.val_every and step % opts.val_every == 0:
            val = batcher.get_batch("val", timeout_s=opts.timeout_s)
            print(format_step("  val", val), file=out, flush=True)
    return step


@contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


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


EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def train_session(client: SyncClient, opts: UpOptions, header: str, out: TextIO) -> int:
    """Publish the config and run the trainer loop; returns the exit status.

    The run's producers keep running when this ends, for whatever reason: only a deliberate
    `rollstream stop` ends a run, so a trainer that crashes or times out can simply start
    again and find its producers waiting."""
    batcher = Batcher(client, opts.config, run=opts.run)
    try:
        print(header, file=out, flush=True)
        steps = trainer_loop(batcher, opts, out)
        print(f"done: {steps} steps", file=out, flush=True)
        return EXIT_OK
    except KeyboardInterrupt:
        print("interrupted; stopping", file=out, flush=True)
        return EXIT_INTERRUPTED


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
    with redis_server(opts.redis_url) as url:
        client = sync_client(url, socket_timeout=30, socket_connect_timeout=5)
        procs = start_producers(url, opts.run, count, opts.log_level)  # they await the config
        try:
            header = (f"rollstream up: run {opts.run!r} at {mask_url(url)}, {count} producer(s), "
                      f"{_mode(opts.config)}")
            status = train_session(client, opts, header, out)
        finally:
            codes = stop_processes(procs)
            client.close()
        bad = [c for c in codes if c not in (0, -signal.SIGTERM)]
        if bad:
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
               out: TextIO = sys.stdout) -> int:
    """`rollstream up --trainer SCRIPT`: Redis (embedded unless a URL is given), producers, and
    the user's script in place of the stand-in trainer. The script gets ROLLSTREAM_REDIS_URL,
    ROLLSTREAM_RUN (and ROLLSTREAM_CONFIG with `--config`) in its environment, its folder is
    on the producers' PYTHONPATH, and its exit status is returned (128 + N for signal N)."""
    try:
        with interrupt_signals():
            return _up_trainer(script, redis_url, run, producers, log_level, config_path, out)
    except KeyboardInterrupt:  # a second Ctrl+C, or one before the script started
        print("interrupted", file=out, flush=True)
        return EXIT_INTERRUPTED


def _up_trainer(script: Sequence[str], redis_url: str | None, run: str, producers: int,
                log_level: str, config_path: str | None, out: TextIO) -> int:
    folder = os.path.dirname(os.path.abspath(script[0]))
    with redis_server(redis_url) as url:
        procs = start_producers(url, run, producers, log_level, pythonpath=[folder])
        trainer: subprocess.Popen | None = None
        try:
            env = child_env(url, run, [folder])
            if config_path:
                env["ROLLSTREAM_CONFIG"] = os.path.abspath(config_path)
            print(f"rollstream up: run {run!r}, {producers} producer(s), trainer "
                  f"{' '.join(script)}", file=out, flush=True)
            trainer = spawn([sys.executable, *script], env=env)
            return _wait_trainer(trainer)
        finally:
            if trainer is not None:
                stop_processes([trainer])
            stop_processes(procs)


def _wait_trainer(trainer: subprocess.Popen) -> int:
    """The trainer's exit status; Ctrl+C is passed on to it once (it runs in its own session,
    so only we get the terminal's signal) and it gets `TRAINER_STOP_S` to clean up."""
    try:
        trainer.wait()
    except KeyboardInterrupt:
        trainer.send_signal(signal.SIGINT)
        try:
            trainer.wait(TRAINER_STOP_S)
        except subprocess.TimeoutExpired:
            logger.warning("trainer pid %d still running %.0fs after Ctrl+C; stopping it",
                           trainer.pid, TRAINER_STOP_S)
    code = trainer.poll()
    if code is None:
        stop_processes([trainer])
        code = trainer.returncode
    return 128 - code if code < 0 else code
