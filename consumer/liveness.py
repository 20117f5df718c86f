"""A batcher's liveness: its name, kept alive, and what other batchers do with it.

`Heartbeat`: the batcher's liveness key `{RUN}:alive:{consumer}`, taken once free (a live
batcher of the same name is refused: `BatcherConflict`), refreshed while the process runs,
marked `closed` at the end; a batcher whose name another took meanwhile (it was frozen past
its ttl) is fenced: it acks, publishes and hands out nothing more. `Claims`: a batcher claims
the pending entries of another only once that one is gone: its key `closed`, or missing for
a whole ttl of looking.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import redis as redis_lib

from consumer.periodic import Periodic
from consumer.state import ModeState
from schemas.errors import BatcherConflict
from schemas.keys import BATCHER_CLOSED as CLOSED
from schemas.keys import CONSUMER_GROUP, Keys
from schemas.redisconn import REDIS_ERRORS

logger = logging.getLogger(__name__)

# A batcher's name (its liveness key): write ARGV[2] (PX ARGV[3]) only while the key is free
# for this batcher: missing (lapsed in an outage, or never taken), its own mark ARGV[1], or
# ARGV[4] ('closed' when taking the name: a previous life ended cleanly; '' when beating or
# closing: a `closed` there is another batcher's). Else {the holder's mark, its PTTL}.
NAME_LUA = """
local held = redis.call('GET', KEYS[1])
if not held or held == ARGV[1] or held == ARGV[4] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return nil
end
return {held, redis.call('PTTL', KEYS[1])}
"""


class Heartbeat:
    """A batcher's liveness key (`{RUN}:alive:{consumer}`, PX `ttl_ms`), refreshed every third
    of its ttl (a `Periodic`) from the first `get_batch` until `stop()`, or until the Batcher
    is garbage: also while the trainer trains between calls. Another batcher claims this
    one's pending entries only once the key has been missing for a ttl (the process is gone),
    or at once when it says `closed`: `stop()` leaves that word for `closed_ms`."""

    def __init__(self, redis: Any, keys: Keys, consumer: str, ttl_ms: int, closed_ms: int):
        self._redis = redis
        self._key = keys.batcher_alive(consumer)
        self._consumer = consumer
        self._ttl_ms, self._closed_ms = ttl_ms, closed_ms
        # what this batcher writes: another live batcher of the same name writes its own
        self._token = uuid.uuid4().hex.encode()
        self.lost = False  # another batcher's mark found in the key: the name was taken
        self._beat_at = 0.0  # when a beat last wrote this batcher's mark (monotonic)
        self._name_script = redis.register_script(NAME_LUA)
        # the thread holds this heartbeat weakly: it ends once the Batcher (its only holder)
        # is garbage, as well as at `stop()`
        self._beats = Periodic(self, lambda heartbeat: heartbeat._beat(), ttl_ms / 3000,
                               name=f"rollstream-{self._key}",
                               what=f"refreshing {self._key}", log_level=logging.DEBUG)
        self._started = False

    def start(self) -> None:
        """Take the name (`_take_name`), then keep the key fresh; once only. Raises a Redis
        error, or `BatcherConflict`."""
        if self._started:
            return
        self._take_name()
        self._beat_at = time.monotonic()
        self._beats.start()
        self._started = True

    def _take_name(self) -> None:
        """Write this batcher's mark, atomically, once the key is free: missing, `closed`,
        or the mark of a batcher whose process died (a trainer restarted within the ttl:
        its previous life's key expires unrefreshed, at most `ttl_ms`). A key refreshed
        meanwhile belongs to a live batcher of the same name: `BatcherConflict`, before this
        one reads the name's pending entries (it took the live one's unacked batch)."""
        deadline = time.monotonic() + self._ttl_ms / 1000 + 1.0
        last_ttl: int | None = None
        while True:
            held = self._write(self._token, self._ttl_ms, free=CLOSED)
            if held is None:
                return
            pttl = int(held[1])
            if (last_ttl is not None and pttl > last_ttl) or time.monotonic() > deadline:
                raise BatcherConflict(
                    f"another live batcher is named {self._consumer!r} on this run (its "
                    f"liveness key {self._key} is kept fresh): two batchers of one name take "
                    "each other's unacked batches; give each trainer its own index and count "
                    "(or consumer), or stop the other one")
            if last_ttl is None:
                logger.info("batcher %s: its name's liveness key holds another mark; waiting "
                            "up to %d ms for it to expire (this trainer's previous life?)",
                            self._consumer, pttl)
            last_ttl = pttl
            time.sleep(min(0.1, self._ttl_ms / 30000))

    def stop(self) -> None:
        """Stop refreshing and mark the key `closed` (best effort)."""
        self._beats.stop()
        if self._started:
            self._started = False
            try:  # only its own: a name another batcher took stays that one's
                self._write(CLOSED, self._closed_ms)
            except redis_lib.RedisError as exc:
                logger.debug("could not mark %s closed: %s", self._key, exc)

    @property
    def started(self) -> bool:
        """The name is held and kept fresh (from the first `get_batch` until `stop()`)."""
        return self._started

    @property
    def mark(self) -> str:
        """What this batcher writes in the key while it holds the name ('' before)."""
        return self._token.decode() if self._started else ""

    def _write(self, value: bytes, px: int, free: bytes = b"") -> Any:
        """`NAME_LUA`: write `value` while the key is this batcher's to write."""
        return self._name_script(keys=[self._key], args=[self._token, value, px, free])

    def check(self) -> None:
        """`BatcherConflict` when another batcher has taken this one's name, which happens
        only while this process did not beat for a whole ttl (frozen: SIGSTOP, a long
        pause): that one may have its unacked batch now, so this one must not ack, publish
        or take another. One GET, only once the name is held."""
        if self._started and not self.lost:
            try:
                held = self._redis.get(self._key)
            except REDIS_ERRORS:  # Redis away: the write that follows retries
                held = None  # (and a publish checks inside its script)
            if held is not None and held != self._token:
                self.lose()
        if self.lost:
            raise BatcherConflict(
                f"batcher {self._consumer!r}: another batcher took this name while this "
                f"process was not running for over {self._ttl_ms} ms (frozen? SIGSTOP, a long "
                "pause): its unacked batch may be that one's now, so this one acks, publishes "
                "and hands out nothing more; end this trainer (the other goes on)")

    def guard(self) -> None:
        """`check()`, but its GET only when no beat has landed for half a ttl (the process
        was frozen, or Redis away), so never in a healthy run: before `ack`, and before each
        read and hand-out of `get_batch`, so a trainer continued after another took its
        name reads nothing into the name's pending entries, which the other reads only once."""
        if self._started and (self.lost or
                              time.monotonic() - self._beat_at > self._ttl_ms / 2000):
            self.check()

    def lose(self) -> None:
        """The key holds another batcher's mark (a beat, a check or a publish found it)."""
        if self.lost:
            return
        self.lost = True
        logger.error("batcher %r: its liveness key %s holds another batcher's mark: it was "
                     "taken while this process was not running; this batcher stops acking, "
                     "publishing and handing out", self._consumer, self._key)

    def _beat(self) -> None:
        if self._write(self._token, self._ttl_ms) is not None:
            self.lose()
        else:
            self._beat_at = time.monotonic()


