"""What a Batcher shows: its `/metrics` page and its state record (`rollstream status`).

Both read a `BatcherState` (consumer/state.py), never the Batcher: counted per batch
(delivered trajectories by tag, batch wait, commit-to-delivery latency) and per drop, in
plain numbers, turned into Prometheus families only when scraped. What lives in Redis (stream
backlog and pending entries, the pause reasons, live producers) is read at scrape time, one
pipeline, on the scraping thread. The state record is the batcher's line in
`{RUN}:batchers`: waiting (for what, how long), handed, timed_out or closed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import redis as redis_lib

from consumer.filters import REASON_COUNTERS
from consumer.state import TOKENS_DISCARDED, BatcherState, ModeState
from schemas.keys import CONSUMER_GROUP, Keys
from schemas.liveness import live_producers
from schemas.stats import STATS_KEEP_S, BatcherRecord, Family, counter, gauge, histogram

logger = logging.getLogger(__name__)

STATE_EVERY_S = 1.0  # a waiting get_batch refreshes its state record this often

# Batcher counter name -> the `reason` label of rollstream_trajectories_dropped_total
DROP_REASONS = {
    "scheduler/stale_dropped": "stale",
    "scheduler/late_dropped": "late",
    "scheduler/val_discarded": "val_discarded",
    "scheduler/dead_lettered": "dead",
}
FAILED_GROUPS = "scheduler/failed_groups"
# group filter counter -> the `reason` label of rollstream_groups_filtered_total
FILTER_REASONS = {name: reason for reason, name in REASON_COUNTERS.items()}


def batcher_record(batcher: BatcherState, mode: str, state: str, waited_s: float, wanted: int,
                   complete: int, partial: int, ttl_s: float) -> BatcherRecord:
    stats = batcher.stats
    return BatcherRecord(
        consumer=batcher.consumer, mode=mode, state=state, updated_at=time.time(), ttl_s=ttl_s,
        waited_s=waited_s, wanted=wanted, complete=complete, partial=partial,
        version=batcher.version, batches=stats.batches, delivered=stats.trajectories,
        totals=dict(batcher.totals),
    )


class StateRecord:
    """Writes the batcher's state record: while `get_batch` waits (at most every
    `STATE_EVERY_S`), when it is over, and when the Batcher closes."""

    def __init__(self, batcher: BatcherState, redis: Any, keys: Keys, block_ms: int):
        self._batcher = batcher
        self._redis = redis
        self._keys = keys
        self._block_ms = block_ms
        self._written_at = 0.0  # monotonic time the record was last written while waiting

    def soon(self) -> None:
        """A get_batch starts: its first wait writes the record at once."""
        self._written_at = 0.0

    def waiting(self, state: ModeState, wanted: int, started: float) -> None:
        """While get_batch waits: what for and how long, at most every `STATE_EVERY_S`."""
        now = time.monotonic()
        if now - self._written_at < STATE_EVERY_S:
            return
        self._written_at = now
        ready = state.ready_count
        record = batcher_record(self._batcher, state.mode, "waiting", now - started, wanted,
                                ready, len(state.groups) - ready,
                                ttl_s=self._block_ms / 1000 + 10)
        self._write(record.encode())

    def done(self, state: ModeState, outcome: str, waited_s: float) -> None:
        """get_batch is over: `handed` out a batch or `timed_out` (best effort: this record
        must not change what get_batch returns or raises)."""
        ready = state.ready_count
        record = batcher_record(self._batcher, state.mode, outcome, waited_s, 0, ready,
                                len(state.groups) - ready, ttl_s=STATS_KEEP_S)
        try:
            self._write(record.encode())
        except redis_lib.RedisError as exc:
            logger.debug("could not write the batcher's state record: %s", exc)

    def closed(self) -> None:
        """The Batcher closed (best effort; status shows it closed)."""
        record = batcher_record(self._batcher, "train", "closed", 0.0, 0, 0, 0,
                                ttl_s=STATS_KEEP_S)
        try:
            self._write(record.encode())
        except redis_lib.RedisError as exc:
            logger.debug("could not write the batcher's closing record: %s", exc)

    def _write(self, data: bytes) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(self._keys.batchers, self._batcher.consumer, data)
        pipe.pexpire(self._keys.batchers, int(STATS_KEEP_S * 1000))
        pipe.execute()


def batcher_families(batcher: BatcherState, redis: Any, keys: Keys) -> Iterator[Family]:
    """Everything `/metrics` shows for a Batcher (called on the scraping thread)."""
    stats = batcher.stats
    counts = list(stats.counts.items())
    yield counter("rollstream_trajectories_delivered",
                  "Trajectories handed to the trainer in complete groups", ["mode", "tag"],
                  list(stats.delivered.items()))
    yield counter("rollstream_trajectories_dropped",
                  "Trajectories the batcher dropped, by reason (stale, late, val_discarded, "
                  "dead)", ["mode", "reason"],
                  [((mode, DROP_REASONS[name]), n) for (mode, name), n in counts
                   if name in DROP_REASONS])
    yield counter("rollstream_groups_failed",
                  "Groups dropped because a member failed (the env kept raising)", ["mode"],
                  [((mode,), n) for (mode, name), n in counts if name == FAILED_GROUPS])
    yield counter("rollstream_groups_filtered",
                  "Complete groups the group filters dropped, by filter (std_filter, "
                  "group_filter_cls)", ["mode", "reason"],
                  [((mode, FILTER_REASONS[name]), n) for (mode, name), n in counts
                   if name in FILTER_REASONS])
    yield counter("rollstream_batcher_tokens_discarded",
                  "Generated tokens of the trajectories the batcher dropped, by reason (stale, "
                  "late, val_discarded, failed_group, filtered)", ["mode", "reason"],
                  [((mode, name[len(TOKENS_DISCARDED):]), n) for (mode, name), n in counts
                   if name.startswith(TOKENS_DISCARDED)])
    yield histogram("rollstream_batch_wait_seconds", "Time get_batch took, per batch",
                    ["mode"], [((m,), h) for m, h in list(stats.wait.items())])
    yield histogram("rollstream_commit_to_delivery_seconds",
                    "Time from a trajectory's commit to its hand-out (producer and trainer "
                    "clocks)", ["mode"], [((m,), h) for m, h in list(stats.latency.items())])
    yield histogram("rollstream_trajectory_staleness_versions",
                    "Version lag of each handed-out trajectory (batch version - version_start)",
                    ["mode"], [((m,), h) for m, h in list(stats.staleness.items())])
    yield histogram("rollstream_weight_sync_pause_seconds",
                    "Time ModelServers.update held the model servers, pause to resume/update "
                    "done, per update", [], [((), stats.sync_pause)])
    yield gauge("rollstream_version", "Policy version published by the trainer", [],
                [((), batcher.version)])
    yield gauge("rollstream_batcher_waiting", "1 while get_batch is waiting", ["mode"],
                [((m,), 1 if w else 0) for m, w in list(stats.waiting.items())])
    yield gauge("rollstream_groups_held",
                "Groups the batcher holds in memory, complete or partial", ["mode", "state"],
                _groups_held(batcher))
    yield from _redis_families(batcher, redis, keys)


def _groups_held(batcher: BatcherState) -> list[tuple[tuple[str, str], float]]:
    out: list[tuple[tuple[str, str], float]] = []
    for mode, state in list(batcher.modes.items()):
        slots = list(state.groups.values())
        complete = sum(1 for slot in slots if len(slot.members) >= state.group_size)
        out += [((mode, "complete"), complete), ((mode, "partial"), len(slots) - complete)]
    return out


def _redis_families(batcher: BatcherState, redis: Any, keys: Keys) -> Iterator[Family]:
    """Backlog and pending entries of the batcher's streams, the pause, live producers."""
    modes = list(batcher.modes.items())
    try:
        pipe = redis.pipeline(transaction=False)
        for _, state in modes:
            for stream in state.streams:
                pipe.xlen(stream)
                pipe.xpending(stream, CONSUMER_GROUP)
        pipe.smembers(keys.pause)
        pipe.xlen(keys.dead)
        replies = pipe.execute(raise_on_error=False)
        live = len(live_producers(redis, keys))
    except redis_lib.RedisError as exc:
        logger.warning("metrics: cannot read the run's state from Redis: %s", exc)
        return
    backlog, pending = [], []
    at = 0
    for mode, state in modes:
        entries = waiting = 0
        for _ in state.streams:
            length, info = replies[at], replies[at + 1]
            at += 2
            if isinstance(length, int):
                entries += length
            if isinstance(info, dict):
                waiting += int(info.get("pending") or 0)
        backlog.append(((mode,), max(0, entries - waiting)))
        pending.append(((mode,), waiting))
    reasons, dead = replies[at], replies[at + 1]
    yield gauge("rollstream_stream_backlog",
                "Committed trajectories no batcher has read yet", ["mode"], backlog)
    yield gauge("rollstream_stream_pending",
                "Trajectories read by a batcher and not yet acked", ["mode"], pending)
    paused = sorted(r.decode() if isinstance(r, bytes) else str(r)
                    for r in (reasons if isinstance(reasons, set | list) else []))
    yield gauge("rollstream_paused", "1 while train rollouts are paused", [],
                [((), 1 if paused else 0)])
    yield gauge("rollstream_pause_reason", "1 for each reason the run is paused", ["reason"],
                [((r,), 1) for r in paused])
    yield gauge("rollstream_live_producers", "Producers with a fresh heartbeat", [],
                [((), live)])
    yield gauge("rollstream_dead_letters", "Entries in the dead-letter stream", [],
                [((), dead if isinstance(dead, int) else 0)])
