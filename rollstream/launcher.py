"""`rollstream up`: Redis (embedded unless a URL is given), producer processes, a trainer loop.

The trainer loop is a stand-in for a real trainer: get a batch, "train" for `train_step_s`,
ack, publish the next version, print one line. Ctrl+C or SIGTERM stops the run, its producer
processes and the embedded server; producers also die with this process (PDEATHSIG).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TextIO

from consumer import Batch, Batcher
from rollstream.embedded import EmbeddedRedis, spawn
from schemas.config import RolloutConfig
from schemas.errors import (
    BatchTimeout,
    ConfigError,
    ProducersExited,
    RollstreamError,
    RunStopped,
    StepExhausted,
)
from schemas.redisconn import SyncClient, mask_url, sync_client
from schemas.repeats import Repeats

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
    metrics_port: int | None = None  # the trainer's /metrics; producers get the next ports
    metrics_addr: str = "0.0.0.0"
    plot: str | None = None  # write throughput, batch wait and success curves here at the end


def default_producers(config: RolloutConfig) -> int:
    """Enough producers for the shards, at most one per core."""
    shards = sum(config.manager(m).num_shards for m in config.modes())
    return max(1, min(shards, os.cpu_count() or 1))


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


def format_step(label: str, batch: Batch) -> str:
    m = batch.metrics
    tags = " ".join(f"{name.split('/')[1]}={value:.2f}" for name, value in sorted(m.items())
                    if name.startswith("env/") and name.endswith("/success"))
    return (f"{label:<9} v{batch.version:<4} wait {m['time/get_batch_cost']:6.2f}s  "
            f"trajs {len(batch):>5}  success {tags}  "
            f"stale_dropped {int(m.get('scheduler/stale_dropped', 0))}  "
            f"staleness_max {int(m.get('scheduler/staleness/max', 0))}")


@dataclass
class StepPoint:
    """One batch as the progress line and the plot see it."""

    step: int
    wait_s: float
    traj_per_s: float  # this batch over the time since the previous one
    success: dict[str, float]  # tag -> success rate


@dataclass
class Progress:
    """The trainer loop's output. Not a terminal (a pipe, a log, the tests): one plain line
    per step. A terminal: one live line redrawn in place (steps, batch wait, traj/s,
    success), with the header, val results and the end as lines of their own."""

    out: TextIO
    live: bool = False
    keep: bool = True  # keep every step's point (for the plot; off: nothing grows per step)
    train: list[StepPoint] = field(default_factory=list)
    val: list[StepPoint] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    delivered: int = 0
    _last: float = field(default_factory=time.monotonic)
    _drawn: bool = False

    @classmethod
    def to(cls, out: TextIO, keep: bool = True) -> Progress:
        isatty = getattr(out, "isatty", None)
        return cls(out, live=bool(isatty and isatty()), keep=keep)

    def note(self, line: str) -> None:
        """A line that stays (the header, a val result, the end)."""
        self._clear()
        print(line, file=self.out, flush=True)

    def batch(self, label: str, step: int, batch: Batch) -> None:
        now = time.monotonic()
        point = StepPoint(step, batch.metrics["time/get_batch_cost"],
                          len(batch) / max(1e-9, now - self._last), _success(batch))
        if batch.mode == "val":
            if self.keep:
                self.val.append(point)
            self.note(format_step(label, batch))
            return
        self._last = now
        if self.keep:
            self.train.append(point)
        self.delivered += len(batch)
        if not self.live:
            print(format_step(label, batch), file=self.out, flush=True)
            return
        rate = self.delivered / max(1e-9, now - self.started)
        tags = " ".join(f"{tag}={value:.2f}" for tag, value in point.success.items())
        line = (f"step {step} v{batch.version}  wait {point.wait_s:.2f}s  "
                f"{rate:,.0f} traj/s  success {tags}  stale_dropped "
                f"{int(batch.metrics.get('scheduler/stale_dropped', 0))}")
        width = shutil.get_terminal_size((100, 24)).columns
        self.out.write("\r\x1b[2K" + line[: max(10, width - 1)])
        self.out.flush()
        self._drawn = True

    def close(self) -> None:
        """End the live line where it stands (the last step stays on screen)."""
        if self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False

    def _clear(self) -> None:
        if self._drawn:
            self.out.write("\r\x1b[2K")
            self.out.flush()
            self._drawn = False


def _success(batch: Batch) -> dict[str, float]:
    return {name.split("/")[1]: value for name, value in sorted(batch.metrics.items())
            if name.startswith("env/") and name.endswith("/success")}


def write_plot(path: str, progress: Progress, title: str) -> None:
    """Throughput, batch wait and success per step, three panels, to a PNG."""
    from rollstream.plots import Panel, plot_panels

    steps = [p.step for p in progress.train]
    success: dict[str, tuple[list[float], list[float]]] = {}
    for label, points in (("", progress.train), ("val ", progress.val)):
        for p in points:
            for tag, value in p.success.items():
                xs, ys = success.setdefault(label + tag, ([], []))
                xs.append(p.step)
                ys.append(value)
    plot_panels(path, [
        Panel({"delivered": (steps, [p.traj_per_s for p in progress.train])},
              "throughput", "trajectories/s"),
        Panel({"train": (steps, [p.wait_s for p in progress.train]),
               **({"val": ([p.step for p in progress.val], [p.wait_s for p in progress.val])}
                  if progress.val else {})}, "batch wait", "seconds"),
        Panel(dict(success.items()), "success", "rate", (-0.05, 1.05)),
    ], title=title, xlabel="train step")


SKIP_AGAIN_S = 1.0  # the stand-in trainer's pause before skipping a second version in a row


class _StepWait:
    """The stand-in trainer's wait for one batch. A step with no group left to complete
    (`StepExhausted`) is skipped by publishing, as after a restart between ack and publish;
    the skipped versions count against the same `timeout_s`, so a run whose every group
    fails (an env that always raises, a model server refusing every request) ends as a
    timeout instead of publishing versions for ever."""

    def __init__(self, version: int, timeout_s: float):
        self.since = time.monotonic()
        self.timeout_s = timeout_s
        self.first_version = version
        self.skipped = 0

    def left(self) -> float:
        return max(0.0, self.timeout_s - (time.monotonic() - self.since))

    def exhausted(self, exc: StepExhausted) -> None:
        """Count a skipped version; raise `BatchTimeout` once the wait is over."""
        self.skipped += 1
        if self.skipped > 1:  # not a restart's one missed publish: skip at a calm pace
            time.sleep(min(SKIP_AGAIN_S, self.left()))
        if self.left() <= 0:
            raise self.timed_out(exc)

    def timed_out(self, exc: BatchTimeout) -> BatchTimeout:
        """The wait's end, saying which versions it skipped (if any) and why it ended."""
        if not self.skipped:
            return exc
        return BatchTimeout(
            f"no train batch in {self.timeout_s:g}s: {self.skipped} versions from "
            f"{self.first_version} on ended with no group left to complete (every one "
            f"failed or expired; the producers' logs say why). The last wait: {exc}")


