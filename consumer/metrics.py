"""The Batcher's counters and its `/metrics` page.

Counted per batch (delivered trajectories by tag, batch wait, commit-to-delivery latency with
one numpy call for the whole batch) and per drop, in plain numbers; turned into Prometheus
families only when scraped. What lives in Redis (stream backlog and pending entries, the
pause reasons, live producers) is read at scrape time, one pipeline, on the scraping thread.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import redis as redis_lib

from schemas.keys import CONSUMER_GROUP
from schemas.liveness import live_producers
from schemas.stats import (
    LATENCY_BUCKETS_S,
    WAIT_BUCKETS_S,
    BatcherRecord,
    Family,
    Histogram,
    counter,
    gauge,
    histogram,
)

if TYPE_CHECKING:
    from consumer.batcher import Batcher

logger = logging.getLogger(__name__)

# Batcher counter name -> the `reason` label of rollstream_trajectories_dropped_total
DROP_REASONS = {
    "scheduler/stale_dropped": "stale",
    "scheduler/late_dropped": "late",
    "scheduler/val_discarded": "val_discarded",
    "scheduler/dead_lettered": "dead",
}
FAILED_GROUPS = "scheduler/failed_groups"


class BatcherStats:
    """Counters of one Batcher, per mode."""

    def __init__(self) -> None:
        self.delivered: dict[tuple[str, str], int] = defaultdict(int)  # (mode, tag)
        self.counts: dict[tuple[str, str], float] = defaultdict(float)  # (mode, counter name)
        self.wait: dict[str, Histogram] = defaultdict(lambda: Histogram(WAIT_BUCKETS_S))
        self.latency: dict[str, Histogram] = defaultdict(lambda: Histogram(LATENCY_BUCKETS_S))
        self.waiting: dict[str, bool] = {}  # mode -> inside get_batch now
        self.batches = 0
        self.trajectories = 0

    def on_batch(self, mode: str, trajs: list[dict[str, Any]], wait_s: float) -> None:
        """A batch was handed out: count it by tag, its wait, and each trajectory's time from
        commit (`finished_at`, the producer's clock) to now."""
        now = time.time()
        delivered = self.delivered
        for tag, count in Counter(map(itemgetter("tag"), trajs)).items():
            delivered[(mode, tag)] += count
        finished = np.array([traj.get("finished_at", now) for traj in trajs], dtype=np.float64)
        self.wait[mode].observe(wait_s)
        self.latency[mode].observe_many(np.maximum(0.0, now - finished))
        self.batches += 1
        self.trajectories += len(trajs)

    def count(self, mode: str, name: str, amount: float) -> None:
        self.counts[(mode, name)] += amount


def batcher_record(batcher: Batcher, mode: str, state: str, waited_s: float, wanted: int,
                   complete: int, partial: int, ttl_s: float) -> BatcherRecord:
    stats = batcher.stats
    return BatcherRecord(
        consumer=batcher.consumer, mode=mode, state=state, updated_at=time.time(), ttl_s=ttl_s,
        waited_s=waited_s, wanted=wanted, complete=complete, partial=partial,
        version=batcher.version, batches=stats.batches, delivered=stats.trajectories,
        totals=dict(batcher.totals),
    )


def batcher_families(batcher: Batcher) -> Iterator[Family]:
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
    yield histogram("rollstream_batch_wait_seconds", "Time get_batch took, per batch",
                    ["mode"], [((m,), h) for m, h in list(stats.wait.items())])
    yield histogram("rollstream_commit_to_delivery_seconds",
                    "Time from a trajectory's commit to its hand-out (producer and trainer "
                    "clocks)", ["mode"], [((m,), h) for m, h in list(stats.latency.items())])
    yield gauge("rollstream_version", "Policy version published by the trainer", [],
                [((), batcher.version)])
    yield gauge("rollstream_batcher_waiting", "1 while get_batch is waiting", ["mode"],
                [((m,), 1 if w else 0) for m, w in list(stats.waiting.items())])
    yield gauge("rollstream_groups_held",
                "Groups the batcher holds in memory, complete or partial", ["mode", "state"],
                _groups_held(batcher))
    yield from _redis_families(batcher)


def _groups_held(batcher: Batcher) -> list[tuple[tuple[str, str], float]]:
    out: list[tuple[tuple[str, str], float]] = []
    for mode, state in list(batcher._states.items()):
        slots = list(state.groups.values())
        complete = sum(1 for slot in slots if len(slot.members) >= state.group_size)
        out += [((mode, "complete"), complete), ((mode, "partial"), len(slots) - complete)]
    return out


def _redis_families(batcher: Batcher) -> Iterator[Family]:
    """Backlog and pending entries of the batcher's streams, the pause, live producers."""
    keys = batcher.keys
    modes = list(batcher._states.items())
    try:
        pipe = batcher.redis.pipeline(transaction=False)
        for _, state in modes:
            for stream in state.streams:
                pipe.xlen(stream)
                pipe.xpending(stream, CONSUMER_GROUP)
        pipe.smembers(keys.pause)
        pipe.xlen(keys.dead)
        replies = pipe.execute(raise_on_error=False)
        live = len(live_producers(batcher.redis, keys))
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
