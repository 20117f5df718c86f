"""The stand-in trainer of `rollstream up` and `rollstream train`: get a batch, "train" for
`train_step_s`, ack, publish the next version, print one line (`rollstream/progress.py`).

`train_session` publishes the config (its `Batcher`) and runs `trainer_loop`; it returns the
exit status. A step with nothing left to complete is skipped by publishing (`_StepWait`).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from consumer import Batcher
from rollstream.progress import Progress, write_plot
from schemas.config import RolloutConfig
from schemas.errors import (
    BatchTimeout,
    ProducersExited,
    RollstreamError,
    RunStopped,
    StepExhausted,
)
from schemas.redisconn import SyncClient
from schemas.repeats import Repeats

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass
class UpOptions:
    """What `up` and `train` run with: the stand-in trainer's settings, and the launcher's
    (`redis_url`, `producers`, `log_level`)."""

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
    record: str | None = None  # keep every batch in this folder as Parquet (consumer/store.py)


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
            f"failed, expired or was filtered by the group filters; the producers' logs say "
            f"why a group failed). The last wait: {exc}")


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


def train_session(client: SyncClient, opts: UpOptions, header: str, out: TextIO) -> int:
    """Publish the config and run the trainer loop; returns the exit status.

    The run's producers keep running when this ends, for whatever reason: only a deliberate
    `rollstream stop` ends a run, so a trainer that crashes or times out can simply start
    again and find its producers waiting."""
    batcher = Batcher(client, opts.config, run=opts.run, record=opts.record)
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
