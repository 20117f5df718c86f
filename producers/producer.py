"""The producer process: claims shards, runs every env of a shard as its own asyncio task.

Lifecycle: wait for the run's config in Redis, then loop `heartbeat -> rebalance` while env
tasks play episodes and a committer flushes their trajectories. SIGTERM/SIGINT set a flag;
the producer drops the steps in flight (their episodes replay elsewhere with the same seed),
flushes queued commits, releases its leases and exits 0. A second signal cancels at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from producers.commit import Committer, Outcome
from producers.control import (
    LEASES_MESSAGE,
    SYNC_WAKE_CHUNK,
    WAKE_CHUNK,
    ControlState,
    ControlWatcher,
)
from producers.envs import build_env
from producers.leases import Leases, ShardId, claim_order, fair_share
from producers.metrics import Held, ProducerStats
from producers.policies import Policy, PolicyContext, make_policy, start_policy
from producers.rollout import Abandoned, EnvSlot, InFlight, failed_trajectory, play_episode
from producers.stall import LoopWatch, stall_threshold_s
from producers.weights import WeightsFollower, takes_weights
from schemas.backoff import Backoff
from schemas.codec import encode_trajectory
from schemas.config import RolloutConfig
from schemas.errors import (
    ConfigError,
    EpisodeFailed,
    PolicyError,
    RedisSetupError,
    WorkerFailure,
)
from schemas.keys import Keys
from schemas.protocol import Schedule
from schemas.redisconn import (
    REDIS_ERRORS,
    AsyncClient,
    OwnerWatch,
    RedisUrlError,
    ReplicaWait,
    async_client,
    auth_message,
    bad_database,
    is_auth_error,
    mask_url,
    publish,
)
from schemas.repeats import Repeats
from schemas.stats import RECORD_MIN_INTERVAL_S, STATS_KEEP_S, MetricsServer

logger = logging.getLogger(__name__)

# A producer allocates a few small dicts per env step and frees nearly all of them by reference
# counting; at Python's default threshold (700) the cyclic collector ran ~70 times a second
# and took ~13% of a producer's CPU in bench/bench_pipeline.py. At 50,000 it runs a few times
# a minute, holding at most that many young objects (a few MB).
GC_THRESHOLD = (50_000, 20, 100)


def tune_gc() -> None:
    """For a process that is only a producer (`rollstream produce`): what exists at start
    (modules, config) is never collected, and the young generation is collected rarely."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)

SHORT_RECHECK_S = 0.5  # below the fair share (shards in motion): look again this soon
STOP_POLL_S = 0.5  # while the policy starts: how often the run's stop key is looked at
REFUSALS = {Outcome.DUPLICATE: "duplicate", Outcome.LEASE_LOST: "lease_lost",
            Outcome.PAUSED: "paused", Outcome.STALE_ROUND: "stale_round"}


def new_producer_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class ShardRun:
    """A shard this producer holds: its env slots and their tasks."""

    shard: ShardId
    slots: list[EnvSlot]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    draining: bool = False  # handing over: finish the episode in flight, then stop
    lease_lost: int = 0  # commits of its envs fenced off (logged at the first)


