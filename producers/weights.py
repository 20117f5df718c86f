"""Policy weights by version: fetched from Redis once per producer and handed to the policy.

The trainer publishes weights for version v at `{RUN}:weights:v` (`Batcher.publish_version(
weights=...)`). A policy that learns through the stream has `set_weights(version, decoded)`
and, optionally, `decode_weights(data) -> decoded` (pure, may be slow: it runs in a worker
thread, off the event loop); without `decode_weights` it is handed the bytes. A policy
without `set_weights` ignores weights.

One `WeightsFollower` per producer watches the run's version: when it moves past the version
the policy holds, the follower GETs the newest weights at or below it (in async mode an older
version may be all there is yet), decodes them off the loop and sets them, once for all the
producer's envs. Every step records `version` (the weights that chose it; 0 = the factory's
weights when nothing was loaded). In sync mode (`async_generation_ratio: 0`) a step waits
until the policy holds the run's version (`must_wait`): a step stamped older would be dropped
as stale. In async mode a train episode waits only until the follower has looked for the
weights of the step it belongs to (`create(k)`, at most the run's version) and loaded what it
found: admitted by a version whose weights are still loading, it would otherwise start with
older ones and reach the trainer more than `ratio` versions stale. A version published without
weights has none coming (`publish_version` writes both at once): its episodes go on with the
newest there are. Episodes already under way go on with the weights at hand.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from producers.control import ControlState
from producers.lifetime import within
from producers.policies.protocol import one_line
from producers.rollout import in_daemon_thread
from schemas.backoff import Backoff
from schemas.errors import PolicyError
from schemas.keys import Keys
from schemas.redisconn import REDIS_ERRORS, AsyncClient

logger = logging.getLogger(__name__)

LOOKBACK_VERSIONS = 8  # older versions looked at when the run's version has no weights (yet)
MISSING_WARN_S = 10.0  # warn when the run's version has had no weights for this long


def takes_weights(policy: Any) -> bool:
    """Whether a policy learns through the stream (it has `set_weights`)."""
    return callable(getattr(policy, "set_weights", None))


class WeightsFollower:
    """Keeps a policy's weights at the run's version; `run()` is the producer's one task."""

    def __init__(self, redis: AsyncClient, keys: Keys, policy: Any, state: ControlState, *,
                 sync: bool, retry_s: float = 0.2):
        self._redis = redis
        self._keys = keys
        self._policy = policy
        self._decode = getattr(policy, "decode_weights", None)
        self.state = state
        self.sync = sync
        self.retry_s = retry_s  # look again this soon while the run's version has no weights
        self.version = 0  # the version of the weights the policy acts with (0: the factory's)
        self.loads = 0  # weights set on the policy
        self.holds = 0  # times a step was held back waiting for weights (sync mode)
        self.error: PolicyError | None = None  # the policy refused weights: the producer exits
        self._first = True
        self.looked = -1  # the run version of the last look for weights (what it found loaded)
        self._missing: tuple[int, float] | None = None  # (version, since) without weights
        self._warned = -1

    def must_wait(self, run_version: int, floor: int = 0) -> bool:
        """Hold the step until the policy's weights are new enough. Sync mode: the run
        version's. Async mode: what Redis holds for `floor`, the step its episode belongs to
        (`create(k)`): the newest weights at or below it, once the follower has looked for
        them (and loaded them). A version's weights are written with the version itself
        (`publish_version`), so a version without weights has none coming: its episodes go
        on with the newest there are, as the trainer left them."""
        return self.version < run_version if self.sync else self.looked < floor

    async def run(self, stop: asyncio.Event, backoff: Backoff) -> None:
        """Follow the version until `stop`; a `PolicyError` sets `error` and `stop`."""
        while not stop.is_set():
            try:
                behind = not await self.refresh()
                backoff.reset()
            except REDIS_ERRORS as exc:
                await backoff.sleep(f"weights fetch failed: {exc}")
                continue
            except PolicyError as exc:
                self.error = exc
                stop.set()
                return
            if behind:  # published later (or never): look again soon, not only on a change
                try:
                    await within(self.state.wait_change(), self.retry_s)
                except asyncio.TimeoutError:
                    pass
            else:
                await self.state.wait_change()

    async def refresh(self) -> bool:
        """Load the newest weights at or below the run's version that are newer than the
        policy's. True when the policy holds the run version's weights (or nothing newer can
        exist); False when that version has no weights in Redis yet."""
        target = self.state.version
        lowest = -1 if self._first else self.version  # the first look includes version 0
        # newer than ours, newest first (none when we hold the run's version: no round trip)
        candidates = list(range(target, max(lowest, target - LOOKBACK_VERSIONS), -1))
        found = await self._newest(candidates)
        self._first = False
        if found is not None:
            await self._load(*found)  # wakes the envs: they act with them from their next step
        if target > self.looked:
            self.looked = target
            if found is None:
                self.state.wake_all()  # episodes waiting for this look go on with what is held
        if self.version >= target or target == 0:
            self._missing = None
            return True
        self._note_missing(target)
        return False

    async def _newest(self, candidates: list[int]) -> tuple[int, bytes] | None:
        """(version, data) of the first candidate with weights: one round trip, two when
        only an older version has them."""
        if not candidates:
            return None
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._keys.weights(candidates[0]))
        for version in candidates[1:]:
            pipe.exists(self._keys.weights(version))
        data, *exists = await pipe.execute()
        if data is not None:
            return candidates[0], data
        for version, there in zip(candidates[1:], exists, strict=True):
            if there:
                older: Any = await self._redis.get(self._keys.weights(version))
                return (version, older) if older is not None else None  # None: just deleted
        return None

    async def _load(self, version: int, data: bytes) -> None:
        key = self._keys.weights(version)
        try:
            decoded = await in_daemon_thread(self._decode, data) if self._decode else data
        except Exception as exc:
            raise PolicyError(f"policy.decode_weights failed on {key} ({len(data)} bytes): "
                              f"{one_line(exc)}") from None
        try:
            self._policy.set_weights(version, decoded)
        except Exception as exc:
            raise PolicyError(f"policy.set_weights failed on {key}: {one_line(exc)}") from None
        self.version = version
        self.loads += 1
        logger.info("policy weights of version %d loaded (%d bytes)", version, len(data))
        self.state.wake_all()  # running episodes act with them from their next step

    def _note_missing(self, target: int) -> None:
        now = time.monotonic()
        if self._missing is None or self._missing[0] != target:
            self._missing = (target, now)
            return
        waited_s = now - self._missing[1]
        if waited_s >= MISSING_WARN_S and self._warned != target:
            self._warned = target
            what = ("sync mode waits for them" if self.sync
                    else f"acting with version {self.version}'s")
            logger.warning("run version %d has no weights at %s after %.0fs (%s); a trainer "
                           "of this policy publishes them: publish_version(weights=...)",
                           target, self._keys.weights(target), waited_s, what)