def trainer_loop(batcher: Batcher, opts: UpOptions, progress: Progress) -> int:
    """Run train steps until `steps` or `seconds` is reached; returns the steps done. A batch
    still awaited when `seconds` runs out ends the loop then, not at its own timeout."""
    started = time.monotonic()
    deadline = None if opts.seconds is None else started + opts.seconds

    def wait_s(timeout_s: float) -> float:
        if deadline is None:
            return timeout_s
        return max(0.0, min(timeout_s, deadline - time.monotonic()))

    def over() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    step = 0
    waiting: _StepWait | None = None  # the wait for this step's batch, across skipped versions
    skips = Repeats(logger)  # every group failing: a skip a second, not a line each
    while opts.steps is None or step < opts.steps:
        if over():
            break
        waiting = waiting or _StepWait(batcher.version, opts.timeout_s)
        try:
            batch = batcher.get_batch("train", timeout_s=wait_s(waiting.left()))
        except StepExhausted as exc:  # e.g. restarted between an ack and its publish
            waiting.exhausted(exc)
            skips.warning(f"{exc}: publishing version {batcher.version + 1}")
            batcher.publish_version()
            continue
        except BatchTimeout as exc:
            if over():
                break
            raise waiting.timed_out(exc) from None
        waiting = None
        if opts.train_step_s > 0:
            time.sleep(opts.train_step_s)  # stand-in for the policy update
        batcher.ack(batch)
        batcher.publish_version()
        progress.batch(f"step {step}", step, batch)
        step += 1
        if opts.val_every and step % opts.val_every == 0 and not over():
            try:
                val = batcher.get_batch("val", timeout_s=wait_s(opts.timeout_s))
            except BatchTimeout:
                if over():
                    break
                raise
            progress.batch("  val", step - 1, val)
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
PRODUCER_WATCH_S = 0.5  # how often `up` looks whether any of its producers still runs


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

    active = threading.Event()
    active.set()

    def raise_gone(signum: int, frame: object) -> None:
        if active.is_set():  # not once the block below is done: the run ended anyway
            raise producers_gone(procs)

    def watch() -> None:
        while active.is_set() and not all_exited(procs):
            time.sleep(PRODUCER_WATCH_S)
        if active.is_set():
            _thread.interrupt_main(signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, raise_gone)
    watcher = threading.Thread(target=watch, name="producer-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        active.clear()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)


def train_session(client: SyncClient, opts: UpOptions, header: str, out: TextIO) -> int:
    """Publish the config and run the trainer loop; returns the exit status.

    The run's producers keep running when this ends, for whatever reason: only a deliberate
    `rollstream stop` ends a run, so a trainer that crashes or times out can simply start
    again and find its producers waiting."""
    batcher = Batcher(client, opts.config, run=opts.run)
    metrics = (None if opts.metrics_port is None
               else batcher.serve_metrics(opts.metrics_port, opts.metrics_addr))
    progress = Progress.to(out, keep=bool(opts.plot))  # the points only the plot reads
    try:
        progress.note(header)
        steps = trainer_loop(batcher, opts, progress)
        progress.close()
        progress.note(f"done: {steps} steps")
        return EXIT_OK
    except (RunStopped, ProducersExited) as exc:
        # an operator's `rollstream stop` ends the run: the producers exit 0, and whichever
        # is seen first (the batcher's look at the stop key, or every producer gone) is a
        # clean end, not a failure
        if isinstance(exc, ProducersExited) and not client.exists(batcher.keys.stop):
            raise
        progress.close()
        progress.note(f"run {opts.run!r} was stopped (rollstream stop); the trainer ends "
                      "(a trainer started again resumes it)")
        return EXIT_OK
    except KeyboardInterrupt:
        progress.close()
        progress.note("interrupted; stopping")
        return EXIT_INTERRUPTED
    finally:
        progress.close()
        batcher.close()  # its liveness key says closed: a trainer started next is no namesake
        if metrics is not None:
            metrics.close()
        if opts.plot and progress.train:
            _plot(opts.plot, progress, f"run {opts.run}", out)


def _plot(path: str, progress: Progress, title: str, out: TextIO) -> None:
    try:
        write_plot(path, progress, title)
    except (OSError, RollstreamError) as exc:  # never hides how the run itself ended
        print(f"error: could not write the plot {path}: {exc}", file=sys.stderr, flush=True)
        return
    print(f"plot: {path}", file=out, flush=True)


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
