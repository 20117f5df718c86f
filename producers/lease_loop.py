"""A producer's lease loop: heartbeat, fair share, claims and hand-overs, every third of the
lease ttl (sooner when another producer announces a change on the control channel).

Each round: renew the leases held (a lost one stops its shard's envs at once), learn how many
producers are live, and move toward the fair share (`producers.leases.fair_share`): claim free
shards when below it (a pass yields to the next heartbeat after a third of the ttl), hand
shards over when above it (their envs finish the episodes in flight, then the lease is freed
at once and the others are told). Below the share, look again soon, backing off. The stats
record is written beside the heartbeat. The loop ends on a stop, the run's stop, `seconds`
running out, or a background loop (control, commits, weights) dying of its own error.
"""

from __future__ import annotations

import asyncio
import logging
import time

from producers.control import LEASES_MESSAGE, ControlState, ControlWatcher
from producers.leases import Leases, ShardId, claim_order, fair_share
from producers.lifetime import Lifetime
from producers.metrics import ProducerStats
from producers.shard_runner import ShardRun, ShardRunner
from schemas.backoff import Backoff
from schemas.config import RolloutConfig
from schemas.errors import WorkerFailure
from schemas.keys import Keys
from schemas.redisconn import REDIS_ERRORS, AsyncClient, OwnerWatch, publish
from schemas.stats import RECORD_MIN_INTERVAL_S, STATS_KEEP_S

logger = logging.getLogger(__name__)

SHORT_RECHECK_S = 0.5  # below the fair share (shards in motion): look again this soon


