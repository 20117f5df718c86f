"""Shard leases: which producer runs which shard, claimed, renewed and handed over in Redis.

A lease is a string key holding the producer id with a PX ttl. Every heartbeat a producer
renews its leases (only where the key still names it), records itself in the run's producer
set, and learns how many producers are live. Its fair share is `ceil(shards / live)` (or
`max_shards`), raised where capped producers (`--max-shards`) leave shards to the others:
below it, it claims free shards with SET NX; above it, it hands shards back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.keys import Keys
from schemas.redisconn import AsyncClient

ShardId = tuple[str, int]  # (mode, shard index)

HEARTBEAT_LUA = """
-- KEYS: producers zset, producer caps hash, then the leases this producer holds
-- ARGV: producer id, ttl ms, its max_shards (0: none)
-- Each entry's score is when its heartbeat expires (server ms), by the ttl of the producer
-- that wrote it: producers of one run may run different ttls (a config changed under
-- running producers), and each is live exactly as long as its own ttl says. Expired entries
-- stay nine of this ttl more (status shows them as gone), then are dropped.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - 9 * ttl)
for i = 1, #gone do
  redis.call('ZREM', KEYS[1], gone[i])
  redis.call('HDEL', KEYS[2], gone[i])
end
if tonumber(ARGV[3]) > 0 then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
-- the keys outlive the latest expiry in the set (a short ttl never cuts a long one short)
local latest = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
redis.call('PEXPIREAT', KEYS[1], latest + 9 * ttl)
redis.call('PEXPIREAT', KEYS[2], latest + 9 * ttl)
local held = {}
for i = 3, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[i], ttl)
    held[i - 2] = 1
  else
    held[i - 2] = 0
  end
end
-- the live producers' caps ('' for none), this one's included
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')
local caps = {}
for i = 1, #live do
  caps[i] = redis.call('HGET', KEYS[2], live[i]) or ''
end
return {held, caps}
"""

RELEASE_LUA = """
-- KEYS: leases; ARGV: producer id. Deletes only the leases that still name this producer.
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
"""

# What a producer reads when it takes a shard, in one atomic step: its envs' cursors and the
# val round (a script, not MULTI: see schemas.redisconn.ops).
START_LUA = """
-- KEYS: cursor hash, val_round; ARGV: env ids
return {redis.call('HMGET', KEYS[1], unpack(ARGV)), redis.call('GET', KEYS[2]) or '0'}
"""

LEAVE_LUA = """
-- KEYS: producers zset, producer caps hash; ARGV: producer id
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
"""

# The producer's stats record (`schemas/stats.py`), stamped with the server's clock; records
# of producers silent for `keep` ms are dropped, so a dead producer shows as gone that long.
REPORT_LUA = """
-- KEYS: stats hash, seen zset; ARGV: producer id, record, keep ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now, ARGV[1])
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - keep)
for i = 1, #old do
  redis.call('HDEL', KEYS[1], old[i])
  redis.call('ZREM', KEYS[2], old[i])
end
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
return now
"""


@dataclass
class Heartbeat:
    lost: list[ShardId]  # leases that no longer name this producer
    caps: list[int | None]  # each live producer's max_shards (None: none), this one's too

    @property
    def live(self) -> int:
        """Producers with a fresh heartbeat, this one included."""
        return max(1, len(self.caps))


class Leases:
    """The lease operations of one producer."""

    def __init__(self, redis: AsyncClient, keys: Keys, producer_id: str, ttl_s: float,
                 max_shards: int | None = None):
        self._redis = redis
        self._keys = keys
        self.producer_id = producer_id
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.max_shards = max_shards
        self._heartbeat = redis.register_script(HEARTBEAT_LUA)
        self._release = redis.register_script(RELEASE_LUA)
        self._leave = redis.register_script(LEAVE_LUA)
        self._report = redis.register_script(REPORT_LUA)

        self._start = redis.register_script(START_LUA)

    def key(self, shard: ShardId) -> str:
        return self._keys.lease(*shard)

    async def heartbeat(self, held: list[ShardId]) -> Heartbeat:
        keys = [self._keys.producers, self._keys.producer_caps] + [self.key(s) for s in held]
        flags, caps = await self._heartbeat(
            keys=keys, args=[self.producer_id, self.ttl_ms, self.max_shards or 0])
        lost = [shard for shard, flag in zip(held, flags, strict=True) if not int(flag)]
        return Heartbeat(lost=lost,
                         caps=[int(cap) if cap else None for cap in caps] or [self.max_shards])

    async def try_claim(self, shard: ShardId) -> bool:
        return bool(
            await self._redis.set(self.key(shard), self.producer_id, nx=True, px=self.ttl_ms)
        )

    async def release(self, shards: list[ShardId]) -> int:
        if not shards:
            return 0
        return int(await self._release(keys=[self.key(s) for s in shards],
                                       args=[self.producer_id]))

    async def read_start(self, mode: str, env_ids: list[int]) -> tuple[list[int], int]:
        """The next episode of each env (its cursor, 0 if none) and the val round."""
        cursors, val_round = await self._start(
            keys=[self._keys.cursor(mode), self._keys.val_round], args=env_ids)
        return [int(c or 0) for c in cursors], int(val_round)

    async def leave(self) -> None:
        await self._leave(keys=[self._keys.producers, self._keys.producer_caps],
                          args=[self.producer_id])

    async def report(self, record: bytes, keep_s: float) -> None:
        """Write this producer's stats record (see `schemas/stats.py`)."""
        await self._report(keys=[self._keys.producer_stats, self._keys.producer_seen],
                           args=[self.producer_id, record, max(1, int(keep_s * 1000))])

    async def forget(self) -> None:
        """Drop this producer's stats record (it leaves cleanly: not shown as gone)."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.hdel(self._keys.producer_stats, self.producer_id)
        pipe.zrem(self._keys.producer_seen, self.producer_id)
        await pipe.execute()


def fair_share(total_shards: int, caps: list[int | None], max_shards: int | None) -> int:
    """This producer's share of `total_shards` among the live producers whose caps
    (`--max-shards`, None: none) are `caps`, this one's included: the least level L with
    every producer holding min(its cap, L) covering every shard (or L at everyone's cap), so
    what a capped producer cannot take falls to the others instead of to nobody."""
    level = math.ceil(total_shards / max(1, len(caps)))
    while level < total_shards and any(cap is None or cap > level for cap in caps) and \
            sum(level if cap is None else min(cap, level) for cap in caps) < total_shards:
        level += 1
    return level if max_shards is None else min(level, max_shards)


def claim_order(shards: list[ShardId], producer_id: str) -> list[ShardId]:
    """All shards, starting at an offset of this producer's own, so claims rarely collide."""
    if not shards:
        return []
    offset = sum(producer_id.encode()) * 7919 % len(shards)
    return shards[offset:] + shards[:offset]
