"""Atomic, pipelined commits of finished trajectories.

A commit is one Lua script per shard and flush: check that the shard's lease still names this
producer (fencing), check the run is not paused (train) or that the val round is current (val),
then for each trajectory XADD it to its group stream and advance the env's cursor, unless the
cursor is already past that episode (a replay: nothing twice). All flushes of one loop
iteration travel in one pipeline, so a busy producer pays one round trip for many commits.
A sampled trajectory (`schemas.samples`) carries its sample, which the same script adds to
the run's capped sample stream once its commit has landed there: never a round trip of its
own, and a commit fenced off, paused or duplicate leaves no sample.

With `min_replicas` the pipeline ends with a WAIT for replicas on the same connection
(`ReplicaWait`); when it falls short, the flush's commits are not acknowledged: the env
tasks keep waiting and the trajectories are sent again with backoff (the resend is answered
DUPLICATE, the cursor being past them, and waits for replicas again) until replicas have
them. A run whose primary has too few replicas holds here instead of acknowledging writes a
failover could lose.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgpack
from redis.exceptions import NoScriptError

from schemas.backoff import Backoff
from schemas.codec import ENTRY_FIELD
from schemas.errors import NotReplicated
from schemas.keys import Keys
from schemas.redisconn import REDIS_ERRORS, AsyncClient, ReplicaWait, queue_script

logger = logging.getLogger(__name__)

COMMIT_LUA = """
-- KEYS: lease, cursor, pause, val_round, samples, then one stream per trajectory
-- ARGV: producer, mode, round, one msgpack array of env_id, episode per trajectory, the
-- indexes of the sampled trajectories (a msgpack array, or '' for none), the sample stream's
-- length, then each trajectory's data (its own argument: a string entering Lua is hashed byte
-- by byte), then each sample's data
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
if ARGV[2] == 'train' then
  if redis.call('SCARD', KEYS[3]) > 0 then return {-2} end
else
  if tonumber(redis.call('GET', KEYS[4]) or '0') ~= tonumber(ARGV[3]) then return {-3} end
