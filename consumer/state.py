"""What a Batcher holds in memory, shared by its parts.

Per mode, a `ModeState`: the `GroupSlot`s being filled, the heap of complete ones, what was
handed out and not acked. For the whole Batcher, a `BatcherState`: the version it knows, its
modes, and its counters (`BatcherStats` for `/metrics`, `totals` since it started). Assembly
and hand-out change them; the `/metrics` page and the state record only read them.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from consumer.batch import Entry
from schemas.config import RolloutConfig
from schemas.keys import Keys
from schemas.protocol import Schedule
from schemas.stats import LATENCY_BUCKETS_S, WAIT_BUCKETS_S, Histogram

# version lags of handed-out trajectories (rollstream_trajectory_staleness_versions): the
# bucket `le=k` counts lags <= k; lags are whole numbers, so 0, 1, 2, 3 are exact counts
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32)
SYNC_PAUSE_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

GroupKey = tuple[int, int, int]  # (val round, episode k, group id)


# the counters of generated tokens the batcher dropped: `tokens_discarded/{reason}`, reason
# stale (an expired or too-stale trajectory: a sync hand-out's unfinished episodes land here),
# late, val_discarded, failed_group, filtered
TOKENS_DISCARDED = "tokens_discarded/"


@dataclass
class GroupSlot:
    """The members of one (round, episode, group) seen so far."""

    key: GroupKey
    seq: int
    members: dict[int, tuple[Entry, dict[str, Any]]] = field(default_factory=dict)
    failed: list[Entry] = field(default_factory=list)
    priority: bool = False  # part of a batch handed out before a restart: deliver first
    ready: bool = False  # complete, in its mode's ready heap
    judged: bool = False  # kept by the group filters (judged once, at the queue's front)
    oldest_start: int = 2**62  # the oldest `version_start` among its members

    def entries(self) -> list[Entry]:
        return [entry for entry, _ in self.members.values()] + self.failed

    def messages(self) -> list[dict[str, Any]]:
        """The trajectories of its members that finished (failed ones carry no steps)."""
        return [msg for _, msg in self.members.values()]


@dataclass
class ModeState:
    """Everything the batcher holds for one mode."""

    mode: str
    schedule: Schedule
    streams: list[str]
    group_size: int
    members: int
    groups: dict[GroupKey, GroupSlot] = field(default_factory=dict)
    ready: list[tuple[int, int, int, GroupKey]] = field(default_factory=list)
    ready_count: int = 0  # groups in `ready` still held (the heap keeps evicted ones lazily)
    finished: dict[int, set[tuple[int, int]]] = field(default_factory=lambda: defaultdict(set))
    counters: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    recovered: bool = False
    rotate: int = 0
    round: int = 0
    round_started: bool = False  # this get_batch("val") call has started its round
    seq: int = 0
    held: set[Entry] = field(default_factory=set)  # entries sorted into groups in memory
    handed: set[Entry] = field(default_factory=set)  # entries handed out, not yet acked
    env_ids: list[int] = field(default_factory=list)  # the envs of the groups read here
    looked_at: float = 0.0  # monotonic time of the last look at whether more can come

    def finish(self, slot: GroupSlot) -> None:
        """The group was handed out or dropped: it leaves the held groups (and the count of
        ready ones), and a later copy of its episode is late."""
        rnd, k, g = slot.key
        if self.groups.pop(slot.key, None) is not None and slot.ready:
            self.ready_count -= 1
        self.finished[g].add((rnd, k))
        self.held.difference_update(slot.entries())


def new_mode_state(config: RolloutConfig, keys: Keys, mode: str, index: int,
                   count: int) -> ModeState:
    """The empty state of `mode` for batcher `index` of `count` (groups `g % count == index`)."""
    manager = config.manager(mode)
    streams = [keys.stream(mode, g) for g in range(manager.num_env_groups)
               if g % count == index]
    schedule = config.schedule(mode)
    members = manager.members
    env_ids = [g * members + m for g in range(manager.num_env_groups)
               if g % count == index for m in range(members)]
    return ModeState(mode, schedule, streams, manager.group_size, members, env_ids=env_ids)


class BatcherStats:
    """Counters of one Batcher, per mode."""

    def __init__(self) -> None:
        self.delivered: dict[tuple[str, str], int] = defaultdict(int)  # (mode, tag)
        self.counts: dict[tuple[str, str], float] = defaultdict(float)  # (mode, counter name)
        self.wait: dict[str, Histogram] = defaultdict(lambda: Histogram(WAIT_BUCKETS_S))
        self.latency: dict[str, Histogram] = defaultdict(lambda: Histogram(LATENCY_BUCKETS_S))
        self.staleness: dict[str, Histogram] = defaultdict(
            lambda: Histogram(STALENESS_BUCKETS))
        self.sync_pause = Histogram(SYNC_PAUSE_BUCKETS_S)  # ModelServers.update, per update
        self.waiting: dict[str, bool] = {}  # mode -> inside get_batch now
        self.batches = 0
        self.trajectories = 0

    def on_batch(self, mode: str, trajs: list[dict[str, Any]], wait_s: float,
                 version: int | None = None) -> None:
        """A batch was handed out: count it by tag, its wait, each trajectory's time from
        commit (`finished_at`, the producer's clock) to now, and (given the version it is
        handed out at) each trajectory's version lag."""
        if version is not None:
            self.staleness[mode].observe_many(
                version - np.array([t["version_start"] for t in trajs], dtype=np.float64))
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


@dataclass
class BatcherState:
    """What one Batcher knows and counts: the policy version it last saw, its modes, and its
    counters. Its parts share this one object; `/metrics` and the state record read it."""

    consumer: str
    modes: dict[str, ModeState]
    version: int = 0
    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    stats: BatcherStats = field(default_factory=BatcherStats)

    def sync_paused(self, seconds: float) -> None:
        """`ModelServers.update` held the servers `seconds` (pause to resume/update done):
        on `/metrics`, and in every mode's next batch as `time/weight_sync_pause_s` (the
        updates since that mode's last batch, added up)."""
        self.stats.sync_pause.observe(seconds)
        for state in self.modes.values():
            state.counters["time/weight_sync_pause_s"] += seconds
            state.counters["time/weight_syncs"] += 1

    def count(self, state: ModeState, name: str, amount: float = 1) -> None:
        """A drop or a failed group: reported with the mode's next batch, in `totals` and on
        `/metrics`."""
        state.counters[name] += amount  # reported with the next batch
        self.totals[name] += amount  # since this Batcher started
        self.stats.count(state.mode, name, amount)
