"""The batcher: reads trajectory streams with a consumer group and hands out complete groups.

`get_batch` reads with XREADGROUP (finite BLOCK, stream order rotated for fairness) until
enough groups are complete, then returns the oldest-episode-first complete groups: a straggler
never holds back groups that are done. Entries stay pending until `ack`, so a trainer that
dies before acking gets the same batch from a restarted Batcher (its own pending entries are
read again with id 0, and the handed-out batch is recorded under `{RUN}:inflight:...`).

The client may be a `Redis`, a `RedisCluster`, a Sentinel-made client or a URL; connection
errors, failovers and slots on the move are retried with backoff (`get_batch` until its
timeout, `ack` and `publish_version` for `write_timeout_s`), and with `min_replicas` an ack
or a version publish returns only once replicas have it.

`Batcher` is the public face; the work is done by its parts, each in its own module:
`waiting` (one get_batch call), `assembly` (reading entries into groups, staleness, the
group filters of `filters` judging what a batch takes),
`handout` (batches out, acks), `liveness` (the batcher's name, claims of a dead one's
entries), `publishing` (config, versions, weights, pause, val rounds), `writes` (acks and
deletes, dead letters, durable writes), `state` (what it holds), `metrics` (/metrics, status).
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from typing import Any

from consumer.assembly import Assembly
from consumer.batch import Batch
from consumer.handout import HandOut
from consumer.liveness import Claims, Heartbeat
from consumer.metrics import StateRecord, batcher_families
from consumer.publishing import MAX_WEIGHTS_BYTES, Publisher
from consumer.records import RecordedBatcher
from consumer.state import BatcherState, BatcherStats, ModeState, new_mode_state
from consumer.store import BatchStore
from consumer.waiting import BatchWait
from consumer.writes import Writer
from schemas.config import RolloutConfig
from schemas.errors import ConfigError
from schemas.keys import Keys
from schemas.redisconn import OwnerWatch, ReplicaWait, SyncClient, run_client
from schemas.stats import MetricsServer, serve_metrics

logger = logging.getLogger(__name__)


class Batcher:
    """Turns the trajectory streams of a run into batches for the trainer.

    `Batcher(redis_client, config, run="exp1")` publishes the config (producers read it from
    Redis) and creates the consumer groups. `redis_client` is a `Redis`, a `RedisCluster`, a
    Sentinel-made client or a URL (a plain `Redis` of a cluster node is made a cluster
    client). Several batchers can split the groups: `index=i, count=n` takes groups with
    `g % n == i`. From its first `get_batch` a batcher keeps a liveness key fresh (a daemon
    thread, `alive_ttl_ms`); another batcher claims its unacked entries only once it has
    seen that key missing for a whole `alive_ttl_ms` of its own (give the batchers of a run
    the same) and they were idle for `claim_idle_ms`. `close()` (or `with`) ends it.
    `record=DIR` keeps every batch `get_batch` hands out in DIR as Parquet (consumer/store.py;
    the `store` extra); `Batcher.from_records(DIR)` hands them out again.
    """

    def __init__(
        self,
        redis: SyncClient | str,
        config: RolloutConfig,
        run: str | None = None,
        *,
        index: int = 0,
        count: int = 1,
        consumer: str | None = None,
        block_ms: int = 1000,
        claim_idle_ms: int = 30_000,
        read_count: int = 256,
        publish_config: bool = True,
        write_timeout_s: float = 60.0,
        alive_ttl_ms: int = 10_000,
        record: str | os.PathLike[str] | None = None,
    ):
        if not isinstance(config, RolloutConfig):
            raise ConfigError(f"Batcher needs a RolloutConfig, not {type(config).__name__} "
                              "(RolloutConfig.from_yaml(path) or .from_dict(data))")
        if not 0 <= index < count:
            raise ConfigError(f"batcher index {index} must be in [0, {count})")
        for name, value, least in (("block_ms", block_ms, 1), ("read_count", read_count, 1),
                                   ("claim_idle_ms", claim_idle_ms, 0),  # 0: claim at once
                                   ("alive_ttl_ms", alive_ttl_ms, 30)):
            if not _is_int(value) or value < least:
                raise ConfigError(f"Batcher {name} must be an integer >= {least}, got {value!r}")
        for mode in config.modes():
            if config.manager(mode).num_env_groups <= index:
                raise ConfigError(
                    f"batcher {index} of {count} would read no {mode} group: the "
                    f"{mode}_env_manager has {config.manager(mode).num_env_groups} (group g goes "
                    "to batcher g % count)")
        # record=DIR: every batch handed out is kept as Parquet (consumer/store.py)
        self._store = None if record is None else BatchStore(record, config.to_yaml())
        client = run_client(redis, socket_timeout=30, socket_connect_timeout=5)
        self._owns_client = client is not redis
        if client.get_connection_kwargs().get("decode_responses"):
            raise ConfigError("Batcher needs a Redis client with decode_responses=False "
                              "(messages are msgpack bytes)")
        self.redis: Any = client
        self.config = config
        self.keys = keys = Keys(config.run if run is None else run)  # default: the config's run
        self.index, self.count = index, count
        self.consumer = consumer = consumer or f"batcher-{index}"
        self.block_ms = _fit_block(client, block_ms)
        self.claim_idle_ms = claim_idle_ms
        self.read_count = read_count
        self.alive_ttl_ms = alive_ttl_ms
        self._closed = False
        modes = {mode: new_mode_state(config, keys, mode, index, count)
                 for mode in config.modes()}
        self._shared = shared = BatcherState(consumer, modes)
        self.owner = OwnerWatch(keys, f"batcher {consumer}")
        self.owner.note(client)
        replicas = ReplicaWait(client, keys, config.min_replicas, config.replica_timeout_ms)
        self._writer = writer = Writer(client, keys, consumer, replicas, self.owner,
                                       write_timeout_s)
        # a closed batcher's word outlives the time its entries need to become claimable
        self._alive = alive = Heartbeat(client, keys, consumer, alive_ttl_ms,
                                        claim_idle_ms + 3 * alive_ttl_ms)
        self._claims = claims = Claims(client, keys, consumer, claim_idle_ms=claim_idle_ms,
                                       alive_ttl_ms=alive_ttl_ms, read_count=read_count)
        self._publisher = publisher = Publisher(
            client, keys, config, shared, index=index,
            streams=[stream for state in modes.values() for stream in state.streams],
            alive=alive, writer=writer, publish_config=publish_config)
        self._assembly = assembly = Assembly(client, keys, config, shared, count=count,
                                             read_count=read_count, alive=alive, writer=writer)
        self._hand_out = hand_out = HandOut(client, keys, config, shared, index=index,
                                            count=count, alive=alive, writer=writer,
                                            publisher=publisher, replicas=replicas)
        self._record = state_record = StateRecord(shared, client, keys, self.block_ms)
        self._wait = BatchWait(client, keys, shared, block_ms=self.block_ms, owner=self.owner,
                               alive=alive, claims=claims, assembly=assembly,
                               hand_out=hand_out, publisher=publisher, record=state_record)
        publisher.start()

    @property
    def version(self) -> int:
        """The policy version this batcher last published or saw."""
        return self._shared.version

    @property
    def totals(self) -> dict[str, float]:
        """Drops and failed groups since this Batcher started, by counter name."""
        return self._shared.totals

    @property
    def stats(self) -> BatcherStats:
        """The counters behind `/metrics`."""
        return self._shared.stats

    @property
    def write_timeout_s(self) -> float:
        return self._writer.write_timeout_s

    @property
    def unreplicated(self) -> int:
        """Acks and version publishes whose WAIT for replicas fell short (each retried)."""
        return self._writer.unreplicated

    # -- the trainer API ---------------------------------------------------------------------
    def close(self) -> None:
        """Stop the liveness heartbeat (another batcher may then claim a batch this one handed
        out and did not ack, after `claim_idle_ms`) and close the client, if the Batcher made
        it (from a URL, or a cluster client for a plain client of a cluster node); a client
        passed in is the caller's to close."""
        self._closed = True
        if self._alive.started:  # it took part: say it ended (status shows it closed)
            self._record.closed()
        self._alive.stop()
        if self._owns_client:
            self.redis.close()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def serve_metrics(self, port: int, addr: str = "0.0.0.0") -> MetricsServer:
        """Serve this Batcher's Prometheus metrics at `http://addr:port/metrics` (port 0: any
        free port, `.port` says which); `close()` the result to stop."""
        return serve_metrics(lambda: batcher_families(self._shared, self.redis, self.keys),
                             port, addr, what="batcher metrics")

    def get_batch(self, mode: str = "train", n: int | None = None,
                  timeout_s: float = 60.0) -> Batch:
        """Block until `n` trajectories in complete groups are ready (default: the mode's
        batch size, for each of several batchers too) and return them. Raises `BatchTimeout`
        after `timeout_s`; `timeout_s` <= 0 looks once without waiting. An `n` that the groups
        this batcher reads can never fill at once is refused at once (`ConfigError`)."""
        if self._closed:
            raise ConfigError("get_batch on a closed Batcher (its liveness key is gone: "
                              "another batcher could take the batch); make a new one")
        self._alive.guard()
        state = self._state(mode)
        n = self.config.batch_size(mode) if n is None else n
        if not _is_int(n) or n <= 0 or n % state.group_size:
            raise ConfigError(f"get_batch n={n!r} must be a positive multiple of "
                              f"{mode}_env_manager.group_size {state.group_size}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) \
                or math.isnan(timeout_s):
            raise ConfigError(f"get_batch timeout_s={timeout_s!r} must be a number of seconds")
        n = int(n)
        wanted = n // state.group_size
        most = self._assembly.most_groups(state)
        if wanted > most:
            raise ConfigError(
                f"get_batch n={n} needs {wanted} complete groups, but at most {most} can be "
                f"ready at once here ({len(state.streams)} {mode} groups read by this batcher, "
                f"{most // len(state.streams)} episode(s) each admitted ahead of the trainer)")
        batch = self._wait.get_batch(state, n, wanted, timeout_s)
        if self._store is not None:
            self._store.write(batch)
        return batch

    @staticmethod
    def from_records(path: str | os.PathLike[str]) -> RecordedBatcher:
        """The batches a `record=` folder (or one of its files) holds, handed out in order by
        an object with this class's trainer API: no Redis, producers or servers."""
        return RecordedBatcher(path)

    def ack(self, batch: Batch) -> None:
        """The trainer is done with `batch`: its entries are acked and deleted (retried through
        a failover; with `min_replicas`, on replicas before it returns)."""
        self._check_own(batch)
        self._hand_out.ack(batch, self._shared.modes[batch.mode])

    def publish_version(self, version: int | None = None, weights: bytes | None = None) -> int:
        """Publish policy version `version` (default: this Batcher's version + 1), with the
        policy weights for it if given, and wake the producers. Returns the version.

        Safe to retry: publishing the version that is already there is a no-op, so a trainer
        whose call failed (a lost reply) calls again with the same `version`. Publishing
        over a gap (the run is not at `version - 1`) raises `VersionConflict`."""
        if version is not None and not _is_int(version):
            raise ConfigError(f"publish_version: version must be an int, got {version!r}")
        version = self.version + 1 if version is None else int(version)
        if weights is not None and not isinstance(weights, bytes | bytearray | memoryview):
            raise ConfigError(f"publish_version: weights must be bytes (encode them first, "
                              f"e.g. with msgpack), got {type(weights).__name__}")
        if weights is not None and len(weights) > MAX_WEIGHTS_BYTES:
            raise ConfigError(
                f"publish_version: weights of {len(weights) / 2**20:.1f} MB exceed the "
                f"{MAX_WEIGHTS_BYTES // 2**20} MB a Redis value may hold here; save a checkpoint "
                "and have the inference servers load it instead")
        return self._publisher.publish_version(version, weights)

    def stop_run(self) -> None:
        """Tell every producer of the run to exit (a deliberate end of the run; a trainer
        that publishes the config again clears it)."""
        self._publisher.stop_run()

    # -- checks of what the trainer passes ---------------------------------------------------
    def _state(self, mode: str) -> ModeState:
        if mode not in self._shared.modes:
            self.config.manager(mode)  # raises the clear error for an unconfigured val mode
            raise ConfigError(f"mode must be 'train' or 'val', not {mode!r}")
        return self._shared.modes[mode]

    def _check_own(self, batch: Batch) -> None:
        """`ack` takes only a Batch this run handed out: acking deletes its entries."""
        if not isinstance(batch, Batch):
            raise ConfigError(f"ack takes the Batch that get_batch returned, not "
                              f"{type(batch).__name__}")
        if batch.mode not in self._shared.modes:
            raise ConfigError(f"ack: a {batch.mode} batch, but this run has no "
                              f"{batch.mode}_env_manager")
        prefix = self.keys.prefix + ":"
        foreign = next((e.stream for e in batch.entries if not e.stream.startswith(prefix)), None)
        if foreign is not None:
            raise ConfigError(f"ack: the batch holds {foreign}, not an entry of run "
                              f"{self.keys.run!r}: ack it with the Batcher that handed it out")


def _fit_block(redis: SyncClient, block_ms: int) -> int:
    """BLOCK must end before the client's socket timeout, or the read looks like a hang."""
    timeout = redis.get_connection_kwargs().get("socket_timeout")
    if timeout:
        block_ms = min(block_ms, max(1, int(timeout * 1000 * 0.8)))
    return max(1, block_ms)


def _is_int(value: Any) -> bool:
    """An integer (numpy's too), not a bool, a float or a string."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