end
local ids = cmsgpack.unpack(ARGV[4])
local n = #ids / 2
local envs = {}
for i = 1, n do envs[i] = ids[2 * i - 1] end
local read = redis.call('HMGET', KEYS[2], unpack(envs))  -- every cursor in one call
local cursor = {}
for i = 1, n do cursor[envs[i]] = tonumber(read[i] or '0') end
local out, advanced = {}, {}
for i = 1, n do
  local env = envs[i]
  local k = ids[2 * i]
  if cursor[env] > k then
    out[i] = 0
  else
    redis.call('XADD', KEYS[5 + i], '*', 'data', ARGV[6 + i])
    cursor[env] = k + 1
    advanced[#advanced + 1] = env
    out[i] = 1
  end
end
local fields = {}
for _, env in ipairs(advanced) do
  fields[#fields + 1] = env
  fields[#fields + 1] = cursor[env]
end
if #fields > 0 then redis.call('HSET', KEYS[2], unpack(fields)) end
if ARGV[5] ~= '' then
  for j, i in ipairs(cmsgpack.unpack(ARGV[5])) do
    if out[i] == 1 then  -- only a commit that landed leaves a sample
      redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*', 'data', ARGV[6 + n + j])
    end
  end
end
return out
"""
assert ENTRY_FIELD == b"data"  # the script writes this field name


class Outcome(IntEnum):
    """What became of one trajectory's commit."""

    COMMITTED = 1
    DUPLICATE = 0  # the cursor was already past this episode
    LEASE_LOST = -1  # fenced: another producer holds the shard now
    PAUSED = -2  # the run is paused; hold the trajectory, retry after resume
    STALE_ROUND = -3  # a val trajectory of a round that is over


OUTCOMES = {outcome.value: outcome for outcome in Outcome}  # a script's code -> its Outcome


class CommitterClosed(RuntimeError):
    """A commit submitted after the committer stopped (the producer is stopping)."""


@dataclass(slots=True)
class PendingCommit:
    mode: str
    shard: int
    round: int
    env_id: int
    episode_id: int
    stream: str
    data: bytes
    future: asyncio.Future[Outcome] = field(repr=False)
    sample: bytes | None = field(default=None, repr=False)  # its sample, if it is sampled
    landed: bool = False  # a send was answered COMMITTED (not yet acknowledged by replicas)


class Committer:
    """Collects commits from many env tasks and flushes them in one pipeline per iteration."""

    def __init__(self, redis: AsyncClient, keys: Keys, producer_id: str, *,
                 max_batch: int = 512, replicas: ReplicaWait | None = None,
                 sample_stream_len: int = 128):
        self._redis = redis
        self._sample_len = sample_stream_len
        self._keys = keys
        self._producer_id = producer_id
        self._max_batch = max_batch
        self._replicas = replicas if replicas is not None and replicas.enabled else None
        self._queue: list[PendingCommit] = []
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._sha: str | None = None
        self.committed = 0
        self.unreplicated = 0  # flushes whose WAIT for replicas fell short
        self.closed = False  # `run` has returned: nothing queued now would ever be sent

    async def commit(
        self, *, mode: str, shard: int, round: int, env_id: int, episode_id: int,
        stream: str, data: bytes, sample: bytes | None = None,
    ) -> Outcome:
        """Queue a commit and wait for its outcome."""
        return await self.submit(mode, shard, round, env_id, episode_id, stream, data,
                                 sample=sample)

    def submit(self, mode: str, shard: int, round: int, env_id: int, episode_id: int,
               stream: str, data: bytes, *, sample: bytes | None = None
               ) -> asyncio.Future[Outcome]:
        """Queue a commit; the future is its outcome (`commit` without a coroutine of its
        own: the producer awaits the future directly). `sample`: the trajectory's sample
        (`schemas.samples`), written to the sample stream by the same script call if, and
        only if, the commit lands."""
        future: asyncio.Future[Outcome] = self._loop.create_future()
        if self.closed:  # the producer is stopping: the episode replays elsewhere
            future.set_exception(CommitterClosed("producer stopped: commit not sent"))
            return future
        self._queue.append(
            PendingCommit(mode, shard, round, env_id, episode_id, stream, data, future, sample)
        )
        self._wakeup.set()
        return future

    async def run(self, stop: asyncio.Event, backoff: Backoff) -> None:
        """Flush until `stop` is set and the queue is empty. Redis errors back off and retry.
        A commit submitted after it returned fails at once (`closed`): an env task still
        playing at a stop must not wait for a flush that never comes."""
        try:
            await self._run(stop, backoff)
        finally:
            self.closed = True

    async def _run(self, stop: asyncio.Event, backoff: Backoff) -> None:
        while not (stop.is_set() and not self._queue):
            if not self._queue:
                self._wakeup.clear()
                waiter = asyncio.ensure_future(self._wakeup.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                continue
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            try:
                unsent, error = await self._flush(batch)
            except REDIS_ERRORS as exc:  # the whole pipeline failed
                unsent, error = batch, exc
            if not unsent:
                backoff.reset()
                continue
            # keep order; a resend of one that did land is a no-op (the cursor is past it)
            self._queue[:0] = unsent
            await backoff.sleep(str(error) if isinstance(error, NotReplicated)
                                else f"commit failed: {error}")

    def fail_all(self, exc: BaseException) -> None:
        """Wake every waiter with `exc` (used when the producer shuts down)."""
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(exc)
        self._queue.clear()

    async def _load(self) -> str:
        if self._sha is None:
            self._sha = await self._redis.script_load(COMMIT_LUA)
        return self._sha

    async def _flush(
        self, batch: list[PendingCommit]
    ) -> tuple[list[PendingCommit], Exception | None]:
        """Send `batch`; settle every commit that got an answer. Returns the ones to resend
        (their shard's call failed) and the error."""
        by_shard: dict[tuple[str, int, int], list[PendingCommit]] = {}
        for item in batch:
            by_shard.setdefault((item.mode, item.shard, item.round), []).append(item)
        groups = list(by_shard.items())
        replies, short = await self._send(await self._load(), groups)
        retry = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if retry:  # the server restarted and lost its script cache: load again, resend those
            self._sha = None
            again, short_again = await self._send(await self._load(), [groups[i] for i in retry])
            for i, reply in zip(retry, again, strict=True):
                replies[i] = reply
            short = short or short_again
        unsent: list[PendingCommit] = []
        error: Exception | None = None
        for (_, items), reply in zip(groups, replies, strict=True):
            if isinstance(reply, Exception):
                unsent += items
                error = reply
                continue
            codes = [int(r) for r in reply]
            if len(codes) == 1 and codes[0] < 0:  # a refusal covers the whole shard
                codes = codes * len(items)
            for item, code in zip(items, codes, strict=True):
                if self._settle(item, OUTCOMES[code], short):
                    unsent.append(item)
        if short is not None and unsent and error is None:
            self.unreplicated += 1
            error = NotReplicated(f"commits not acknowledged: {short}; holding "
                                  f"{len(unsent)} trajectories and sending them again")
        return unsent, error

    def _settle(self, item: PendingCommit, outcome: Outcome, short: str | None) -> bool:
        """Give the env task its outcome; True when the commit waits for replicas (resend)."""
        if outcome is Outcome.COMMITTED:
            item.landed = True
        if short is not None and outcome in (Outcome.COMMITTED, Outcome.DUPLICATE):
            return True  # in Redis, but not on enough replicas: not acknowledged yet
        if outcome is Outcome.DUPLICATE and item.landed:
            outcome = Outcome.COMMITTED  # an earlier send of ours wrote it
        self.committed += outcome is Outcome.COMMITTED
        if not item.future.done():
            item.future.set_result(outcome)
        return False

    async def _send(
        self, sha: str, groups: list[tuple[tuple[str, int, int], list[PendingCommit]]]
    ) -> tuple[list[Any], str | None]:
        """One pipeline: a script call per shard, then (with `min_replicas`) the WAIT.
        Returns the scripts' replies and why the WAIT fell short (None: replicated)."""
        keys = self._keys
        pipe = self._redis.pipeline(transaction=False)
        for (mode, shard, round_), items in groups:
            script_keys = [keys.lease(mode, shard), keys.cursor(mode), keys.pause, keys.val_round,
                           keys.samples]
            script_keys += [item.stream for item in items]
            ids: list[int] = []
            sampled: list[int] = []  # 1-based, as Lua counts
            for i, item in enumerate(items, 1):
                ids += (item.env_id, item.episode_id)
                if item.sample is not None:
                    sampled.append(i)
            # the ids as one argument, each trajectory's data as its own: Redis hashes every
            # byte of a string that enters Lua, so the data must not also travel packed
            args = [self._producer_id, mode, round_, msgpack.packb(ids),
                    msgpack.packb(sampled) if sampled else b"", self._sample_len,
                    *[item.data for item in items]]
            if sampled:
                args += [items[i - 1].sample for i in sampled]
            queue_script(pipe, sha, script_keys, args)
        if self._replicas is None:
            return await pipe.execute(raise_on_error=False), None
        sent_to = self._replicas.queue(pipe)
        replies = await pipe.execute(raise_on_error=False)
        return replies[: len(groups)], self._replicas.shortfall(sent_to, replies)
