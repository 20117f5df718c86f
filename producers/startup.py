"""A producer before it serves: a Redis client, the run's config, the policy started.

Each step waits as long as it must (Redis unreachable: capped backoff; no config yet: a trainer
publishes it; model servers not answering: the policy's start waits) and ends early on a stop:
a signal, `seconds` running out, or the run's stop (`rollstream stop`). What no retry mends
ends the producer: wrong credentials (`RedisSetupError`), a database the server lacks
(`RedisUrlError`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

from producers.lifetime import Lifetime, cancel_and_wait
from schemas.backoff import Backoff
from schemas.config import RolloutConfig
from schemas.errors import RedisSetupError
from schemas.keys import Keys
from schemas.redisconn import (
    REDIS_ERRORS,
    AsyncClient,
    async_client,
    auth_message,
    bad_database,
    is_auth_error,
    mask_url,
)

logger = logging.getLogger(__name__)

STOP_POLL_S = 0.5  # while the policy starts: how often the run's stop key is looked at


class Startup:
    """The steps before a producer serves, each ending early on a stop (see the module)."""

    def __init__(self, redis_url: str, keys: Keys, producer_id: str, life: Lifetime):
        self.redis_url = redis_url
        self.keys = keys
        self.producer_id = producer_id
        self.life = life

    async def connect(self) -> AsyncClient | None:
        """A client for the URL's deployment (one server, a cluster, Sentinel), retried while
        Redis is unreachable; None when stopped first. Wrong credentials end the producer."""
        life = self.life
        backoff = Backoff(name=f"producer {self.producer_id}")
        while not life.stop.is_set() and not life.out_of_time():
            try:
                return await async_client(self.redis_url, socket_timeout=10,
                                          socket_connect_timeout=5, health_check_interval=15)
            except REDIS_ERRORS as exc:
                self._refuse_setup(exc)
                await backoff.sleep(f"cannot read the config at {mask_url(self.redis_url)}: "
                                    f"{exc}", life.sleep)
        return None

    def _refuse_setup(self, exc: BaseException) -> None:
        """Errors at start that no retry mends: wrong credentials (`RedisSetupError`), a
        database the server lacks (`RedisUrlError`: a unix:// URL's SELECT is refused only
        once the server is up, which may be after the producer started)."""
        if is_auth_error(exc):
            raise RedisSetupError(auth_message(self.redis_url)) from None
        refused = bad_database(self.redis_url, exc)
        if refused is not None:
            raise refused from None

    async def wait_config(self, redis: AsyncClient) -> RolloutConfig | None:
        """The run's config once a trainer has published it; None when stopped first (or
        `seconds` ran out). Wrong credentials end the producer (`RedisSetupError`)."""
        life = self.life
        where = mask_url(self.redis_url)
        backoff = Backoff(name=f"producer {self.producer_id}")
        logged = False
        while not life.stop.is_set() and not life.out_of_time():
            try:
                raw = await redis.get(self.keys.config)
                backoff.reset()
            except REDIS_ERRORS as exc:
                self._refuse_setup(exc)
                await backoff.sleep(f"cannot read the config at {where}: {exc}", life.sleep)
                continue
            if raw is not None:
                return RolloutConfig.from_json(raw)
            if not logged:
                logger.info("producer %s: waiting for run %s's config at %s (a trainer "
                            "publishes it)", self.producer_id, self.keys.run, where)
                logged = True
            await life.sleep(0.5)
        return None

    async def unless_stopped(self, step: Awaitable[None], redis: AsyncClient) -> bool:
        """Await `step` unless a stop comes first (then it is cancelled): a signal, `seconds`
        running out or the run's stop (`rollstream stop`). True when it ran to its end. Its
        errors propagate."""
        task = asyncio.ensure_future(step)
        stopper = asyncio.ensure_future(self._stop_before_start(redis))
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()  # (it ends by itself too: the stop or the deadline)
            if not task.done():
                await cancel_and_wait(task)
        if task.cancelled():
            return False
        task.result()
        return True

    async def _stop_before_start(self, redis: AsyncClient) -> None:
        """Returns once the producer should not start after all: the control loop, which
        watches the run's stop and the deadline later on, does not run yet."""
        life = self.life
        while not life.stop.is_set() and not life.out_of_time():
            try:
                if await redis.exists(self.keys.stop):
                    logger.info("producer %s: run %s was stopped", self.producer_id,
                                self.keys.run)
                    return
            except REDIS_ERRORS:
                pass  # Redis away: the signal and the deadline still end the wait
            left = None if life.deadline is None else life.deadline - time.monotonic()
            await life.sleep(STOP_POLL_S if left is None else max(0.0, min(STOP_POLL_S, left)))
