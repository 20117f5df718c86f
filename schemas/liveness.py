"""Which producers are live: a heartbeat within one lease ttl, on the Redis server's clock.

Producers write their heartbeats to the `{RUN}:producers` zset (id -> ms, from `TIME` inside
the heartbeat script); entries of dead producers linger until a live heartbeat trims them,
so "live" is always counted against the server's clock, never by the set's size.
"""

from __future__ import annotations

from typing import Any

from schemas.keys import Keys
from schemas.redisconn import server_ms


def live_producers(client: Any, keys: Keys, ttl_s: float) -> dict[str, float]:
    """Producer id -> seconds since its last heartbeat, for heartbeats within `ttl_s`."""
    now = server_ms(client, keys.producers)
    beats = client.zrangebyscore(keys.producers, now - int(ttl_s * 1000), "+inf",
                                 withscores=True)
    return {_text(member): max(0.0, (now - score) / 1000) for member, score in beats}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
