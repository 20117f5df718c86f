"""One `get_batch` call: read until enough groups are complete, then hand them out.

The wait takes the batcher's name first, lifts the sync pause (train) or starts a val round,
and puts back what Redis lost; after a restart it reads its own pending entries and claims a
dead batcher's. Then it reads (finite BLOCK) until the groups wanted are complete, or until
nothing more can come before the version moves (a short batch, or `StepExhausted`), claiming
from dead batchers as they are found, and hands the batch out. A lost connection, lost
consumer groups or a stream that left its node are read again until the timeout; a stopped
run raises `RunStopped`. The state record says what it waits for while it waits.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis as redis_lib

from consumer.assembly import LOOK_EVERY_S, Assembly
from consumer.batch import Batch
from consumer.filters import FILTERED
from consumer.handout import HandOut
from consumer.liveness import Claims, Heartbeat
from consumer.metrics import StateRecord
from consumer.publishing import Publisher
from consumer.state import BatcherState, ModeState
from schemas.backoff import Backoff
from schemas.errors import BatchTimeout, RunStopped, StepExhausted
from schemas.keys import Keys
from schemas.liveness import live_producers
from schemas.redisconn import REDIS_ERRORS, OwnerWatch, is_transient

logger = logging.getLogger(__name__)


class BatchWait:
    """The `get_batch` of one batcher, over its parts."""

    def __init__(self, redis: Any, keys: Keys, shared: BatcherState, *, block_ms: int,
                 owner: OwnerWatch, alive: Heartbeat, claims: Claims, assembly: Assembly,
                 hand_out: HandOut, publisher: Publisher, record: StateRecord):
        self.redis = redis
        self.keys = keys
        self._shared = shared
        self.block_ms = block_ms
        self.owner = owner
        self._alive = alive
        self._claims = claims
        self._assembly = assembly
        self._hand_out = hand_out
        self._publisher = publisher
        self._record = record
        self._filtered_before = 0.0

    def get_batch(self, state: ModeState, n: int, wanted: int, timeout_s: float) -> Batch:
        """`Batcher.get_batch` once its arguments are checked: `wanted` groups (`n`
        trajectories) of `state`'s mode, within `timeout_s`."""
        started = time.monotonic()
        state.round_started = False
        self._filtered_before = state.counters.get(FILTERED, 0)  # for a short batch's warning
        self._record.soon()  # write the waiting record at once
        stats = self._shared.stats
        stats.waiting[state.mode] = True
        try:
            batch = self._get_batch_retrying(state, n, wanted, started, timeout_s)
        except BatchTimeout:
            self._record.done(state, "timed_out", time.monotonic() - started)
            raise
        finally:
            stats.waiting[state.mode] = False
        self._record.done(state, "handed", batch.metrics["time/get_batch_cost"])
        return batch

    def _get_batch_retrying(self, state: ModeState, n: int, wanted: int, started: float,
                            timeout_s: float) -> Batch:
        """`_get_batch`, again after a lost connection or lost consumer groups."""
        mode = state.mode
        deadline = started + timeout_s
        backoff = Backoff(name=f"batcher {self._shared.consumer}")
        while True:
            try:
                batch = self._get_batch(state, n, wanted, started, deadline, timeout_s)
                self.owner.note(self.redis)  # a redirect followed quietly: one line
                return batch
            except REDIS_ERRORS as exc:
                if isinstance(exc, redis_lib.ResponseError) and "NOGROUP" in str(exc):
                    logger.warning("consumer groups missing (Redis lost its data?); recreating")
                    self._publisher.create_groups()
                    continue
                if isinstance(exc, redis_lib.ResponseError) and str(exc).startswith("UNBLOCKED"):
                    # Redis 7 ends a blocked read whose stream left the node: its slot moved
                    # to another node of a cluster (the next read follows MOVED) or the key
                    # was deleted (NOGROUP next). Nothing was delivered: read again.
                    logger.info("a stream the batcher waited on left the node (%s); reading "
                                "again", exc)
                    continue
                if not is_transient(exc):
                    raise
                state.recovered = False  # a read may have been delivered and lost: re-read
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BatchTimeout(f"get_batch(mode={mode!r}) timed out after "
                                       f"{timeout_s:g}s: Redis unreachable: {exc}") from None
                backoff.sleep_sync(f"read failed: {exc}", max_s=remaining)
                self.owner.note(self.redis)

    def _get_batch(self, state: ModeState, n: int, wanted: int, started: float,
                   deadline: float, timeout_s: float) -> Batch:
        assembly = self._assembly
        self._alive.start()  # the name first: a namesake refused lifts no pause of the other's
        if state.mode == "train":
            self._publisher.resume_sync()
        elif not state.round_started:
            self._publisher.start_val_round(state)
            assembly.forget_rounds(state)
        self._publisher.sync_version()
        with _gc_paused():
            if not state.recovered:
                self._recover(state)
            assembly.evict_expired(state)
            if state.ready_count >= wanted or deadline <= started:
                # enough held already, but an older group may have completed in Redis since:
                # one read that does not block, so oldest-first holds across what is unread
                # (also the one look of a get_batch that may not wait)
                assembly.read(state, block_ms=None)
            deliverable = assembly.deliverable(state, wanted)
            stop_looked_at = 0.0
            exhausted = False  # nothing more can reach this batcher before the version moves
            while True:
                if state.ready_count >= deliverable and not assembly.awaits_publish(deliverable):
                    if not assembly.judge(state, deliverable):
                        break  # the groups at the front are kept: hand them out
                    # filtered groups left the step: others take their place, if any can come
                    deliverable = assembly.deliverable(state, wanted)
                    if exhausted:
                        deliverable = min(deliverable, state.ready_count)
                    continue
                self._record.waiting(state, wanted, started)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BatchTimeout(self._timeout_message(state, n, wanted, timeout_s))
                if time.monotonic() - stop_looked_at >= LOOK_EVERY_S:
                    stop_looked_at = time.monotonic()
                    self._check_stopped(state)
                if assembly.nothing_more(state):
                    exhausted = True
                    deliverable = state.ready_count
                    if not assembly.awaits_publish(deliverable):
                        continue
                if assembly.awaits_publish(deliverable) and assembly.version_moved(state):
                    deliverable = assembly.deliverable(state, wanted)
                    exhausted = False
                    continue
                # (min before int: timeout_s may be float("inf"), wait as long as it takes)
                assembly.read(state, block_ms=max(1, int(min(self.block_ms, remaining * 1000))))
                exhausted = False
                if self._claims.due():
                    self._reclaim(state)
                deliverable = assembly.deliverable(state, wanted)
            if deliverable < wanted:
                self._hand_out_short(state, wanted, deliverable)
            return self._hand_out.hand_out(state, deliverable, time.monotonic() - started,
                                           deadline)

    def _check_stopped(self, state: ModeState) -> None:
        """`RunStopped` when an operator stopped the run (`rollstream stop`): its producers
        exit, so a wait could only time out."""
        if self.redis.exists(self.keys.stop):
            raise RunStopped(f"run {self.keys.run!r} was stopped (rollstream stop) while "
                             f"get_batch(mode={state.mode!r}) waited; a trainer started "
                             "again resumes it")

    def _recover(self, state: ModeState) -> None:
        """After a restart: this consumer's pending entries, then a dead consumer's."""
        self._alive.start()
        inflight = self._hand_out.recorded(state.mode)
        self._assembly.read_pending(state, inflight)
        self._reclaim(state)
        state.recovered = True

    def _reclaim(self, state: ModeState) -> None:
        """Claim what dead batchers left pending (`Claims`), placed as it comes."""
        for stream, messages in self._claims.claim(state):
            self._assembly.assemble(state, stream, messages, set())

    def _hand_out_short(self, state: ModeState, wanted: int, deliverable: int) -> None:
        failed = int(self._shared.totals["scheduler/failed_groups"])
        why = self._filtered_note(state, wanted)
        if state.mode == "val":
            if deliverable <= 0:
                raise StepExhausted(
                    f"get_batch(mode='val') val round {state.round}: every group of the round "
                    f"was dropped ({why}a member failed; scheduler/failed_groups {failed} "
                    "since this batcher started): the producers' log says why")
            logger.warning("val round %d: handing out %d of %d groups; the others were dropped "
                           "(%sa member failed; the producers' log says why)", state.round,
                           deliverable, wanted, why)
            return
        if deliverable <= 0:
            raise StepExhausted(
                f"get_batch(mode='train') at version {self._shared.version}: no group can "
                f"complete any more before the version moves (every episode admitted was "
                f"committed, and each group was handed out or dropped: {why}"
                f"scheduler/failed_groups {failed}); publish_version to go on")
        logger.warning("version %d: handing out %d of %d groups; no other group can complete "
                       "before the version moves (%sdropped: a member failed; or handed out "
                       "already)", self._shared.version, deliverable, wanted, why)

    def _filtered_note(self, state: ModeState, wanted: int) -> str:
        """A short batch's word on the groups the group filters dropped while it waited, and
        when a step has no group to spare, how to give it some."""
        filtered = int(state.counters.get(FILTERED, 0) - self._filtered_before)
        if filtered <= 0:
            return ""
        note = f"{filtered} filtered by the group filters"
        if state.mode == "train" and state.schedule.episodes_per_step * len(state.streams) \
                <= wanted:
            note += (" and a batch takes every group of a step: over-sample, num_env_groups * "
                     "group_size above rollout_batch_size, to fill from others")
        return note + "; "

    def _timeout_message(self, state: ModeState, n: int, wanted: int, timeout_s: float) -> str:
        ready = state.ready_count
        partial = len(state.groups) - ready
        producers = len(live_producers(self.redis, self.keys))
        if state.mode == "val":  # the pause holds train rollouts only
            where = f"val round {state.round}"
        else:
            paused = sorted(p.decode() if isinstance(p, bytes) else str(p)
                            for p in self.redis.smembers(self.keys.pause))
            where = f"version {self._shared.version}; pause reasons: {paused or 'none'}"
        failed = int(self._shared.totals["scheduler/failed_groups"])
        return (
            f"get_batch(mode={state.mode!r}) timed out after {timeout_s:g}s waiting for {n} "
            f"trajectories ({wanted} complete groups of {state.group_size}); have {ready} "
            f"complete and {partial} partial groups at {where}; groups dropped for a failed "
            f"member since this batcher started: {failed}; live producers: {producers}"
        )


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding makes many small dicts and the batcher holds thousands of trajectories, so
    the cyclic GC would rescan them over and over (measured: ~40% of the batcher's CPU).
    Messages have no reference cycles; collection resumes when the batch is handed out.

    What was allocated meanwhile is moved to the oldest generation unscanned (`freeze`, then
    `unfreeze`, which moves the frozen objects there): otherwise the first young collection
    after `enable` scans all of it (milliseconds on every hand-off). Cycles among them are
    still found by the next full collection. Skipped in a process that froze objects itself
    (its frozen set must stay frozen)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
