"""A producer serving a run: its parts wired, its background loops, and its shutdown.

The parts: the control state and its watcher (version, pause, val round, stop), the committer,
the leases, the weights follower (for a policy that takes weights), the shard runner
(`producers.shard_runner`) and the lease loop (`producers.lease_loop`). `run()` reads the
control state and the weights once, starts the background loops (control, commits, the
interrupt of policy calls on a control change, weights), runs the lease loop until a stop,
then shuts down: the env tasks are cancelled (their episodes replay elsewhere with the same
seed), queued commits flushed, the leases released and the policy closed.
"""

from __future__ import annotations

import asyncio
import logging

from producers.commit import Committer
from producers.control import SYNC_WAKE_CHUNK, WAKE_CHUNK, ControlState, ControlWatcher
from producers.lease_loop import LeaseLoop
from producers.leases import Leases
from producers.lifetime import Lifetime, cancel_and_wait, within
from producers.metrics import ProducerStats
from producers.policies.protocol import Policy
from producers.rollout import InFlight
from producers.shard_runner import ShardRunner
from producers.weights import WeightsFollower, takes_weights
from schemas.backoff import Backoff
from schemas.config import RolloutConfig
from schemas.keys import Keys
from schemas.redisconn import REDIS_ERRORS, AsyncClient, OwnerWatch, ReplicaWait, mask_url

logger = logging.getLogger(__name__)


class Serving:
    """One producer's parts for one run (see the module docstring); `run()` once."""

    def __init__(self, redis: AsyncClient, config: RolloutConfig, *, keys: Keys,
                 producer_id: str, policy: Policy, stats: ProducerStats, life: Lifetime,
                 max_shards: int | None, poll_interval_s: float, redis_url: str):
        self.redis = redis
        self.config = config
        self.keys = keys
        self.producer_id = producer_id
        self.policy = policy
        self.life = life
        self.redis_url = redis_url
        self.inflight = InFlight()  # awaited policy calls a pause, expiry or stop cuts short
        self.schedules = {m: config.schedule(m) for m in config.modes()}
        self.state = ControlState(SYNC_WAKE_CHUNK if config.is_sync else WAKE_CHUNK)
        self.watcher = ControlWatcher(redis, keys, self.state, poll_interval_s)
        self.committer = Committer(redis, keys, producer_id, replicas=ReplicaWait(
            redis, keys, config.min_replicas, config.replica_timeout_ms),
            sample_stream_len=config.sample_stream_len)
        self.leases = Leases(redis, keys, producer_id, config.lease_ttl_s,
                             max_shards=max_shards)
        self.owner = OwnerWatch(keys, f"producer {producer_id}")
        self.weights: WeightsFollower | None = None
        if takes_weights(policy):
            self.weights = WeightsFollower(redis, keys, policy, self.state,
                                           sync=config.is_sync, retry_s=poll_interval_s)
        self.runner = ShardRunner(
            config=config, keys=keys, producer_id=producer_id, policy=policy, state=self.state,
            schedules=self.schedules, weights=self.weights, inflight=self.inflight,
            committer=self.committer, leases=self.leases, stats=stats, stop=life.stop)
        self.lease_loop = LeaseLoop(
            config=config, keys=keys, redis=redis, leases=self.leases, runner=self.runner,
            state=self.state, watcher=self.watcher, owner=self.owner, stats=stats, life=life,
            max_shards=max_shards)

    async def run(self) -> None:
        stop = self.life.stop
        watcher = self.watcher
        await self._first_refresh()
        await self._first_weights()  # a late joiner acts with the newest weights at once
        background = [
            asyncio.create_task(watcher.run(stop, Backoff(name="control"))),
            asyncio.create_task(self.committer.run(stop, Backoff(name="commit"))),
            asyncio.create_task(self.runner.interrupt_loop()),
        ]
        if self.weights is not None:
            background.append(asyncio.create_task(
                self.weights.run(stop, Backoff(name="weights"))))
        try:  # hear the others' lease announcements before taking part in the shard split
            await within(watcher.subscribed.wait(), 5.0)
        except asyncio.TimeoutError:
            logger.warning("control channel not subscribed after 5s; relying on heartbeats")
        self.owner.note(self.redis)
        logger.info("producer %s: serving run %s at %s (%s)", self.producer_id, self.keys.run,
                    mask_url(self.redis_url), self.owner.current)
        try:
            await self.lease_loop.run(background)
        finally:
            await self._shutdown(background)
            close = getattr(self.policy, "close", None)
            if close is not None:
                await close()
        if self.weights is not None and self.weights.error is not None:
            raise self.weights.error  # the policy refused its weights: exit 1 with that line

    async def _first_refresh(self) -> None:
        stop = self.life.stop
        backoff = Backoff(name="control")
        while not stop.is_set():
            try:
                await self.watcher.refresh()
                return
            except REDIS_ERRORS as exc:
                await backoff.sleep(f"control read failed: {exc}")

    async def _first_weights(self) -> None:
        stop = self.life.stop
        backoff = Backoff(name="weights")
        while self.weights is not None and not stop.is_set():
            try:
                await self.weights.refresh()
                return
            except REDIS_ERRORS as exc:
                await backoff.sleep(f"weights fetch failed: {exc}")

    async def _shutdown(self, background: list[asyncio.Task[None]]) -> None:
        self.life.stop.set()
        self.state.wake_all()
        tasks = self.runner.tasks() + self.lease_loop.handover_tasks()
        await cancel_and_wait(*tasks)
        try:
            await asyncio.wait_for(asyncio.gather(*background, return_exceptions=True), 5.0)
        except asyncio.TimeoutError:
            logger.warning("producer %s: background tasks did not finish in 5s", self.producer_id)
        self.committer.fail_all(RuntimeError("producer stopped"))
        held = self.runner.drop_all()
        try:
            released = await self.lease_loop.leave(held)
            logger.info("producer %s stopped: %d committed, %d leases released",
                        self.producer_id, self.committer.committed, released)
        except REDIS_ERRORS as exc:
            logger.warning("producer %s: could not release leases (%s); they expire in %.0fs",
                           self.producer_id, exc, self.config.lease_ttl_s)
