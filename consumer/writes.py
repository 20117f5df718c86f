"""The batcher's writes that must land: ack-and-delete of stream entries, dead letters, and
the durable write.

Entries are acked and deleted (so the streams stay bounded) with one script call for many
streams (`DROP_LUA`: all of a run's keys share a slot). A durable write (an ack, a version
publish, a train hand-out with `min_replicas`) is retried with backoff through lost
connections and failovers for up to `write_timeout_s`, and with `min_replicas` returns only
once a WAIT on the same connection says the replicas have it (`NotReplicated` otherwise).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from consumer.batch import Entry
from schemas.backoff import Backoff
from schemas.errors import NotReplicated
from schemas.keys import CONSUMER_GROUP, Keys
from schemas.redisconn import REDIS_ERRORS, OwnerWatch, ReplicaWait, is_transient

logger = logging.getLogger(__name__)

# Ack and delete entries of several streams in one call (all of a run's keys share a slot).
DROP_LUA = """
-- KEYS: streams; ARGV: consumer group, then per stream: n, then its n entry ids
local at = 2
for i = 1, #KEYS do
  local n = tonumber(ARGV[at])
  redis.call('XACK', KEYS[i], ARGV[1], unpack(ARGV, at + 1, at + n))
  redis.call('XDEL', KEYS[i], unpack(ARGV, at + 1, at + n))
  at = at + n + 1
end
return 1
"""
DROP_CHUNK = 1000  # entry ids per script call at most (Lua's unpack has a stack limit)


class Writer:
    """The writes of one batcher (`consumer`) of a run; `unreplicated` counts the durable
    writes whose WAIT for replicas fell short (each retried)."""

    def __init__(self, redis: Any, keys: Keys, consumer: str, replicas: ReplicaWait,
                 owner: OwnerWatch, write_timeout_s: float):
        self._redis = redis
        self._keys = keys
        self._consumer = consumer
        self._replicas = replicas
        self._owner = owner
        self.write_timeout_s = write_timeout_s
        self.unreplicated = 0  # acks and version publishes whose WAIT for replicas fell short

    def durable_write(self, what: str, queue: Any, deadline: float | None = None) -> list[Any]:
        """Send the commands `queue(pipe)` puts in a pipeline and return their replies; with
        `min_replicas`, a WAIT follows them on the same connection. Connection errors, a
        failover and a WAIT that falls short are retried with backoff (every caller's
        commands are safe to repeat) for up to `write_timeout_s` (or until `deadline`, a
        get_batch's own), then raised (`NotReplicated` for missing replicas)."""
        if deadline is None:
            deadline = time.monotonic() + self.write_timeout_s
        backoff = Backoff(name=f"batcher {self._consumer}")
        while True:
            pipe = self._redis.pipeline(transaction=False)
            queue(pipe)
            size = len(pipe)
            sent_to = self._replicas.queue(pipe) if self._replicas.enabled else None
            try:
                replies = pipe.execute(raise_on_error=False)
                for reply in replies[:size]:
                    if isinstance(reply, Exception):
                        raise reply
                short = (self._replicas.shortfall(sent_to, replies) if self._replicas.enabled
                         else None)
                if short is None:
                    backoff.reset()
                    return replies[:size]
                self.unreplicated += 1
                problem: Exception = NotReplicated(f"{what} not acknowledged: {short}")
            except REDIS_ERRORS as exc:
                if not is_transient(exc):
                    raise
                problem = exc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise problem
            backoff.sleep_sync(f"{what}: {problem}", max_s=remaining)
            self._owner.note(self._redis)

    def drop_entries(self, entries: list[Entry]) -> None:
        """Ack and delete `entries` in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        self.queue_drop(pipe, entries)
        pipe.execute()

    def queue_drop(self, pipe: Any, entries: list[Entry]) -> None:
        """Ack and delete `entries`: one script call per `DROP_CHUNK` entries (a batch of
        1024 over 128 streams was 256 commands; now it is one)."""
        by_stream: dict[str, list[str]] = defaultdict(list)
        for entry in entries:
            by_stream[entry.stream].append(entry.entry_id)
        streams: list[str] = []
        args: list[Any] = [CONSUMER_GROUP]
        for stream, ids in by_stream.items():
            for at in range(0, len(ids), DROP_CHUNK):
                chunk = ids[at:at + DROP_CHUNK]
                streams.append(stream)
                args += [len(chunk), *chunk]
                if len(args) > DROP_CHUNK:
                    pipe.execute_command("EVAL", DROP_LUA, len(streams), *streams, *args)
                    streams, args = [], [CONSUMER_GROUP]
        if streams:
            pipe.execute_command("EVAL", DROP_LUA, len(streams), *streams, *args)

    def dead_letter(self, dead: list[tuple[Entry, bytes, str]]) -> None:
        """Move undecodable entries to `{RUN}:dead` with their reason, and ack and delete
        them: the batcher goes on."""
        pipe = self._redis.pipeline(transaction=False)
        for entry, data, reason in dead:
            logger.warning("dead-lettering %s %s: %s", entry.stream, entry.entry_id, reason)
            pipe.xadd(self._keys.dead, {"stream": entry.stream, "id": entry.entry_id,
                                        "reason": reason, "data": data}, maxlen=10_000,
                      approximate=True)
        self.queue_drop(pipe, [entry for entry, _, _ in dead])
        pipe.execute()