class Claims:
    """Claims for this batcher the entries a dead batcher left pending: one whose liveness
    key (`Heartbeat`) is `closed`, or has been missing for a whole `alive_ttl_ms` of looking,
    and that were idle for `claim_idle_ms`. A live batcher's unacked batch stays its own,
    however long its trainer takes."""

    def __init__(self, redis: Any, keys: Keys, consumer: str, *, claim_idle_ms: int,
                 alive_ttl_ms: int, read_count: int):
        self._redis = redis
        self._keys = keys
        self._consumer = consumer
        self._claim_idle_ms = claim_idle_ms
        self._alive_ttl_ms = alive_ttl_ms
        self._read_count = read_count
        self.last_claim = 0.0  # monotonic time of the last `claim`
        # other consumers seen holding entries without a liveness key: (mode, name) -> when
        # first seen so (monotonic); claimed from only once that has lasted a whole ttl
        self.suspects: dict[tuple[str, str], float] = {}

    def claim(self, state: ModeState) -> Iterator[tuple[str, list[Any]]]:
        """Claim the entries of `state`'s streams that dead batchers left pending longer than
        `claim_idle_ms`; yields (stream, claimed messages) page by page, as claimed (the
        caller places them before the next page is read)."""
        self.last_claim = time.monotonic()
        dead = self.dead_holders(state)
        pages = {(name, stream): "-" for name, streams in dead.items() for stream in streams}
        while pages:
            pipe = self._redis.pipeline(transaction=False)
            for (name, stream), start in pages.items():
                pipe.xpending_range(stream, CONSUMER_GROUP, min=start, max="+",
                                    count=self._read_count, consumername=name,
                                    idle=self._claim_idle_ms)
            found = {where: [item["message_id"] for item in reply]
                     for where, reply in zip(pages, pipe.execute(), strict=True) if reply}
            if not found:
                return
            pipe = self._redis.pipeline(transaction=False)
            for (_, stream), ids in found.items():
                pipe.xclaim(stream, CONSUMER_GROUP, self._consumer,
                            min_idle_time=self._claim_idle_ms, message_ids=ids)
            for (name, stream), messages in zip(found, pipe.execute(), strict=True):
                if messages:
                    logger.info("claimed %d pending entries of %s from batcher %s (gone)",
                                len(messages), stream, _text(name))
                    yield stream, messages
            pages = {where: "(" + _text(ids[-1]) for where, ids in found.items()
                     if len(ids) >= self._read_count}

    def dead_holders(self, state: ModeState) -> dict[str, list[str]]:
        """Other consumers with entries pending in this batcher's streams and no live
        heartbeat for a whole `alive_ttl_ms` of looking: consumer -> those streams. A key
        missing at one look is not enough: after a Redis outage longer than the ttl a live
        batcher's key has expired until its next beat lands (a third of the ttl)."""
        pipe = self._redis.pipeline(transaction=False)
        for stream in state.streams:
            pipe.xpending(stream, CONSUMER_GROUP)
        holders: dict[str, list[str]] = defaultdict(list)
        for stream, summary in zip(state.streams, pipe.execute(), strict=True):
            for consumer in summary.get("consumers") or ():
                name = _text(consumer["name"])
                if name != self._consumer and int(consumer["pending"]):
                    holders[name].append(stream)
        if not holders:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for name in holders:
            pipe.get(self._keys.batcher_alive(name))
        now, grace = time.monotonic(), self._alive_ttl_ms / 1000
        dead: dict[str, list[str]] = {}
        for (name, streams), word in zip(holders.items(), pipe.execute(), strict=True):
            if word == CLOSED:
                dead[name] = streams  # closed by its owner: gone for sure
            elif word is not None:  # alive
                self.suspects.pop((state.mode, name), None)
            elif now - self.suspects.setdefault((state.mode, name), now) >= grace:
                dead[name] = streams
        for mode, name in list(self.suspects):
            if mode == state.mode and name not in holders:
                del self.suspects[mode, name]  # holds nothing here any more
        return dead

    def due(self) -> bool:
        """Time for `claim`: `claim_idle_ms` since the last one, or a suspect's ttl of
        grace (`dead_holders`) is over."""
        now = time.monotonic()
        if now - self.last_claim > self._claim_idle_ms / 1000:
            return True
        return any(now - since >= self._alive_ttl_ms / 1000 for since in self.suspects.values())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
