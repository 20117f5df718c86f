"""Hand-out: complete groups out to the trainer as a `Batch`, and back in with `ack`.

`get_batch` pops the oldest complete groups and, for a train batch, records it under
`{RUN}:inflight:{mode}:{consumer}` (a restarted Batcher hands out this very batch again) and
in sync mode pauses the producers once every batcher has its batch, in one script
(`HAND_OUT_LUA`); with `min_replicas` that write returns only once replicas hold it and the
batch's trajectories. A failed write hands nothing out: the groups stay ready. The entries
stay pending until `ack` acks and deletes them (a durable write); a val batch is acked at
once (a val round can be asked for again).
"""

from __future__ import annotations

import heapq
import logging
from typing import Any

from consumer.batch import Batch, Entry, batch_metrics
from consumer.filters import FILTERED
from consumer.liveness import Heartbeat
from consumer.publishing import Publisher
from consumer.state import BatcherState, GroupKey, GroupSlot, ModeState
from consumer.writes import Writer
from schemas.codec import pack, unpack
from schemas.config import RolloutConfig
from schemas.errors import BatchTimeout, NotReplicated
from schemas.keys import Keys
from schemas.redisconn import REDIS_ERRORS, ReplicaWait

logger = logging.getLogger(__name__)

# A train batch is handed out: record it (a restarted Batcher hands out this very batch
# again) and, in sync mode, pause the producers once every batcher has its batch, in one
# atomic step, so a lost connection can never leave a batch handed out without its pause.
HAND_OUT_LUA = """
-- KEYS: inflight, sync_handed, pause; ARGV: inflight record, sync (0/1), index, count
redis.call('SET', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  redis.call('SADD', KEYS[2], ARGV[3])
  if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[4]) then
    redis.call('SADD', KEYS[3], 'sync')
  end
end
return 1
"""


class HandOut:
    """Hands out and takes back the batches of batcher `index` of `count`."""

    def __init__(self, redis: Any, keys: Keys, config: RolloutConfig, shared: BatcherState, *,
                 index: int, count: int, alive: Heartbeat, writer: Writer,
                 publisher: Publisher, replicas: ReplicaWait):
        self.redis = redis
        self.keys = keys
        self.config = config
        self._shared = shared
        self.consumer = shared.consumer
        self.index, self.count = index, count
        self._alive = alive
        self._writer = writer
        self._publisher = publisher
        self._replicas = replicas
        self._record_hand_out = redis.register_script(HAND_OUT_LUA)

    def recorded(self, mode: str) -> set[Entry]:
        """The entries of the batch recorded as handed out and not acked (a restart's)."""
        raw = self.redis.get(self.keys.inflight(mode, self.consumer))
        return {Entry(s, i) for s, i in unpack(_bytes(raw))} if raw else set()

    def hand_out(self, state: ModeState, wanted: int, wait_s: float,
                 deadline: float | None = None) -> Batch:
        """The `wanted` oldest complete groups of `state` as a Batch, recorded first."""
        self._alive.guard()  # a batcher whose name another took hands out nothing
        chosen: list[tuple[tuple[int, int, int, GroupKey], GroupSlot]] = []
        while len(chosen) < wanted:
            item = heapq.heappop(state.ready)
            slot = state.groups.get(item[3])
            if slot is not None:
                chosen.append((item, slot))
        trajs: list[dict[str, Any]] = []
        entries: list[Entry] = []
        for _, slot in chosen:
            members = sorted(slot.members.items())
            trajs += [msg for _, (_, msg) in members]
            entries += [entry for _, (entry, _) in members]
        if state.mode == "train":
            record = pack([[e.stream, e.entry_id] for e in entries])
            try:
                self._write_hand_out(
                    [self.keys.inflight(state.mode, self.consumer), self.keys.sync_handed,
                     self.keys.pause],
                    [record, 1 if self.config.is_sync else 0, self.index, self.count],
                    deadline)
            except (REDIS_ERRORS + (NotReplicated,)) as exc:
                for item, _ in chosen:  # nothing handed out: the groups stay ready
                    heapq.heappush(state.ready, item)
                if isinstance(exc, NotReplicated):
                    raise self._unreplicated_hand_out(exc) from None
                raise
            if self.config.is_sync:
                self._publisher.notify(b"pause")
        late: list[Entry] = []
        for _, slot in chosen:
            late += slot.failed
            state.finish(slot)
        state.handed.update(entries)
        counters = dict(state.counters)
        state.counters.clear()
        metrics = batch_metrics(trajs, self._shared.version, counters, wait_s)
        self._shared.stats.on_batch(state.mode, trajs, wait_s, self._shared.version)
        for name in ("scheduler/stale_dropped", "scheduler/failed_groups", FILTERED,
                     "time/weight_sync_pause_s"):
            metrics.setdefault(name, 0.0)
        batch = Batch(state.mode, self._shared.version, trajs, entries, metrics, round=state.round)
        try:
            if late:
                self._writer.drop_entries(late)
            if state.mode == "val":
                self.ack(batch, state)  # a val round can be asked for again; nothing to redeliver
        except REDIS_ERRORS as exc:  # they stay pending; a restart cleans them up
            logger.warning("could not drop %d handed-out %s entries: %s", len(late), state.mode,
                           exc)
        return batch

    def _unreplicated_hand_out(self, exc: NotReplicated) -> BatchTimeout:
        """A batch that was ready but not on replicas in time: get_batch timed out waiting for
        them. The write that recorded it stands on the primary alone: its sync pause is lifted
        (best effort; the next get_batch lifts it anyway), as nothing was handed out."""
        try:
            self._publisher.resume_sync()
        except REDIS_ERRORS as error:
            logger.debug("could not lift the sync pause: %s", error)
        return BatchTimeout(f"get_batch(mode='train'): a batch is ready, but {exc} "
                            f"(min_replicas {self._replicas.replicas}: a batch is handed out "
                            "only once replicas hold it)")

    def _write_hand_out(self, keys: list[str], args: list[Any],
                        deadline: float | None = None) -> None:
        """Record a train hand-out (`HAND_OUT_LUA`). With `min_replicas` it is a durable write:
        its WAIT covers every write before it, the producers' XADDs of this batch among them,
        so a batch is handed out only once replicas hold its trajectories (a producer whose
        commit fell short resends it, and after a failover to a replica without it that resend
        is a new entry: a batch read from the primary alone could be delivered twice)."""
        if not self._replicas.enabled:
            self._record_hand_out(keys=keys, args=args)
            return
        self._writer.durable_write("hand-out of a train batch", lambda pipe: pipe.execute_command(
            "EVAL", HAND_OUT_LUA, len(keys), *keys, *args),  # the same write again is a no-op
            deadline=deadline)

    def ack(self, batch: Batch, state: ModeState) -> None:
        """`Batcher.ack` of a batch of this batcher's (`state`: its mode's)."""
        self._alive.guard()  # a batch another batcher took over is not this one's to ack

        def queue(pipe: Any) -> None:
            self._writer.queue_drop(pipe, batch.entries)
            pipe.delete(self.keys.inflight(batch.mode, self.consumer))

        self._writer.durable_write(f"ack of a {batch.mode} batch", queue)
        state.handed.difference_update(batch.entries)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
