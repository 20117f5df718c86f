"""Which producers are live: a heartbeat not yet expired, on the Redis server's clock.

Producers write their heartbeats to the `{RUN}:producers` zset: id -> when that heartbeat
expires (server ms, from `TIME` inside the heartbeat script, plus the producer's own lease
ttl). So a producer is live exactly as long as its own ttl says, whatever ttl the reader's
config holds (producers left on an older config may run another). Entries of dead producers
linger until a live heartbeat trims them, so "live" is always counted against the server's
clock, never by the set's size.
"""

from __future__ import annotations

from typing import Any

from schemas.keys import Keys
from schemas.redisconn import server_ms


def live_producers(client: Any, keys: Keys) -> dict[str, float]:
    """Producer id -> seconds until its heartbeat expires, for the live ones."""
    now = server_ms(client, keys.producers)
    beats = client.zrangebyscore(keys.producers, now, "+inf", withscores=True)
    return {_text(member): max(0.0, (score - now) / 1000) for member, score in beats}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
