"""The producer process: claims shards, runs every env of a shard as its own asyncio task.

Lifecycle: wait for the run's config in Redis, then loop `heartbeat -> rebalance` while env
tasks play episodes and a committer flushes their trajectories. SIGTERM/SIGINT set a flag;
the producer drops the steps in flight (their episodes replay elsewhere with the same seed),
flushes queued commits, releases its leases and exits 0. A second signal cancels at once.

`Producer` is the facade (`run`, `request_stop`, `close`, signals, the metrics page, exit
statuses) over modules found by name:
- `producers.startup`: connect to Redis, wait for the config, start the policy unless stopped;
- `producers.serving`: the parts wired for the run, the background loops, the shutdown;
- `producers.lease_loop`: heartbeat, fair share, claims and hand-overs;
- `producers.shard_runner`: the env loops of the shards held (admission, retries, commits).
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

from producers.commit import Committer
from producers.control import ControlState, ControlWatcher
from producers.lifetime import Lifetime
from producers.metrics import Held, ProducerStats
from producers.policies import Policy, PolicyContext, make_policy, start_policy
from producers.serving import Serving
from producers.stall import LoopWatch, stall_threshold_s
from producers.startup import Startup
from producers.weights import WeightsFollower
from schemas.config import RolloutConfig
from schemas.errors import ConfigError, PolicyError, RedisSetupError, WorkerFailure
from schemas.keys import Keys
from schemas.redisconn import AsyncClient, RedisUrlError
from schemas.stats import MetricsServer

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


def new_producer_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


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
        self.policy: Policy | None = None  # the run's policy, once its config is read
        self.config: RolloutConfig | None = None
        self._startup: Startup | None = None  # the steps before serving, once running
        self._serving: Serving | None = None  # the parts serving the run, once started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._signalled = False  # a SIGINT/SIGTERM came: the next one forces the stop
        self._main_task: asyncio.Task[None] | None = None
        self.stats = ProducerStats(self.producer_id)  # counters for status and /metrics
        self.stats.held = self._held
        self._metrics: MetricsServer | None = None

    # -- public ------------------------------------------------------------------------------
    @property
    def committed(self) -> int:
        """Trajectories this producer has committed (the committer counts them)."""
        committer = self.committer
        return committer.committed if committer is not None else 0

    # the parts serving the run (`producers.serving`), once it is served (None before)
    @property
    def state(self) -> ControlState | None:
        return self._serving.state if self._serving is not None else None

    @property
    def watcher(self) -> ControlWatcher | None:
        return self._serving.watcher if self._serving is not None else None

    @property
    def committer(self) -> Committer | None:
        return self._serving.committer if self._serving is not None else None

    @property
    def weights(self) -> WeightsFollower | None:
        return self._serving.weights if self._serving is not None else None

    @property
    def heartbeats(self) -> int:
        """Heartbeats done so far."""
        return self._serving.lease_loop.heartbeats if self._serving is not None else 0

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
        deadline = None if self.seconds is None else time.monotonic() + self.seconds
        life = Lifetime(self._stop, deadline)
        startup = self._startup = Startup(self.redis_url, self.keys, self.producer_id, life)
        try:
            redis = await startup.connect()
            if redis is None:
                return
            try:
                config = await startup.wait_config(redis)
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

    async def _serve(self, redis: AsyncClient, config: RolloutConfig) -> None:
        startup = self._startup
        assert startup is not None
        self.config = config
        policy = self.policy = self._policy_override or make_policy(config.policy)
        started = await startup.unless_stopped(start_policy(  # PolicyError: exit 1, one line
            policy, PolicyContext(redis=redis, keys=self.keys, config=config,
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
            self._serving = Serving(
                redis, config, keys=self.keys, producer_id=self.producer_id, policy=policy,
                stats=self.stats, life=startup.life, max_shards=self.max_shards,
                poll_interval_s=self.poll_interval_s, redis_url=self.redis_url)
            await self._serving.run()
        finally:
            watch.stop()

    def _held(self) -> Held:
        """What this producer holds now (read by the stats record and /metrics)."""
        held = Held()
        serving = self._serving
        if serving is not None:
            for (mode, _), run in list(serving.runner.shards.items()):
                held.shards[mode] = held.shards.get(mode, 0) + 1
                for slot in run.slots:
                    held.envs[(mode, slot.tag)] = held.envs.get((mode, slot.tag), 0) + 1
            state = serving.state
            held.version, held.paused = state.version, bool(state.paused)
        servers_down = getattr(self.policy, "servers_down", None)
        if callable(servers_down):
            held.servers_down = servers_down()
        return held