class Producer:
    """A producer process. `run()` blocks until stopped; `request_stop()` from anywhere."""

    def __init__(
        self,
        redis_url: str,
        run: str,
        *,
        max_shards: int | None = None,
        producer_id: str | None = None,
        handle_signals: bool = True,
        poll_interval_s: float = 0.2,
        seconds: float | None = None,
        policy: Policy | None = None,
    ):
        if max_shards is not None and max_shards < 1:
            raise ConfigError(f"--max-shards must be >= 1, got {max_shards}")
        self.redis_url = redis_url
        self.keys = Keys(run)
        self.max_shards = max_shards
        self.producer_id = producer_id or new_producer_id()
        self.handle_signals = handle_signals
        self.poll_interval_s = poll_interval_s
        self.seconds = seconds
        self._policy_override = policy
        self.shards: dict[ShardId, ShardRun] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._signalled = False  # a SIGINT/SIGTERM came: the next one forces the stop
        self._main_task: asyncio.Task[None] | None = None
        self._deadline: float | None = None  # monotonic time `seconds` runs out
        self._live = 0  # live producers at the last heartbeat (0: not joined yet)
        self.heartbeats = 0  # heartbeats done so far
        self._short_streak = 0  # heartbeats in a row that ended below the fair share
        self._handovers: set[asyncio.Task[None]] = set()
        self._releasing: set[ShardId] = set()  # shards being handed over, lease not yet freed
        self.stats = ProducerStats(self.producer_id)  # counters for status and /metrics
        self._repeats = Repeats(logger)  # an env failing every episode: not a line each
        self.stats.held = self._held
        self._metrics: MetricsServer | None = None
        self._reported_at = -RECORD_MIN_INTERVAL_S  # monotonic time of the last stats record

    # -- public ------------------------------------------------------------------------------
    @property
    def committed(self) -> int:
        """Trajectories this producer has committed (the committer counts them)."""
        committer = getattr(self, "committer", None)
        return committer.committed if committer is not None else 0

    def serve_metrics(self, port: int, addr: str = "0.0.0.0") -> MetricsServer:
        """Serve this producer's Prometheus metrics at `http://addr:port/metrics` until
        `close()` (port 0: any free port, `.port` says which)."""
        self._metrics = self.stats.serve(port, addr)
        return self._metrics

    def close(self) -> None:
        """Stop the metrics page, if any (`run()` does it when it ends)."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def run(self) -> int:
        """Run until stopped; returns the exit status (0 on a clean stop)."""
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> int:
        try:
            asyncio.run(self._main())
        except asyncio.CancelledError:
            logger.warning("producer %s: forced stop", self.producer_id)
            return 1
        except RedisUrlError as exc:  # the URL's form is checked before; this is what the
            logger.error("producer %s: %s", self.producer_id, exc)  # server says of it
            return 2
        except ConfigError as exc:
            logger.error("producer %s: the published config cannot run: %s",
                         self.producer_id, exc)
            return 1
        except (PolicyError, RedisSetupError, WorkerFailure) as exc:
            logger.error("producer %s: %s", self.producer_id, exc)
            return 1
        return 0

    def request_stop(self) -> None:
        """Ask the producer to stop (thread-safe; idempotent)."""
        self._stop_requested = True
        if self._loop is not None and self._stop is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # its loop is closed: the producer has already ended
                pass

    # -- main --------------------------------------------------------------------------------
    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._main_task = asyncio.current_task()
        if self._stop_requested:
            self._stop.set()
        if self.handle_signals:
            self._install_signals()
        self._deadline = None if self.seconds is None else time.monotonic() + self.seconds
        try:
            redis = await self._connect()
            if redis is None:
                return
            try:
                config = await self._wait_config(redis)
                if config is not None:
                    await self._serve(redis, config)
            finally:
                await redis.aclose()
        finally:
            if self.handle_signals:
                self._remove_signals()

    def _install_signals(self) -> None:
        assert self._loop is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(sig, self._on_signal, sig)

    def _remove_signals(self) -> None:
        assert self._loop is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        assert self._stop is not None
        if self._signalled and self._main_task is not None:
            self._main_task.cancel()  # second signal: stop now
            return
        # (a stop that came otherwise, `rollstream stop` or `seconds`, still ends cleanly)
        self._signalled = True
        logger.info("producer %s: %s, stopping", self.producer_id, signal.Signals(sig).name)
        self._stop.set()

    async def _connect(self) -> AsyncClient | None:
        """A client for the URL's deployment (one server, a cluster, Sentinel), retried while
        Redis is unreachable; None when stopped first. Wrong credentials end the producer."""
        assert self._stop is not None
        backoff = Backoff(name=f"producer {self.producer_id}")
        while not self._stop.is_set() and not self._out_of_time():
            try:
                return await async_client(self.redis_url, socket_timeout=10,
                                          socket_connect_timeout=5, health_check_interval=15)
            except REDIS_ERRORS as exc:
                self._refuse_setup(exc)
                await backoff.sleep(f"cannot read the config at {mask_url(self.redis_url)}: "
                                    f"{exc}")
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

    async def _wait_config(self, redis: AsyncClient) -> RolloutConfig | None:
        """The run's config once a trainer has published it; None when stopped first (or
        `seconds` ran out). Wrong credentials end the producer (`RedisSetupError`)."""
        assert self._stop is not None
        where = mask_url(self.redis_url)
        backoff = Backoff(name=f"producer {self.producer_id}")
        logged = False
        while not self._stop.is_set() and not self._out_of_time():
            try:
                raw = await redis.get(self.keys.config)
                backoff.reset()
            except REDIS_ERRORS as exc:
                self._refuse_setup(exc)
                await backoff.sleep(f"cannot read the config at {where}: {exc}")
                continue
            if raw is not None:
                return RolloutConfig.from_json(raw)
            if not logged:
                logger.info("producer %s: waiting for run %s's config at %s (a trainer "
                            "publishes it)", self.producer_id, self.keys.run, where)
                logged = True
            await self._sleep(0.5)
        return None

    def _out_of_time(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    async def _sleep(self, seconds: float) -> None:
        assert self._stop is not None
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _serve(self, redis: AsyncClient, config: RolloutConfig) -> None:
        assert self._stop is not None
        self.config = config
        self.policy: Policy = self._policy_override or make_policy(config.policy)
        started = await self._unless_stopped(start_policy(  # PolicyError: exit 1, one line
            self.policy, PolicyContext(redis=redis, keys=self.keys, config=config,
                                       producer_id=self.producer_id,
                                       poll_interval_s=self.poll_interval_s)), redis)
        if not started:  # e.g. waiting for model servers that never answered
            logger.info("producer %s: stopped while its policy was starting", self.producer_id)
            return
        # says so when a blocking act or env step holds the loop (and with it every env)
        watch = LoopWatch(stall_threshold_s(config.lease_ttl_s), name=self.producer_id,
                          lease_ttl_s=config.lease_ttl_s, on_stall=self.stats.loop_stalled)
        watch.start()
        try:
            await self._serve_shards(redis, config)
        finally:
            watch.stop()

    async def _serve_shards(self, redis: AsyncClient, config: RolloutConfig) -> None:
        assert self._stop is not None
        self.inflight = InFlight()  # awaited policy calls a pause, expiry or stop cuts short
        self.schedules = {m: Schedule(config.episodes_per_step(m), config.ratio)
                          for m in config.modes()}
        self.state = ControlState(SYNC_WAKE_CHUNK if config.is_sync else WAKE_CHUNK)
        watcher = ControlWatcher(redis, self.keys, self.state, self.poll_interval_s)
        self.watcher = watcher
        self.committer = Committer(redis, self.keys, self.producer_id, replicas=ReplicaWait(
            redis, self.keys, config.min_replicas, config.replica_timeout_ms))
        self.leases = Leases(redis, self.keys, self.producer_id, config.lease_ttl_s,
                             max_shards=self.max_shards)
        self.redis = redis
        self.owner = OwnerWatch(self.keys, f"producer {self.producer_id}")
        self.weights: WeightsFollower | None = None
        if takes_weights(self.policy):
            self.weights = WeightsFollower(redis, self.keys, self.policy, self.state,
                                           sync=config.is_sync,
                                           retry_s=self.poll_interval_s)
        await self._first_refresh(watcher)
        await self._first_weights()  # a late joiner acts with the newest weights at once
        background = [
            asyncio.create_task(watcher.run(self._stop, Backoff(name="control"))),
            asyncio.create_task(self.committer.run(self._stop, Backoff(name="commit"))),
            asyncio.create_task(self._interrupt_loop()),
        ]
        if self.weights is not None:
            background.append(asyncio.create_task(
                self.weights.run(self._stop, Backoff(name="weights"))))
        try:  # hear the others' lease announcements before taking part in the shard split
            await asyncio.wait_for(watcher.subscribed.wait(), 5.0)
        except asyncio.TimeoutError:
            logger.warning("control channel not subscribed after 5s; relying on heartbeats")
        self.owner.note(redis)
        logger.info("producer %s: serving run %s at %s (%s)", self.producer_id, self.keys.run,
                    mask_url(self.redis_url), self.owner.current)
        try:
            await self._lease_loop(background)
        finally:
            await self._shutdown(background)
            close = getattr(self.policy, "close", None)
            if close is not None:
                await close()
        if self.weights is not None and self.weights.error is not None:
            raise self.weights.error  # the policy refused its weights: exit 1 with that line

    async def _unless_stopped(self, step: Awaitable[None], redis: AsyncClient) -> bool:
        """Await `step` unless a stop comes first (then it is cancelled): a signal, `seconds`
        running out or the run's stop (`rollstream stop`). True when it ran to its end. Its
        errors propagate."""
        assert self._stop is not None
        task = asyncio.ensure_future(step)
        stopper = asyncio.ensure_future(self._stop_before_start(redis))
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            return False
        task.result()
        return True

    async def _stop_before_start(self, redis: AsyncClient) -> None:
        """Returns once the producer should not start after all: the control loop, which
        watches the run's stop and the deadline later on, does not run yet."""
        assert self._stop is not None
        while not self._stop.is_set() and not self._out_of_time():
            try:
                if await redis.exists(self.keys.stop):
                    logger.info("producer %s: run %s was stopped", self.producer_id,
                                self.keys.run)
                    return
            except REDIS_ERRORS:
                pass  # Redis away: the signal and the deadline still end the wait
            left = None if self._deadline is None else self._deadline - time.monotonic()
            await self._sleep(STOP_POLL_S if left is None else max(0.0, min(STOP_POLL_S, left)))

    async def _first_refresh(self, watcher: ControlWatcher) -> None:
        assert self._stop is not None
        backoff = Backoff(name="control")
        while not self._stop.is_set():
            try:
                await watcher.refresh()
                return
            except REDIS_ERRORS as exc:
                await backoff.sleep(f"control read failed: {exc}")

    async def _first_weights(self) -> None:
        assert self._stop is not None
        backoff = Backoff(name="weights")
        while self.weights is not None and not self._stop.is_set():
            try:
                await self.weights.refresh()
                return
            except REDIS_ERRORS as exc:
                await backoff.sleep(f"weights fetch failed: {exc}")

    def _acting_version(self) -> int:
        """The version a step records: the weights' for a policy that takes weights."""
        return self.weights.version if self.weights is not None else self.state.version

    # -- leases ------------------------------------------------------------------------------
    def all_shards(self) -> list[ShardId]:
        return [(mode, s) for mode in self.config.modes()
                for s in range(self.config.manager(mode).num_shards)]

    async def _lease_loop(self, background: list[asyncio.Task[None]]) -> None:
        assert self._stop is not None
        backoff = Backoff(name="lease heartbeat")
        interval = self.config.lease_ttl_s / 3
        while not self._stop.is_set():
            self._check_background(background)
            if self.state.stopped:
                logger.warning("run %s was stopped (rollstream stop); exiting; a trainer that "
                               "starts the run again resumes it", self.keys.run)
                self._stop.set()
                break
            if self._out_of_time():
                self._stop.set()
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
            if self._deadline is not None:  # `seconds` ends it then, not at the next beat
                wait_s = min(wait_s, max(0.0, self._deadline - time.monotonic()))
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
        assert self._stop is not None
        waits = [asyncio.ensure_future(self._stop.wait()),
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

    def _held(self) -> Held:
        """What this producer holds now (read by the stats record and /metrics)."""
        held = Held()
        for (mode, _), run in list(self.shards.items()):
            held.shards[mode] = held.shards.get(mode, 0) + 1
            for slot in run.slots:
                held.envs[(mode, slot.tag)] = held.envs.get((mode, slot.tag), 0) + 1
        state = getattr(self, "state", None)
        if state is not None:
            held.version, held.paused = state.version, bool(state.paused)
        servers_down = getattr(getattr(self, "policy", None), "servers_down", None)
        if callable(servers_down):
            held.servers_down = servers_down()
        return held

    async def _announce_leases(self) -> None:
        """Tell the other producers to rebalance now (a join, a handover, a departure)."""
        await publish(self.redis, self.keys.control, LEASES_MESSAGE)

    async def _rebalance(self) -> bool:
        """Heartbeat, drop lost shards, hand over or claim to the fair share. True when short
        of the share: shards are on their way, look again soon."""
        beat = await self.leases.heartbeat(list(self.shards))
        self.heartbeats += 1
        if beat.live != self._live:
            if beat.live > self._live and self._live:
                logger.info("%d live producers now", beat.live)
            if self._live == 0:
                await self._announce_leases()  # joined: the others hand shards over now
            self._live = beat.live
        for shard in beat.lost:
            logger.warning("lease of shard %s lost; stopping its envs", shard)
            self._drop_shard(shard, cancel=True)
        target = fair_share(len(self.all_shards()), beat.caps, self.max_shards)
        active = [s for s, run in self.shards.items() if not run.draining]
        if len(active) > target:
            for shard in active[target:]:
                run = self.shards[shard]
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
        if self.shards.get(run.shard) is not run:
            return  # lost or stopped meanwhile
        self._drop_shard(run.shard, cancel=False)
        self._releasing.add(run.shard)  # a stop cancelling this release releases it again
        try:
            await self.leases.release([run.shard])
            self._releasing.discard(run.shard)
            await self._announce_leases()
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
        for shard in claim_order(self.all_shards(), self.producer_id):
            if wanted <= 0 or self._stopping or time.monotonic() > until:
                break
            if shard in self.shards:
                continue
            if await self.leases.try_claim(shard):
                try:
                    await self._start_shard(shard)
                except BaseException:
                    await self.leases.release([shard])  # not ours to keep if it cannot run
                    raise
                wanted -= 1
        return wanted

    async def _start_shard(self, shard: ShardId) -> None:
        mode, index = shard
        manager = self.config.manager(mode)
        env_ids = list(manager.envs_of_shard(index))
        cursors, val_round = await self.leases.read_start(mode, env_ids)
        slots = []
        for env_id, cursor in zip(env_ids, cursors, strict=True):
            group = manager.group_of_env(env_id)
            tag = manager.tag_of_group(group)
            slots.append(EnvSlot(
                mode=mode, env_id=env_id, group_id=group, member=manager.member_of_env(env_id),
                shard=index, tag=tag, env=build_env(self.config, tag),
                threaded=self.config.env_spec(tag).threaded,
                k=cursor, round=val_round if mode == "val" else 0,
            ))
        self.stats.resumed[mode] += sum(1 for c in cursors if int(c or 0) > 0)
        run = ShardRun(shard, slots)
        self.shards[shard] = run
        run.tasks = [asyncio.create_task(self._env_loop(run, slot)) for slot in slots]
        logger.info("claimed shard %s (%d envs)", shard, len(slots))

    def _drop_shard(self, shard: ShardId, *, cancel: bool) -> None:
        run = self.shards.pop(shard, None)
        if run is None:
            return
        if cancel:
            for task in run.tasks:
                task.cancel()
        for slot in run.slots:
            slot.env.close()

    # -- env loops ---------------------------------------------------------------------------
    @property
    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _leaving(self, run: ShardRun) -> bool:
        return self._stopping or run.draining or run.shard not in self.shards

    def _train_ready(self, slot: EnvSlot) -> bool:
        """May this train env start its next episode now? Moves it past expired episodes."""
        state = self.state
        version = state.version
        schedule = self.schedules["train"]
        slot.k = max(slot.k, schedule.first_live(version))
        return not state.paused and schedule.admitted(slot.k, version)

    def _val_ready(self, slot: EnvSlot) -> bool:
        """May this val env start its next episode now? A new round starts it at k = 0."""
        current = self.state.val_round
        if current != slot.round:
            slot.round, slot.k = current, 0
        return current != 0 and slot.k < self.schedules["val"].episodes_per_step

    async def _gate(self, run: ShardRun, slot: EnvSlot, k: int) -> bool:
        """Before each policy call: wait out a pause, and wait for weights new enough (sync:
        the run version's; async: the episode's step's); False to abandon."""
        state = self.state
        weights = self.weights
        while True:
            verdict = self._verdict(run, slot, k)
            if verdict is not None:
                return verdict
            if weights is not None and self._unweighted(slot, k):
                weights.holds += 1
            await state.wait_change()

    def _verdict(self, run: ShardRun, slot: EnvSlot, k: int) -> bool | None:
        """What the gate says now: True go on, False abandon the episode, None wait."""
        state = self.state
        unweighted = self._unweighted(slot, k)
        if self._leaving(run) and (state.paused or unweighted or self._stopping):
            return False  # the next owner replays the episode with the same seed
        if slot.mode == "val":
            if state.val_round != slot.round:
                return False
            return None if unweighted else True
        if self.schedules["train"].expired(k, state.version):
            return False
        return None if (state.paused or unweighted) else True

    def _unweighted(self, slot: EnvSlot, k: int) -> bool:
        """Must this step wait for newer weights? (Sync: the run version's; async: those of
        the step train episode `k` belongs to, so it is not handed out over-stale.)"""
        weights = self.weights
        if weights is None:
            return False
        floor = self.schedules["train"].create_step(k) if slot.mode == "train" else 0
        return weights.must_wait(self.state.version, floor)

    async def _interrupt_loop(self) -> None:
        """On every control change, cut short the policy calls in flight whose gate would
        no longer pass (a pause, the episode's expiry, a stop): their HTTP requests close,
        so the model servers are idle while the trainer updates them."""
        state = self.state
        while not self._stopping:
            await state.wait_change()
            hit = self.inflight.interrupt()
            if hit:
                logger.debug("%d policy calls in flight cut short", hit)

    async def _env_loop(self, run: ShardRun, slot: EnvSlot) -> None:
        """One env's task: when its next episode may start, play it and commit it; again.

        One coroutine from play to commit: every trajectory's task is resumed once by its
        commit's outcome, and each frame between the task and that await costs on every
        resume (measured with py-spy: the frames of this chain were ~10% of a producer)."""
        ready = self._train_ready if slot.mode == "train" else self._val_ready
        play_args = self._play_args(run, slot)
        seed = self.config.seed
        in_flight = self.stats.in_flight
        mode = slot.mode
        state = self.state
        committer = self.committer
        stream = self.keys.stream(mode, slot.group_id)  # an env's group never changes
        while not self._leaving(run):
            if not ready(slot):
                await state.wait_change()
                continue
            in_flight[mode] += 1
            try:
                k = slot.k
                try:  # the first attempt here, retries (an env that raised) in their own frame
                    traj: dict | None = await play_episode(slot, seed=seed, **play_args)
                except Abandoned:
                    traj = None
                except Exception as exc:  # not a cancellation: that is a BaseException
                    traj = await self._play_with_retries(run, slot, exc)
                if traj is None:
                    if self._give_up(run, slot, k):
                        continue
                    return
                data = encode_trajectory(traj)
                # keep what the counters need and let the trajectory go while its objects are
                # still in cache (a commit waits for its flush; freeing them cold after it,
                # measured with py-spy, was ~4% of a producer)
                failed, success = traj.get("failed", False), traj["success"]
                actions = traj["num_actions"]
                if "context_full" in traj:
                    self._context_full(slot, traj)
                traj = None
                while True:
                    outcome = await committer.submit(mode, slot.shard, slot.round, slot.env_id,
                                                      k, stream, data)
                    if outcome is Outcome.COMMITTED:
                        self.stats.committed(mode, slot.tag, failed, success, actions)
                    else:
                        self.stats.refused_commit(mode, REFUSALS[outcome])
                    if outcome is Outcome.COMMITTED or outcome is Outcome.DUPLICATE:
                        slot.k = k + 1
                        break
                    if outcome is Outcome.LEASE_LOST:
                        run.lease_lost += 1
                        if run.lease_lost == 1:  # its every env finds it: one line a shard
                            logger.warning("shard %s: lease lost at commit; its envs stop",
                                           run.shard)
                        return
                    if outcome is Outcome.STALE_ROUND:
                        break
                    # PAUSED: hold the trajectory; after the pause commit it unless it expired
                    if not await self._gate(run, slot, k):
                        if self._give_up(run, slot, k):
                            break
                        return
            finally:
                in_flight[mode] -= 1
                # let the bytes go before the next episode: this frame lives as long as the
                # env (the trajectory itself went once encoded)
                data = b""

    def _context_full(self, slot: EnvSlot, traj: dict[str, Any]) -> None:
        """An episode the model's context window ended: counted; the first one is logged."""
        if self.stats.context_full(slot.mode, slot.tag) == 1:
            logger.warning(
                "producer %s: episode %d of env %d (%s) ended truncated after %d turns: the "
                "conversation outgrew the model's context window (%s); it is committed with "
                "its turns (context_full in the trajectory), and later ones are only counted "
                "(rollstream_episodes_context_full_total)", self.producer_id, traj["episode_id"],
                slot.env_id, slot.tag, traj["num_actions"], traj["context_full"])

    def _give_up(self, run: ShardRun, slot: EnvSlot, k: int) -> bool:
        """Episode `k` was abandoned. Staying: move past it (True). Leaving: keep the cursor,
        so the next owner replays it with the same seed (False ends the env task)."""
        if self._leaving(run):
            self.stats.abandoned_episode(slot.mode, slot.tag, "leaving")
            return False
        self.stats.abandoned_episode(slot.mode, slot.tag, "expired")
        slot.k = k + 1
        return True

    def _play_args(self, run: ShardRun, slot: EnvSlot) -> dict[str, Any]:
        """`play_episode`'s arguments besides the slot and the seed."""
        return {
            "producer_id": self.producer_id, "policy": self.policy, "control": self.state,
            "gate": lambda: self._gate(run, slot, slot.k),
            "acting_version": self._acting_version, "inflight": self.inflight,
            "must_stop": lambda: self._verdict(run, slot, slot.k) is not True,
        }

    async def _play_with_retries(self, run: ShardRun, slot: EnvSlot,
                                 first: Exception) -> dict | None:
        """After the first attempt at episode `slot.k` raised `first`: the retries, with the
        same seed; a failed trajectory once they are used up (None: abandoned)."""
        attempts = self.config.env_max_retries + 1
        exc = first
        for attempt in range(attempts):
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, EpisodeFailed):  # retrying cannot help (a model server's 4xx)
                self._repeats.warning(f"env {slot.env_id} ({slot.tag}) episode {slot.k} "
                                      f"failed: {error}")
                break
            # an env bug must not kill the producer
            self.stats.env_error(slot.mode, slot.tag, retried=attempt + 1 < attempts)
            self._repeats.warning(f"env {slot.env_id} ({slot.tag}) episode {slot.k} raised "
                                  f"on attempt {attempt + 1}/{attempts}: {error}")
            if attempt + 1 == attempts:
                break
            try:
                return await play_episode(
                    slot, seed=self.config.seed, **self._play_args(run, slot))
            except Abandoned:
                return None
            except Exception as raised:  # not a cancellation: that is a BaseException
                exc = raised
        return failed_trajectory(slot, seed=self.config.seed, producer_id=self.producer_id,
                                 version=self.state.version, error=error)

    # -- shutdown ----------------------------------------------------------------------------
    async def _shutdown(self, background: list[asyncio.Task[None]]) -> None:
        assert self._stop is not None
        self._stop.set()
        self.state.wake_all()
        tasks = [task for run in self.shards.values() for task in run.tasks]
        tasks += list(self._handovers)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(asyncio.gather(*background, return_exceptions=True), 5.0)
        except asyncio.TimeoutError:
            logger.warning("producer %s: background tasks did not finish in 5s", self.producer_id)
        self.committer.fail_all(RuntimeError("producer stopped"))
        held = list(self.shards)
        for shard in held:
            self._drop_shard(shard, cancel=False)
        held += self._releasing  # handed over, but a stop cut their release short
        try:
            released = await self.leases.release(held)
            await self.leases.leave()
            await self._announce_leases()  # the others take the shards over now
            await self.leases.forget()  # left cleanly: not shown as gone
            logger.info("producer %s stopped: %d committed, %d leases released",
                        self.producer_id, self.committed, released)
        except REDIS_ERRORS as exc:
            logger.warning("producer %s: could not release leases (%s); they expire in %.0fs",
                           self.producer_id, exc, self.config.lease_ttl_s)
