"""The run's control state as a producer sees it: version, pause reasons, val round, stop.

Read by polling (every `poll_interval_s`) and woken early by the run's pub/sub channel;
pub/sub alone is lossy, polling alone is slow, together they are both cheap and prompt.
On a Redis Cluster the channel is a sharded one (SSUBSCRIBE on the run's node).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from producers.lifetime import cancel_and_wait, within
from schemas.backoff import Backoff
from schemas.keys import Keys
from schemas.redisconn import REDIS_ERRORS, AsyncClient, ControlSubscription

logger = logging.getLogger(__name__)

LEASES_MESSAGE = b"leases"  # on the control channel: rebalance shards now
WAKE_CHUNK = 512  # waiters woken per event-loop pass in async mode (`ControlState.wake_all`)
SYNC_WAKE_CHUNK = 16  # the same in sync mode, where a resume wakes every env at once

# One atomic read of the control keys (a script, not MULTI: see schemas.redisconn.ops).
CONTROL_LUA = """
-- KEYS: version, pause, val_round, stop
return {redis.call('GET', KEYS[1]) or '0', redis.call('SMEMBERS', KEYS[2]),
        redis.call('GET', KEYS[3]) or '0', redis.call('EXISTS', KEYS[4])}
"""


class ControlState:
    """Latest known control values; `await wait_change()` wakes on any change.

    Thousands of env tasks wait here, so a wait is a bare future, not a timer each: the
    bound on every wait is the watcher's `wake_all()` every `wake_every_s` (and on stop)."""

    def __init__(self, wake_chunk: int = WAKE_CHUNK) -> None:
        self.wake_chunk = wake_chunk
        self.version = 0
        self.paused: frozenset[str] = frozenset()
        self.val_round = 0
        self.stopped = False
        self.generation = 0  # +1 on every change and every wake: a cheap "anything new?"
        self._waiters: deque[asyncio.Future[None]] = deque()

    def update(self, version: int, paused: frozenset[str], val_round: int, stopped: bool) -> None:
        new = (version, paused, val_round, stopped)
        if new != (self.version, self.paused, self.val_round, self.stopped):
            self.version, self.paused, self.val_round, self.stopped = new
            self.wake_all()

    async def wait_change(self) -> None:
        """Return on the next change, or at the watcher's next periodic wake."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    def wake_all(self) -> None:
        """Wake every waiter and make every running episode re-check its gate.

        Waiters are released `wake_chunk` per event-loop pass, not all in one: after a
        resume the envs' episodes start in chunks, so the committer gets the loop between
        chunks and trajectories reach Redis while the rest still play (the trainer decodes
        them as they land, not all after the last one). A sync producer uses small chunks
        (`SYNC_WAKE_CHUNK`): every batch there starts with a resume, and the trainer waits
        for its end. An async producer uses large ones: its envs run ahead of the trainer,
        and fewer, larger passes commit in larger flushes. Measured in
        `bench/bench_handoff.py` and `bench/bench_pipeline.py`: see docs/decisions.md
        (Performance)."""
        self.generation += 1
        if self._waiters:
            waiters, self._waiters = self._waiters, deque()
            self._release(waiters)

    def _release(self, waiters: deque[asyncio.Future[None]]) -> None:
        for _ in range(min(self.wake_chunk, len(waiters))):
            waiter = waiters.popleft()
            if not waiter.done():  # a wait given up (timed out, cancelled) is skipped
                waiter.set_result(None)
        if waiters:
            waiters[0].get_loop().call_soon(self._release, waiters)


class ControlWatcher:
    """Keeps a `ControlState` fresh from Redis."""

    def __init__(self, redis: AsyncClient, keys: Keys, state: ControlState,
                 poll_interval_s: float = 0.2, wake_every_s: float = 2.0):
        self._redis = redis
        self._keys = keys
        self.state = state
        self.poll_interval_s = poll_interval_s
        self.wake_every_s = wake_every_s
        self._read = redis.register_script(CONTROL_LUA)
        self._poke = asyncio.Event()
        self.leases_changed = asyncio.Event()  # a producer joined, left or handed a shard over
        self.subscribed = asyncio.Event()  # the control channel is being listened to

    async def refresh(self) -> None:
        keys = self._keys
        version, paused, val_round, stop = await self._read(
            keys=[keys.version, keys.pause, keys.val_round, keys.stop])
        self.state.update(
            int(version or 0),
            frozenset(p.decode() if isinstance(p, bytes) else p for p in paused),
            int(val_round or 0),
            bool(stop),
        )
        if self.state.stopped:  # the lease loop ends the producer now, not at its next beat
            self.leases_changed.set()

    async def run(self, stop: asyncio.Event, backoff: Backoff) -> None:
        listener = asyncio.ensure_future(self._listen(stop))
        last_wake = time.monotonic()
        try:
            while not stop.is_set():
                if time.monotonic() - last_wake >= self.wake_every_s:
                    self.state.wake_all()  # the bound on every env task's wait
                    last_wake = time.monotonic()
                try:
                    await self.refresh()
                    backoff.reset()
                except REDIS_ERRORS as exc:
                    await backoff.sleep(f"control poll failed: {exc}")
                    continue
                self._poke.clear()
                try:
                    await within(self._poke.wait(), self.poll_interval_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            await cancel_and_wait(listener)

    async def _listen(self, stop: asyncio.Event) -> None:
        """Subscribe to the control channel; every message triggers an immediate poll."""
        backoff = Backoff(name="control channel")
        while not stop.is_set():
            subscription = ControlSubscription(self._redis, self._keys.control)
            try:
                await subscription.open()
                self.subscribed.set()
                backoff.reset()
                while not stop.is_set():
                    data = await subscription.get(timeout_s=1.0)
                    if data is None:
                        continue
                    if data == LEASES_MESSAGE:
                        self.leases_changed.set()
                    else:
                        self._poke.set()
            except REDIS_ERRORS as exc:
                await backoff.sleep(f"subscribe failed: {exc}")
            finally:
                await subscription.close()
