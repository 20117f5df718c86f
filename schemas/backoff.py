"""Capped exponential backoff for Redis connection errors (never a crash loop)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)


class Backoff:
    """`await backoff.sleep(reason)` waits base, 2*base, ... up to cap (with jitter)."""

    def __init__(self, base_s: float = 0.1, cap_s: float = 5.0, *, name: str = "redis"):
        self.base_s = base_s
        self.cap_s = cap_s
        self.name = name
        self.failures = 0

    def reset(self) -> None:
        if self.failures:
            logger.info("%s: reconnected after %d failed attempts", self.name, self.failures)
        self.failures = 0

    def next_delay(self) -> float:
        delay = min(self.cap_s, self.base_s * (2 ** min(self.failures, 30)))
        self.failures += 1
        return delay * random.uniform(0.5, 1.0)

    async def sleep(self, reason: str,
                    sleeper: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """Wait the next delay with `sleeper` (a producer's `Lifetime.sleep`: cut short by its
        stop and its deadline)."""
        delay = self.next_delay()
        logger.warning("%s: %s; retrying in %.2fs", self.name, reason, delay)
        await sleeper(delay)

    def sleep_sync(self, reason: str, max_s: float | None = None) -> None:
        delay = self.next_delay()
        if max_s is not None:
            delay = max(0.0, min(delay, max_s))
        logger.warning("%s: %s; retrying in %.2fs", self.name, reason, delay)
        time.sleep(delay)