class LeaseLoop:
    """Which shards this producer holds (see the module docstring); `runner` runs them."""

    def __init__(self, *, config: RolloutConfig, keys: Keys, redis: AsyncClient, leases: Leases,
                 runner: ShardRunner, state: ControlState, watcher: ControlWatcher,
                 owner: OwnerWatch, stats: ProducerStats, life: Lifetime,
                 max_shards: int | None):
        self.config = config
        self.keys = keys
        self.redis = redis
        self.leases = leases
        self.runner = runner
        self.state = state
        self.watcher = watcher
        self.owner = owner
        self.stats = stats
        self.life = life
        self.max_shards = max_shards
        self.heartbeats = 0  # heartbeats done so far
        self._live = 0  # live producers at the last heartbeat (0: not joined yet)
        self._short_streak = 0  # heartbeats in a row that ended below the fair share
        self._handovers: set[asyncio.Task[None]] = set()
        self._releasing: set[ShardId] = set()  # shards being handed over, lease not yet freed
        self._reported_at = -RECORD_MIN_INTERVAL_S  # monotonic time of the last stats record

    @property
    def _stopping(self) -> bool:
        """Stopped, or out of `seconds`: no more claims (a claim pass may outlast the deadline
        by a third of the lease ttl otherwise)."""
        return self.life.stop.is_set() or self.life.out_of_time()

    def all_shards(self) -> list[ShardId]:
        return [(mode, s) for mode in self.config.modes()
                for s in range(self.config.manager(mode).num_shards)]

    async def run(self, background: list[asyncio.Task[None]]) -> None:
        stop = self.life.stop
        backoff = Backoff(name="lease heartbeat")
        interval = self.config.lease_ttl_s / 3
        while not stop.is_set():
            self._check_background(background)
            if self.state.stopped:
                logger.warning("run %s was stopped (rollstream stop); exiting; a trainer that "
                               "starts the run again resumes it", self.keys.run)
                stop.set()
                break
            if self.life.out_of_time():
                stop.set()
                break
            self.watcher.leases_changed.clear()
            try:
                short = await self._rebalance()
                await self._report()
                backoff.reset()
            except REDIS_ERRORS as exc:
                await backoff.sleep(f"heartbeat failed: {exc}")
                continue
            self.owner.note(self.redis)  # one line when the run's node changed
            # short of the share: shards are moving, look again soon (backing off, in case
            # there are simply more producers than shards)
            self._short_streak = self._short_streak + 1 if short else 0
            wait_s = SHORT_RECHECK_S * 2 ** (self._short_streak - 1) if short else interval
            if self.life.deadline is not None:  # `seconds` ends it then, not at the next beat
                wait_s = min(wait_s, max(0.0, self.life.deadline - time.monotonic()))
            await self._wait_rebalance(min(interval, wait_s))

    @staticmethod
    def _check_background(background: list[asyncio.Task[None]]) -> None:
        """A background loop ended on an error of its own (not a Redis error, which it
        retries): stop rather than run on without control updates or commits."""
        for task in background:
            if task.done() and not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                name = getattr(task.get_coro(), "__qualname__", task.get_name())
                raise WorkerFailure(f"{name} failed: {type(exc).__name__}: {exc}") from exc

    async def _wait_rebalance(self, timeout_s: float) -> None:
        """Until the next heartbeat, or sooner when another producer changes the leases."""
        waits = [asyncio.ensure_future(self.life.stop.wait()),
                 asyncio.ensure_future(self.watcher.leases_changed.wait())]
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waits:
            waiter.cancel()

    async def _report(self) -> None:
        """The stats record beside the heartbeat (at most every `RECORD_MIN_INTERVAL_S`)."""
        now = time.monotonic()
        if now - self._reported_at < RECORD_MIN_INTERVAL_S:
            return
        self._reported_at = now
        await self.leases.report(self.stats.record().encode(), STATS_KEEP_S)

    async def announce(self) -> None:
        """Tell the other producers to rebalance now (a join, a handover, a departure)."""
        await publish(self.redis, self.keys.control, LEASES_MESSAGE)

    async def _rebalance(self) -> bool:
        """Heartbeat, drop lost shards, hand over or claim to the fair share. True when short
        of the share: shards are on their way, look again soon."""
        shards = self.runner.shards
        beat = await self.leases.heartbeat(list(shards))
        self.heartbeats += 1
        if beat.live != self._live:
            if beat.live > self._live and self._live:
                logger.info("%d live producers now", beat.live)
            if self._live == 0:
                await self.announce()  # joined: the others hand shards over now
            self._live = beat.live
        for shard in beat.lost:
            logger.warning("lease of shard %s lost; stopping its envs", shard)
            self.runner.drop_shard(shard, cancel=True)
        target = fair_share(len(self.all_shards()), beat.caps, self.max_shards)
        active = [s for s, run in shards.items() if not run.draining]
        if len(active) > target:
            for shard in active[target:]:
                run = shards[shard]
                run.draining = True
                task = asyncio.create_task(self._hand_over(run))
                self._handovers.add(task)
                task.add_done_callback(self._handovers.discard)
            self.state.wake_all()
        elif len(active) < target and not self._stopping:
            return await self._claim(target - len(active)) > 0
        return False

    async def _hand_over(self, run: ShardRun) -> None:
        """Once the shard's envs have finished their episodes in flight, release it at once
        and tell the others, so the shard is idle for milliseconds, not heartbeats."""
        await asyncio.gather(*run.tasks, return_exceptions=True)
        if self.runner.shards.get(run.shard) is not run:
            return  # lost or stopped meanwhile
        self.runner.drop_shard(run.shard, cancel=False)
        self._releasing.add(run.shard)  # a stop cancelling this release releases it again
        try:
            await self.leases.release([run.shard])
            self._releasing.discard(run.shard)
            await self.announce()
            logger.info("handed over shard %s", run.shard)
        except REDIS_ERRORS as exc:
            logger.warning("could not release shard %s (%s); it frees in %.0fs", run.shard,
                           exc, self.config.lease_ttl_s)

    async def _claim(self, wanted: int) -> int:
        """Claim up to `wanted` free shards; returns how many it could not get.

        A pass ends after a third of the lease ttl, claimed or not: building envs takes
        time (and the envs already started run between claims), and the leases claimed
        first must be renewed by the next heartbeat before they expire. Measured: one
        producer claiming 256 shards of 64 envs took longer than a 30 s ttl and lost its
        first leases while still claiming. The rest is claimed after that heartbeat."""
        until = time.monotonic() + self.config.lease_ttl_s / 3
        for shard in claim_order(self.all_shards(), self.leases.producer_id):
            if wanted <= 0 or self._stopping or time.monotonic() > until:
                break
            if shard in self.runner.shards:
                continue
            if await self.leases.try_claim(shard):
                try:
                    await self.runner.start_shard(shard)
                except BaseException:
                    await self.leases.release([shard])  # not ours to keep if it cannot run
                    raise
                wanted -= 1
        return wanted

    # -- shutdown ----------------------------------------------------------------------------
    def handover_tasks(self) -> list[asyncio.Task[None]]:
        return list(self._handovers)

    async def leave(self, held: list[ShardId]) -> int:
        """At shutdown: release the leases of `held` and of shards whose hand-over a stop cut
        short, leave the producer set and tell the others (they take the shards over now).
        Returns how many leases were released; Redis errors propagate."""
        held += self._releasing  # handed over, but a stop cut their release short
        released = await self.leases.release(held)
        await self.leases.leave()
        await self.announce()  # the others take the shards over now
        await self.leases.forget()  # left cleanly: not shown as gone
        return released
