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
"""

from __future__ import annotations

import gc
import heapq
import logging
import math
import numbers
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis as redis_lib

from consumer.batch import Batch, Entry, batch_metrics
from consumer.metrics import BatcherStats, batcher_families, batcher_record
from consumer.periodic import Periodic
from schemas.backoff import Backoff
from schemas.codec import ENTRY_FIELD, decode_trajectory, pack, unpack
from schemas.config import RolloutConfig
from schemas.errors import (
    BatcherConflict,
    BatchTimeout,
    ConfigError,
    DecodeError,
    NotReplicated,
    RunConflict,
    RunStopped,
    StepExhausted,
    VersionConflict,
)
from schemas.keys import BATCHER_CLOSED as CLOSED
from schemas.keys import CONSUMER_GROUP, Keys
from schemas.liveness import live_producers
from schemas.protocol import Schedule
from schemas.redisconn import (
    REDIS_ERRORS,
    OwnerWatch,
    ReplicaWait,
    SyncClient,
    is_transient,
    publish,
    queue_publish,
    run_client,
    transaction,
)
from schemas.repeats import Repeats
from schemas.stats import STATS_KEEP_S, MetricsServer, serve_metrics

logger = logging.getLogger(__name__)

GroupKey = tuple[int, int, int]  # (val round, episode k, group id)
WEIGHTS_KEPT = 3  # the last weights published that stay in Redis (versions without any skipped)
MAX_WEIGHTS_BYTES = 64 * 2**20  # a Redis value is no place for a real checkpoint
STATE_EVERY_S = 1.0  # a waiting get_batch refreshes its state record this often
LOOK_EVERY_S = 1.0  # a waiting train get_batch looks this often whether more can come

# Redis holds an older version than this trainer published (it lost writes): put it back,
# never lower what another batcher of the run has published since
RAISE_VERSION_LUA = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
if cur < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
"""

# Version v is published only over v - 1; publishing v again is a no-op (a retry whose reply
# was lost), anything else is a conflict. Weights land in the same atomic step. A batcher
# whose name another batcher has taken (it was frozen past its ttl) publishes nothing.
PUBLISH_LUA = """
-- KEYS: version, weights of v, weights kept (list), this batcher's liveness key
-- ARGV: v, has weights, weights, kept, this batcher's mark ('' when it holds no name)
-- The weights of the versions that fall off the list are deleted: their names are built
-- from KEYS[2]'s, so they carry the run's hash tag and live in the same slot.
if ARGV[5] ~= '' then
  local mark = redis.call('GET', KEYS[4])
  if mark and mark ~= ARGV[5] then return {-3, 0} end
end
local raw = redis.call('GET', KEYS[1])
if not raw then return {-2, 0} end  -- the run's keys are gone: the caller restores them
local cur = tonumber(raw)
local v = tonumber(ARGV[1])
if cur == v then return {0, cur} end
if cur ~= v - 1 then return {-1, cur} end
redis.call('SET', KEYS[1], v)
if ARGV[2] == '1' then
  redis.call('SET', KEYS[2], ARGV[3])
  redis.call('LPUSH', KEYS[3], v)
  local base = string.sub(KEYS[2], 1, #KEYS[2] - #ARGV[1])
  for _, old in ipairs(redis.call('LRANGE', KEYS[3], tonumber(ARGV[4]), -1)) do
    redis.call('DEL', base .. old)
  end
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
end
return {1, cur}
"""

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

# A train batch is handed out: record it (a restarted Batcher hands out this very batch
# again) and, in sync mode, pause the producers once every batcher has its batch, in one
# atomic step, so a lost connection can never leave a batch handed out without its pause.
HAND_OUT_LUA = """
-- KEYS: inflight, sync_handed, pause; ARGV: inflight record, sync (0/1), index, count
redis.call('SET', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  redis.call('SADD', KEYS[2], ARGV[3])
  if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[4]) then
    redis.call('SADD', KEYS[3], 'sync')
  end
end
return 1
"""


# Ack and delete entries of several streams in one call (all of a run's keys share a slot).
DROP_LUA = """
-- KEYS: streams; ARGV: consumer group, then per stream: n, then its n entry ids
local at = 2
for i = 1, #KEYS do
  local n = tonumber(ARGV[at])
  redis.call('XACK', KEYS[i], ARGV[1], unpack(ARGV, at + 1, at + n))
  redis.call('XDEL', KEYS[i], unpack(ARGV, at + 1, at + n))
  at = at + n + 1
end
return 1
"""
DROP_CHUNK = 1000  # entry ids per script call at most (Lua's unpack has a stack limit)


@dataclass
class GroupSlot:
    """The members of one (round, episode, group) seen so far."""

    key: GroupKey
    seq: int
    members: dict[int, tuple[Entry, dict[str, Any]]] = field(default_factory=dict)
    failed: list[Entry] = field(default_factory=list)
    priority: bool = False  # part of a batch handed out before a restart: deliver first
    ready: bool = False  # complete, in its mode's ready heap
    oldest_start: int = 2**62  # the oldest `version_start` among its members

    def entries(self) -> list[Entry]:
        return [entry for entry, _ in self.members.values()] + self.failed


@dataclass
class ModeState:
    """Everything the batcher holds for one mode."""

    mode: str
    schedule: Schedule
    streams: list[str]
    group_size: int
    members: int
    groups: dict[GroupKey, GroupSlot] = field(default_factory=dict)
    ready: list[tuple[int, int, int, GroupKey]] = field(default_factory=list)
    ready_count: int = 0  # groups in `ready` still held (the heap keeps evicted ones lazily)
    finished: dict[int, set[tuple[int, int]]] = field(default_factory=lambda: defaultdict(set))
    counters: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    recovered: bool = False
    rotate: int = 0
    round: int = 0
    round_started: bool = False  # this get_batch("val") call has started its round
    seq: int = 0
    held: set[Entry] = field(default_factory=set)  # entries sorted into groups in memory
    handed: set[Entry] = field(default_factory=set)  # entries handed out, not yet acked
    env_ids: list[int] = field(default_factory=list)  # the envs of the groups read here
    looked_at: float = 0.0  # monotonic time of the last look at whether more can come


class _Heartbeat:
    """A batcher's liveness key (`{RUN}:alive:{consumer}`, PX `ttl_ms`), refreshed every third
    of its ttl (a `Periodic`) from the first `get_batch` until `stop()`, or until the Batcher
    is garbage: also while the trainer trains between calls. Another batcher claims this
    one's pending entries only once the key has been missing for a ttl (the process is gone),
    or at once when it says `closed`: `stop()` leaves that word for `closed_ms`."""

    def __init__(self, batcher: Batcher, ttl_ms: int, closed_ms: int):
        self._redis = batcher.redis
        self._key = batcher.keys.batcher_alive(batcher.consumer)
        self._consumer = batcher.consumer
        self._ttl_ms, self._closed_ms = ttl_ms, closed_ms
        # what this batcher writes: another live batcher of the same name writes its own
        self._token = uuid.uuid4().hex.encode()
        self.lost = False  # another batcher's mark found in the key: the name was taken
        self._beat_at = 0.0  # when a beat last wrote this batcher's mark (monotonic)
        self._name_script = batcher.redis.register_script(NAME_LUA)
        self._beats = Periodic(batcher, lambda owner: owner._alive._beat(), ttl_ms / 3000,
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
        client = run_client(redis, socket_timeout=30, socket_connect_timeout=5)
        self._owns_client = client is not redis
        if client.get_connection_kwargs().get("decode_responses"):
            raise ConfigError("Batcher needs a Redis client with decode_responses=False "
                              "(messages are msgpack bytes)")
        self.redis: Any = client
        self.config = config
        self.keys = Keys(config.run if run is None else run)  # default: the config's run
        self.index, self.count = index, count
        self.consumer = consumer or f"batcher-{index}"
        self.block_ms = self._fit_block(client, block_ms)
        self.claim_idle_ms = claim_idle_ms
        self.read_count = read_count
        self.write_timeout_s = write_timeout_s
        self.unreplicated = 0  # acks and version publishes whose WAIT for replicas fell short
        self.version = 0
        self.totals: dict[str, float] = defaultdict(float)
        self.stats = BatcherStats()  # counters for /metrics and the state record
        self._state_at = 0.0  # monotonic time the state record was last written
        self._states = {mode: self._new_state(mode) for mode in config.modes()}
        self._last_claim = 0.0
        self.alive_ttl_ms = alive_ttl_ms
        # a closed batcher's word outlives the time its entries need to become claimable
        self._alive = _Heartbeat(self, alive_ttl_ms, claim_idle_ms + 3 * alive_ttl_ms)
        self._repeats = Repeats(logger)  # a group failing every episode: not a line each
        # other consumers seen holding entries without a liveness key: (mode, name) -> when
        # first seen so (monotonic); claimed from only once that has lasted a whole ttl
        self._suspects: dict[tuple[str, str], float] = {}
        self._closed = False
        self._stream_names = {(mode, g): self.keys.stream(mode, g) for mode in config.modes()
                              for g in range(config.manager(mode).num_env_groups)}
        self._owns_config = publish_config
        self._last_weights: tuple[int, bytes] | None = None  # put back if Redis loses them
        self._record_hand_out = client.register_script(HAND_OUT_LUA)
        self._replicas = ReplicaWait(client, self.keys, config.min_replicas,
                                     config.replica_timeout_ms)
        self.owner = OwnerWatch(self.keys, f"batcher {self.consumer}")
        self.owner.note(client)
        self._check_published_config()
        if publish_config:
            self._publish_config()
        self._create_groups()
        self.version = int(self.redis.get(self.keys.version) or 0)

    # -- setup -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the liveness heartbeat (another batcher may then claim a batch this one handed
        out and did not ack, after `claim_idle_ms`) and close the client, if the Batcher made
        it (from a URL, or a cluster client for a plain client of a cluster node); a client
        passed in is the caller's to close."""
        self._closed = True
        if self._alive._started:  # it took part: say it ended (status shows it closed)
            record = batcher_record(self, "train", "closed", 0.0, 0, 0, 0, ttl_s=STATS_KEEP_S)
            try:
                self._write_record(record.encode())
            except redis_lib.RedisError as exc:
                logger.debug("could not write the batcher's closing record: %s", exc)
        self._alive.stop()
        if self._owns_client:
            self.redis.close()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _fit_block(redis: SyncClient, block_ms: int) -> int:
        """BLOCK must end before the client's socket timeout, or the read looks like a hang."""
        timeout = redis.get_connection_kwargs().get("socket_timeout")
        if timeout:
            block_ms = min(block_ms, max(1, int(timeout * 1000 * 0.8)))
        return max(1, block_ms)

    def _new_state(self, mode: str) -> ModeState:
        manager = self.config.manager(mode)
        streams = [self.keys.stream(mode, g) for g in range(manager.num_env_groups)
                   if g % self.count == self.index]
        schedule = Schedule(self.config.episodes_per_step(mode), self.config.ratio)
        members = manager.members
        env_ids = [g * members + m for g in range(manager.num_env_groups)
                   if g % self.count == self.index for m in range(members)]
        return ModeState(mode, schedule, streams, manager.group_size, members, env_ids=env_ids)

    def _check_published_config(self) -> None:
        """A run name already in use must have been made by a config this one can resume:
        otherwise its streams, cursors and version mean other episodes (refused)."""
        raw = self.redis.get(self.keys.config)
        if raw is None:
            return
        published = RolloutConfig.from_json(raw)
        conflicts = self.config.resume_conflicts(published)
        if conflicts:
            run = self.keys.run
            raise RunConflict(
                f"run {run!r} already exists with a different config ({'; '.join(conflicts)}); "
                f"use another run name, or reset it: rollstream reset --run {run}")
        if published.to_json() != self.config.to_json() and self._owns_config:
            logger.warning("run %s: replacing its published config (policy or env settings "
                           "changed); restart running producers so they read it", self.keys.run)

    def _publish_config(self) -> None:
        """Publish the config (producers read it) and start or resume the run: a run that
        was stopped (`rollstream stop`) runs again."""
        keys = self.keys
        pipe = transaction(self.redis)
        pipe.set(keys.config, self.config.to_json())
        pipe.setnx(keys.version, self.version)
        pipe.setnx(keys.val_round, 0)
        pipe.delete(keys.stop)
        queue_publish(pipe, keys.control, b"version")
        pipe.execute()

    def _sync_version(self) -> None:
        """Read the version; if the run's keys are gone (a Redis restarted without
        persistence), put back what the trainer knows: config, version, consumer groups."""
        raw = self.redis.get(self.keys.version)
        if raw is not None and int(raw) < self.version and self._owns_config:
            self._put_version_back(int(raw))
            return
        if raw is not None:
            self.version = int(raw)
            return
        if self.redis.get(self.keys.config) is not None or not self._owns_config:
            self.redis.setnx(self.keys.version, self.version)
            return
        logger.warning("run %s: its keys are gone (Redis restarted without persistence?); "
                       "restoring config, version %d and consumer groups; trajectories that "
                       "were in Redis are lost", self.keys.run, self.version)
        self._publish_config()
        self._create_groups()
        self._restore_weights()

    def _put_version_back(self, found: int) -> None:
        """Redis holds version `found`, older than the one this trainer published: it came
        back from an older state (an RDB snapshot, an AOF without `appendfsync always`, a
        failover to a replica behind). Followed, the run went back in time: the steps since
        were trained again on trajectories already trained on, and their versions published
        twice for different weights. The version goes back up instead, so the episodes of
        the lost steps expire rather than train twice."""
        logger.warning(
            "run %s: Redis holds version %d, behind the %d this trainer published: it lost "
            "writes (restarted from an older snapshot? run it with appendonly yes and "
            "appendfsync always); putting version %d back, so the episodes of the lost steps "
            "expire instead of training twice", self.keys.run, found, self.version,
            self.version)
        self.redis.eval(RAISE_VERSION_LUA, 1, self.keys.version, self.version)
        self._restore_weights()
        publish(self.redis, self.keys.control, b"version")

    def _restore_weights(self) -> None:
        """Put back the weights of this trainer's version if Redis lost them (they were
        published with it: producers of a learning policy wait for them)."""
        if self._last_weights is not None and self._last_weights[0] == self.version:
            self.redis.set(self.keys.weights(self.version), self._last_weights[1], nx=True)

    def _create_groups(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for state in self._states.values():
            for stream in state.streams:
                pipe.xgroup_create(stream, CONSUMER_GROUP, id="0", mkstream=True)
        errors = [reply for reply in pipe.execute(raise_on_error=False)
                  if isinstance(reply, Exception)]
        for error in errors:
            # each carries the frames it was raised in, and through them this one: a cycle
            # that would keep the Batcher (and its heartbeat) alive until a full collection
            error.__traceback__ = None
        failed = next((error for error in errors if "BUSYGROUP" not in str(error)), None)
        if failed is not None:
            raise failed

    # -- the trainer API ---------------------------------------------------------------------
    def serve_metrics(self, port: int, addr: str = "0.0.0.0") -> MetricsServer:
        """Serve this Batcher's Prometheus metrics at `http://addr:port/metrics` (port 0: any
        free port, `.port` says which); `close()` the result to stop."""
        return serve_metrics(lambda: batcher_families(self), port, addr,
                             what="batcher metrics")

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
        most = self._most_groups(state)
        if wanted > most:
            raise ConfigError(
                f"get_batch n={n} needs {wanted} complete groups, but at most {most} can be "
                f"ready at once here ({len(state.streams)} {mode} groups read by this batcher, "
                f"{most // len(state.streams)} episode(s) each admitted ahead of the trainer)")
        started = time.monotonic()
        state.round_started = False
        self._state_at = 0.0  # write the waiting record at once
        self.stats.waiting[mode] = True
        try:
            batch = self._get_batch_retrying(state, n, wanted, started, timeout_s)
        except BatchTimeout:
            self._record_done(state, "timed_out", time.monotonic() - started)
            raise
        finally:
            self.stats.waiting[mode] = False
        self._record_done(state, "handed", batch.metrics["time/get_batch_cost"])
        return batch

    def _most_groups(self, state: ModeState) -> int:
        """An upper bound on the complete groups that can be ready at once for this batcher:
        every group it reads, for each episode admitted and not yet expired (train: at most
        `2 * ratio + 1` steps' worth, early in a run; one in sync mode; a val round plays its
        episodes once)."""
        steps = 2 * self.config.ratio + 1 if state.mode == "train" else 1
        return len(state.streams) * self.config.episodes_per_step(state.mode) * steps

    def _get_batch_retrying(self, state: ModeState, n: int, wanted: int, started: float,
                            timeout_s: float) -> Batch:
        """`_get_batch`, again after a lost connection or lost consumer groups."""
        mode = state.mode
        deadline = started + timeout_s
        backoff = Backoff(name=f"batcher {self.consumer}")
        while True:
            try:
                batch = self._get_batch(state, n, wanted, started, deadline, timeout_s)
                self.owner.note(self.redis)  # a redirect followed quietly: one line
                return batch
            except REDIS_ERRORS as exc:
                if isinstance(exc, redis_lib.ResponseError) and "NOGROUP" in str(exc):
                    logger.warning("consumer groups missing (Redis lost its data?); recreating")
                    self._create_groups()
                    continue
                if isinstance(exc, redis_lib.ResponseError) and str(exc).startswith("UNBLOCKED"):
                    # Redis 7 ends a blocked read whose stream left the node: its slot moved
                    # to another node of a cluster (the next read follows MOVED) or the key
                    # was deleted (NOGROUP next). Nothing was delivered: read again.
                    logger.info("a stream the batcher waited on left the node (%s); reading "
                                "again", exc)
                    continue
                if not is_transient(exc):
                    raise
                state.recovered = False  # a read may have been delivered and lost: re-read
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BatchTimeout(f"get_batch(mode={mode!r}) timed out after "
                                       f"{timeout_s:g}s: Redis unreachable: {exc}") from None
                backoff.sleep_sync(f"read failed: {exc}", max_s=remaining)
                self.owner.note(self.redis)

    def _get_batch(self, state: ModeState, n: int, wanted: int, started: float,
                   deadline: float, timeout_s: float) -> Batch:
        self._alive.start()  # the name first: a namesake refused lifts no pause of the other's
        if state.mode == "train":
            self._resume_sync()
        elif not state.round_started:
            self._start_val_round(state)
        self._sync_version()
        with _gc_paused():
            if not state.recovered:
                self._recover(state)
            self._evict_expired(state)
            if self._ready_count(state) >= wanted or deadline <= started:
                # enough held already, but an older group may have completed in Redis since:
                # one read that does not block, so oldest-first holds across what is unread
                # (also the one look of a get_batch that may not wait)
                self._read(state, block_ms=None)
            deliverable = self._deliverable(state, wanted)
            stop_looked_at = 0.0
            while self._ready_count(state) < deliverable or self._awaits_publish(deliverable):
                self._record_waiting(state, wanted, started)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BatchTimeout(self._timeout_message(state, n, wanted, timeout_s))
                if time.monotonic() - stop_looked_at >= LOOK_EVERY_S:
                    stop_looked_at = time.monotonic()
                    self._check_stopped(state)
                if self._nothing_more(state):
                    deliverable = self._ready_count(state)
                    if not self._awaits_publish(deliverable):
                        break
                # (min before int: timeout_s may be float("inf"), wait as long as it takes)
                self._read(state, block_ms=max(1, int(min(self.block_ms, remaining * 1000))))
                if self._claim_due():
                    self._reclaim(state)
                deliverable = self._deliverable(state, wanted)
            if deliverable < wanted:
                self._hand_out_short(state, wanted, deliverable)
            return self._hand_out(state, deliverable, time.monotonic() - started, deadline)

    def _check_stopped(self, state: ModeState) -> None:
        """`RunStopped` when an operator stopped the run (`rollstream stop`): its producers
        exit, so a wait could only time out."""
        if self.redis.exists(self.keys.stop):
            raise RunStopped(f"run {self.keys.run!r} was stopped (rollstream stop) while "
                             f"get_batch(mode={state.mode!r}) waited; a trainer started "
                             "again resumes it")

    def ack(self, batch: Batch) -> None:
        """The trainer is done with `batch`: its entries are acked and deleted (retried through
        a failover; with `min_replicas`, on replicas before it returns)."""
        self._check_own(batch)
        self._alive.guard()  # a batch another batcher took over is not this one's to ack

        def queue(pipe: Any) -> None:
            self._queue_drop(pipe, batch.entries)
            pipe.delete(self.keys.inflight(batch.mode, self.consumer))

        self._durable_write(f"ack of a {batch.mode} batch", queue)
        self._states[batch.mode].handed.difference_update(batch.entries)

    def _check_own(self, batch: Batch) -> None:
        """`ack` takes only a Batch this run handed out: acking deletes its entries."""
        if not isinstance(batch, Batch):
            raise ConfigError(f"ack takes the Batch that get_batch returned, not "
                              f"{type(batch).__name__}")
        if batch.mode not in self._states:
            raise ConfigError(f"ack: a {batch.mode} batch, but this run has no "
                              f"{batch.mode}_env_manager")
        prefix = self.keys.prefix + ":"
        foreign = next((e.stream for e in batch.entries if not e.stream.startswith(prefix)), None)
        if foreign is not None:
            raise ConfigError(f"ack: the batch holds {foreign}, not an entry of run "
                              f"{self.keys.run!r}: ack it with the Batcher that handed it out")

    def publish_version(self, version: int | None = None, weights: bytes | None = None) -> int:
        """Publish policy version `version` (default: this Batcher's version + 1), with the
        policy weights for it if given, and wake the producers. Returns the version.

        Safe to retry: publishing the version that is already there is a no-op, so a trainer
        whose call failed (a lost reply) calls again with the same `version`. Publishing
        over a gap (the run is not at `version - 1`) raises `VersionConflict`."""
        keys = self.keys
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
        script_keys = [keys.version, keys.weights(version), keys.weights_kept,
                       keys.batcher_alive(self.consumer)]
        args = [version, 1 if weights is not None else 0, weights if weights is not None else b"",
                WEIGHTS_KEPT, self._alive.mark]

        def publish() -> tuple[int, int]:
            (reply,) = self._durable_write(
                f"publish of version {version}",
                lambda pipe: pipe.execute_command("EVAL", PUBLISH_LUA, len(script_keys),
                                                  *script_keys, *args))
            return int(reply[0]), int(reply[1])

        code, current = publish()
        if code == -3:  # this batcher's name is another's now (the script checked)
            self._alive.lose()
            self._alive.check()
        if code == -2 or (code == -1 and int(current) < self.version):
            # no version key: Redis lost the run (restarted without persistence); an older
            # one: it lost writes. Either way, what this trainer knows goes back first
            self._sync_version()  # puts back config, version and groups, as get_batch does
            code, current = publish()
        if code < 0:
            raise VersionConflict(
                f"publish_version({version}): the run {keys.run!r} is at version {int(current)}; "
                f"only {int(current) + 1} can follow it (another trainer publishing?)")
        if weights is not None:
            self._last_weights = (version, weights)
        self.version = version
        self._notify(b"version")
        return version

    def stop_run(self) -> None:
        """Tell every producer of the run to exit (a deliberate end of the run; a trainer
        that publishes the config again clears it)."""
        self.redis.set(self.keys.stop, 1)
        publish(self.redis, self.keys.control, b"stop")

    # -- the state record (rollstream status) ------------------------------------------------
    def _record_waiting(self, state: ModeState, wanted: int, started: float) -> None:
        """While get_batch waits: what for and how long, at most every `STATE_EVERY_S`."""
        now = time.monotonic()
        if now - self._state_at < STATE_EVERY_S:
            return
        self._state_at = now
        ready = self._ready_count(state)
        record = batcher_record(self, state.mode, "waiting", now - started, wanted, ready,
                                len(state.groups) - ready, ttl_s=self.block_ms / 1000 + 10)
        self._write_record(record.encode())

    def _record_done(self, state: ModeState, outcome: str, waited_s: float) -> None:
        """get_batch is over: `handed` out a batch or `timed_out` (best effort: this record
        must not change what get_batch returns or raises)."""
        ready = self._ready_count(state)
        record = batcher_record(self, state.mode, outcome, waited_s, 0, ready,
                                len(state.groups) - ready, ttl_s=STATS_KEEP_S)
        try:
            self._write_record(record.encode())
        except redis_lib.RedisError as exc:
            logger.debug("could not write the batcher's state record: %s", exc)

    def _write_record(self, data: bytes) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.batchers, self.consumer, data)
        pipe.pexpire(self.keys.batchers, int(STATS_KEEP_S * 1000))
        pipe.execute()

    # -- steps of get_batch -------------------------------------------------------------------
    def _state(self, mode: str) -> ModeState:
        if mode not in self._states:
            self.config.manager(mode)  # raises the clear error for an unconfigured val mode
            raise ConfigError(f"mode must be 'train' or 'val', not {mode!r}")
        return self._states[mode]

    def _resume_sync(self) -> None:
        """This batcher waits for a train batch again: the sync pause is lifted (producers
        run while any batcher waits; admission holds them to the current version)."""
        if not self.config.is_sync:
            return
        pipe = transaction(self.redis)
        pipe.srem(self.keys.sync_handed, self.index)
        pipe.srem(self.keys.pause, "sync")
        queue_publish(pipe, self.keys.control, b"pause")
        pipe.execute()

    def _start_val_round(self, state: ModeState) -> None:
        pipe = transaction(self.redis)
        pipe.incr(self.keys.val_round)
        pipe.delete(self.keys.cursor("val"))
        state.round = int(pipe.execute()[0])
        state.round_started = True
        publish(self.redis, self.keys.control, b"val_round")
        old = [slot for key, slot in state.groups.items() if key[0] != state.round]
        self._drop_groups(state, old, counter=None)
        state.finished.clear()  # older rounds' entries are discarded by their round number

    def _recover(self, state: ModeState) -> None:
        """After a restart: this consumer's pending entries, then a dead consumer's."""
        self._alive.start()
        raw = self.redis.get(self.keys.inflight(state.mode, self.consumer))
        inflight = {Entry(s, i) for s, i in unpack(_bytes(raw))} if raw else set()
        self._read_pending(state, inflight)
        self._reclaim(state)
        state.recovered = True

    def _read_pending(self, state: ModeState, inflight: set[Entry]) -> None:
        cursors: dict[Any, Any] = {stream: "0" for stream in state.streams}
        while cursors:
            reply = self.redis.xreadgroup(CONSUMER_GROUP, self.consumer, cursors,
                                          count=self.read_count)
            nxt: dict[str, str] = {}
            for stream, messages in _iter_reply(reply):
                if messages:
                    nxt[stream] = messages[-1][0]
                    self._assemble(state, stream, messages, inflight)
            cursors = nxt

    def _reclaim(self, state: ModeState) -> None:
        """Claim the entries a dead batcher left pending longer than `claim_idle_ms`: one
        whose liveness key (`_Heartbeat`) has expired. A live batcher's unacked batch stays
        its own, however long its trainer takes."""
        self._last_claim = time.monotonic()
        dead = self._dead_holders(state)
        pages = {(name, stream): "-" for name, streams in dead.items() for stream in streams}
        while pages:
            pipe = self.redis.pipeline(transaction=False)
            for (name, stream), start in pages.items():
                pipe.xpending_range(stream, CONSUMER_GROUP, min=start, max="+",
                                    count=self.read_count, consumername=name,
                                    idle=self.claim_idle_ms)
            found = {where: [item["message_id"] for item in reply]
                     for where, reply in zip(pages, pipe.execute(), strict=True) if reply}
            if not found:
                return
            pipe = self.redis.pipeline(transaction=False)
            for (_, stream), ids in found.items():
                pipe.xclaim(stream, CONSUMER_GROUP, self.consumer,
                            min_idle_time=self.claim_idle_ms, message_ids=ids)
            for (name, stream), messages in zip(found, pipe.execute(), strict=True):
                if messages:
                    logger.info("claimed %d pending entries of %s from batcher %s (gone)",
                                len(messages), stream, _text(name))
                    self._assemble(state, stream, messages, set())
            pages = {where: "(" + _text(ids[-1]) for where, ids in found.items()
                     if len(ids) >= self.read_count}

    def _dead_holders(self, state: ModeState) -> dict[str, list[str]]:
        """Other consumers with entries pending in this batcher's streams and no live
        heartbeat for a whole `alive_ttl_ms` of looking: consumer -> those streams. A key
        missing at one look is not enough: after a Redis outage longer than the ttl a live
        batcher's key has expired until its next beat lands (a third of the ttl)."""
        pipe = self.redis.pipeline(transaction=False)
        for stream in state.streams:
            pipe.xpending(stream, CONSUMER_GROUP)
        holders: dict[str, list[str]] = defaultdict(list)
        for stream, summary in zip(state.streams, pipe.execute(), strict=True):
            for consumer in summary.get("consumers") or ():
                name = _text(consumer["name"])
                if name != self.consumer and int(consumer["pending"]):
                    holders[name].append(stream)
        if not holders:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for name in holders:
            pipe.get(self.keys.batcher_alive(name))
        now, grace = time.monotonic(), self.alive_ttl_ms / 1000
        dead: dict[str, list[str]] = {}
        for (name, streams), word in zip(holders.items(), pipe.execute(), strict=True):
            if word == CLOSED:
                dead[name] = streams  # closed by its owner: gone for sure
            elif word is not None:  # alive
                self._suspects.pop((state.mode, name), None)
            elif now - self._suspects.setdefault((state.mode, name), now) >= grace:
                dead[name] = streams
        for mode, name in list(self._suspects):
            if mode == state.mode and name not in holders:
                del self._suspects[mode, name]  # holds nothing here any more
        return dead

    def _claim_due(self) -> bool:
        """Time for `_reclaim`: `claim_idle_ms` since the last one, or a suspect's ttl of
        grace (`_dead_holders`) is over."""
        now = time.monotonic()
        if now - self._last_claim > self.claim_idle_ms / 1000:
            return True
        return any(now - since >= self.alive_ttl_ms / 1000 for since in self._suspects.values())

    def _read(self, state: ModeState, block_ms: int | None) -> None:
        """One XREADGROUP over the mode's streams (rotated); `block_ms` None: do not block."""
        self._alive.guard()  # not into the name's pending entries once another holds it
        streams = state.streams
        state.rotate = (state.rotate + 1) % len(streams)
        order = streams[state.rotate:] + streams[: state.rotate]
        reply = self.redis.xreadgroup(CONSUMER_GROUP, self.consumer, {s: ">" for s in order},
                                      count=self.read_count, block=block_ms)
        for stream, messages in _iter_reply(reply):
            self._assemble(state, stream, messages, set())

    def _assemble(self, state: ModeState, stream: str, messages: list[Any],
                  inflight: set[Entry]) -> None:
        """Sort entries into groups; drop what is stale, late, duplicated or undecodable."""
        drop: list[Entry] = []
        dead: list[tuple[Entry, bytes, str]] = []
        for entry_id, fields in messages:
            entry = Entry(stream, _text(entry_id))
            data = (fields or {}).get(ENTRY_FIELD)
            if data is None:
                drop.append(entry)  # deleted while pending, or not ours: nothing to deliver
                continue
            try:
                msg = decode_trajectory(data)
                self._check_entry(state, stream, msg)
            except DecodeError as exc:
                dead.append((entry, data, str(exc)))
                continue
            drop.extend(self._place(state, entry, msg, entry in inflight))
        if dead:
            self._dead_letter(dead)
            self.stats.count(state.mode, "scheduler/dead_lettered", len(dead))
        if drop:
            self._drop_entries(drop)

    def _check_entry(self, state: ModeState, stream: str, msg: dict[str, Any]) -> None:
        where = (msg["mode"], msg["group_id"])
        expected = self._stream_names.get(where) or self.keys.stream(*where)
        if expected != stream:
            raise DecodeError(f"entry says mode {msg['mode']} group {msg['group_id']} but sits "
                              f"in {stream}")
        if not 0 <= msg["member"] < state.members:
            raise DecodeError(f"member {msg['member']} out of range [0, {state.members})")

    def _place(self, state: ModeState, entry: Entry, msg: dict[str, Any],
               priority: bool) -> list[Entry]:
        """Add one trajectory to its group; returns entries to drop at once."""
        if entry in state.held or entry in state.handed:
            return []  # read again from the pending list: already ours
        g, k, rnd = msg["group_id"], msg["episode_id"], int(msg.get("round", 0))
        if state.mode == "val" and rnd != state.round:
            self._count(state, "scheduler/val_discarded")
            return [entry]
        if state.mode == "train" and self._is_stale(state, k, msg["version_start"]):
            self._count(state, "scheduler/stale_dropped")
            return [entry]
        if (rnd, k) in state.finished[g]:
            self._count(state, "scheduler/late_dropped")
            return [entry]
        key = (rnd, k, g)
        slot = state.groups.get(key)
        if slot is None:
            state.seq += 1
            slot = state.groups[key] = GroupSlot(key, state.seq)
        slot.priority = slot.priority or priority
        if len(slot.members) >= state.group_size or msg["member"] in slot.members:
            self._count(state, "scheduler/late_dropped")
            return [entry]  # redundancy: the first group_size finishers won; or a duplicate
        state.held.add(entry)
        if msg.get("failed"):
            slot.failed.append(entry)
            if state.members - len(slot.failed) < state.group_size:
                self._finish(state, slot)
                self._count(state, "scheduler/failed_groups")
                self._repeats.warning(f"dropping group {key}: a member failed "
                                      f"({msg.get('error')})")
                return slot.entries()
            return []
        slot.members[msg["member"]] = (entry, msg)
        slot.oldest_start = min(slot.oldest_start, msg["version_start"])
        if len(slot.members) == state.group_size:
            # oldest episode first; val orders by group so every round's batch is the same
            order = g if state.mode == "val" else slot.seq
            heapq.heappush(state.ready, (0 if slot.priority else 1, k, order, key))
            slot.ready = True
            state.ready_count += 1
        return []

    def _deliverable(self, state: ModeState, wanted: int) -> int:
        """How many of the `wanted` groups can still complete. In sync mode a step's groups
        are its only ones until the version moves, so a group dropped because a member failed
        (a model server refusing a request, an env that kept raising) cannot be replaced:
        the batch goes out without it rather than never. A val round likewise: it plays
        its episodes once, so a group dropped in it is gone for the round. Async mode:
        `wanted` (later episodes fill in)."""
        if state.mode == "val":
            dropped = sum(1 for keys in state.finished.values() for rnd, _ in keys
                          if rnd == state.round)
            return min(wanted, self._most_groups(state) - dropped)
        if self.config.ratio != 0:
            return wanted
        per_step = state.schedule.episodes_per_step
        low, high = self.version * per_step, (self.version + 1) * per_step
        done = sum(1 for keys in state.finished.values() for _, k in keys if low <= k < high)
        return min(wanted, self._most_groups(state) - done)

    def _awaits_publish(self, deliverable: int) -> bool:
        """Nothing of this step can come, and another batcher (`count` > 1) may move the
        version: wait for its publish instead of raising `StepExhausted` (a rank that does not
        publish may ask for its next batch before the rank that does has published)."""
        return deliverable <= 0 and self.count > 1

    def _nothing_more(self, state: ModeState) -> bool:
        """Train mode: whether nothing more can reach this batcher before the version moves:
        every env of its groups has committed every episode admitted at this version (its
        cursor is at the admission limit) and its streams hold only what it holds already.
        Read in one transaction with the version (a commit moves a cursor and adds its entry
        at once; another batcher may have published meanwhile); looked at first and then at
        most every `LOOK_EVERY_S` while waiting. This is what a batcher restarted mid-step
        knows nothing else about: a step handed out and acked but not published, or a group
        dropped before the restart."""
        now = time.monotonic()
        if state.mode != "train" or now - state.looked_at < LOOK_EVERY_S:
            return False
        state.looked_at = now
        pipe = transaction(self.redis)
        pipe.get(self.keys.version)
        pipe.hmget(self.keys.cursor(state.mode), state.env_ids)
        for stream in state.streams:
            pipe.xlen(stream)
        version, cursors, *lengths = pipe.execute()
        current = int(version or 0)
        if current != self.version:
            if current > self.version:  # another batcher published while this one waited
                self.version = current
                self._evict_expired(state)
            return False  # (lower: Redis lost it; the next get_batch puts it back)
        limit = state.schedule.admit_limit(self.version)
        if any(cursor is None or int(cursor) < limit for cursor in cursors):
            return False
        return sum(lengths) <= len(state.held) + len(state.handed)

    def _hand_out_short(self, state: ModeState, wanted: int, deliverable: int) -> None:
        failed = int(self.totals["scheduler/failed_groups"])
        if state.mode == "val":
            if deliverable <= 0:
                raise StepExhausted(
                    f"get_batch(mode='val') val round {state.round}: every group of the round "
                    f"was dropped (a member failed; scheduler/failed_groups {failed} since this "
                    "batcher started): the producers' log says why")
            logger.warning("val round %d: handing out %d of %d groups; the others were dropped "
                           "(a member failed; the producers' log says why)", state.round,
                           deliverable, wanted)
            return
        if deliverable <= 0:
            raise StepExhausted(
                f"get_batch(mode='train') at version {self.version}: no group can complete "
                f"any more before the version moves (every episode admitted was committed, "
                f"and each group was handed out or dropped; scheduler/failed_groups "
                f"{failed}); publish_version to go on")
        logger.warning("version %d: handing out %d of %d groups; no other group can complete "
                       "before the version moves (dropped: a member failed; or handed out "
                       "already)", self.version, deliverable, wanted)

    def _is_stale(self, state: ModeState, k: int, version_start: int) -> bool:
        schedule = state.schedule
        return schedule.expired(k, self.version) or self.version - version_start > schedule.ratio

    def _evict_expired(self, state: ModeState) -> None:
        if state.mode != "train":
            return
        # expired episodes, and groups whose weights fell more than `ratio` behind since they
        # were placed (a member's `version_start`: a version published over their heads)
        oldest = self.version - state.schedule.ratio
        stale = [slot for (_, k, _), slot in state.groups.items()
                 if state.schedule.expired(k, self.version)
                 or slot.oldest_start < oldest]
        self._drop_groups(state, stale, counter="scheduler/stale_dropped")
        first_live = state.schedule.first_live(self.version)
        for done in state.finished.values():  # forget what can no longer arrive unexpired
            done.difference_update({rk for rk in done if rk[1] < first_live})

    def _drop_groups(self, state: ModeState, slots: list[GroupSlot], counter: str | None) -> None:
        entries: list[Entry] = []
        for slot in slots:
            entries += slot.entries()
            self._finish(state, slot)
        if counter and entries:
            self._count(state, counter, len(entries))
        if entries:
            self._drop_entries(entries)

    def _finish(self, state: ModeState, slot: GroupSlot) -> None:
        rnd, k, g = slot.key
        if state.groups.pop(slot.key, None) is not None and slot.ready:
            state.ready_count -= 1
        state.finished[g].add((rnd, k))
        state.held.difference_update(slot.entries())

    def _ready_count(self, state: ModeState) -> int:
        return state.ready_count

    def _hand_out(self, state: ModeState, wanted: int, wait_s: float,
                  deadline: float | None = None) -> Batch:
        self._alive.guard()  # a batcher whose name another took hands out nothing
        chosen: list[tuple[tuple[int, int, int, GroupKey], GroupSlot]] = []
        while len(chosen) < wanted:
            item = heapq.heappop(state.ready)
            slot = state.groups.get(item[3])
            if slot is not None:
                chosen.append((item, slot))
        trajs: list[dict[str, Any]] = []
        entries: list[Entry] = []
        for _, slot in chosen:
            members = sorted(slot.members.items())
            trajs += [msg for _, (_, msg) in members]
            entries += [entry for _, (entry, _) in members]
        if state.mode == "train":
            record = pack([[e.stream, e.entry_id] for e in entries])
            try:
                self._write_hand_out(
                    [self.keys.inflight(state.mode, self.consumer), self.keys.sync_handed,
                     self.keys.pause],
                    [record, 1 if self.config.is_sync else 0, self.index, self.count],
                    deadline)
            except (REDIS_ERRORS + (NotReplicated,)) as exc:
                for item, _ in chosen:  # nothing handed out: the groups stay ready
                    heapq.heappush(state.ready, item)
                if isinstance(exc, NotReplicated):
                    raise self._unreplicated_hand_out(exc) from None
                raise
            if self.config.is_sync:
                self._notify(b"pause")
        late: list[Entry] = []
        for _, slot in chosen:
            late += slot.failed
            self._finish(state, slot)
        state.handed.update(entries)
        counters = dict(state.counters)
        state.counters.clear()
        metrics = batch_metrics(trajs, self.version, counters, wait_s)
        self.stats.on_batch(state.mode, trajs, wait_s)
        for name in ("scheduler/stale_dropped", "scheduler/failed_groups"):
            metrics.setdefault(name, 0.0)
        batch = Batch(state.mode, self.version, trajs, entries, metrics, round=state.round)
        try:
            if late:
                self._drop_entries(late)
            if state.mode == "val":
                self.ack(batch)  # a val round can be asked for again; nothing to redeliver
        except REDIS_ERRORS as exc:  # they stay pending; a restart cleans them up
            logger.warning("could not drop %d handed-out %s entries: %s", len(late), state.mode,
                           exc)
        return batch

    # -- helpers -------------------------------------------------------------------------------
    def _unreplicated_hand_out(self, exc: NotReplicated) -> BatchTimeout:
        """A batch that was ready but not on replicas in time: get_batch timed out waiting for
        them. The write that recorded it stands on the primary alone: its sync pause is lifted
        (best effort; the next get_batch lifts it anyway), as nothing was handed out."""
        try:
            self._resume_sync()
        except REDIS_ERRORS as error:
            logger.debug("could not lift the sync pause: %s", error)
        return BatchTimeout(f"get_batch(mode='train'): a batch is ready, but {exc} "
                            f"(min_replicas {self._replicas.replicas}: a batch is handed out "
                            "only once replicas hold it)")

    def _write_hand_out(self, keys: list[str], args: list[Any],
                        deadline: float | None = None) -> None:
        """Record a train hand-out (`HAND_OUT_LUA`). With `min_replicas` it is a durable write:
        its WAIT covers every write before it, the producers' XADDs of this batch among them,
        so a batch is handed out only once replicas hold its trajectories (a producer whose
        commit fell short resends it, and after a failover to a replica without it that resend
        is a new entry: a batch read from the primary alone could be delivered twice)."""
        if not self._replicas.enabled:
            self._record_hand_out(keys=keys, args=args)
            return
        self._durable_write("hand-out of a train batch", lambda pipe: pipe.execute_command(
            "EVAL", HAND_OUT_LUA, len(keys), *keys, *args),  # the same write again is a no-op
            deadline=deadline)

    def _notify(self, message: bytes) -> None:
        """Wake the producers early; they also poll, so a lost message only costs a poll."""
        try:
            publish(self.redis, self.keys.control, message)
        except REDIS_ERRORS as exc:
            logger.warning("could not notify producers (%s); they notice on their next poll", exc)

    def _durable_write(self, what: str, queue: Any, deadline: float | None = None) -> list[Any]:
        """Send the commands `queue(pipe)` puts in a pipeline and return their replies; with
        `min_replicas`, a WAIT follows them on the same connection. Connection errors, a
        failover and a WAIT that falls short are retried with backoff (every caller's
        commands are safe to repeat) for up to `write_timeout_s` (or until `deadline`, a
        get_batch's own), then raised
        (`NotReplicated` for missing replicas)."""
        if deadline is None:
            deadline = time.monotonic() + self.write_timeout_s
        backoff = Backoff(name=f"batcher {self.consumer}")
        while True:
            pipe = self.redis.pipeline(transaction=False)
            queue(pipe)
            size = len(pipe)
            sent_to = self._replicas.queue(pipe) if self._replicas.enabled else None
            try:
                replies = pipe.execute(raise_on_error=False)
                for reply in replies[:size]:
                    if isinstance(reply, Exception):
                        raise reply
                short = (self._replicas.shortfall(sent_to, replies) if self._replicas.enabled
                         else None)
                if short is None:
                    backoff.reset()
                    return replies[:size]
                self.unreplicated += 1
                problem: Exception = NotReplicated(f"{what} not acknowledged: {short}")
            except REDIS_ERRORS as exc:
                if not is_transient(exc):
                    raise
                problem = exc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise problem
            backoff.sleep_sync(f"{what}: {problem}", max_s=remaining)
            self.owner.note(self.redis)

    def _count(self, state: ModeState, name: str, amount: float = 1) -> None:
        state.counters[name] += amount  # reported with the next batch
        self.totals[name] += amount  # since this Batcher started
        self.stats.count(state.mode, name, amount)

    def _drop_entries(self, entries: list[Entry]) -> None:
        """Ack and delete `entries` in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        self._queue_drop(pipe, entries)
        pipe.execute()

    def _queue_drop(self, pipe: Any, entries: list[Entry]) -> None:
        """Ack and delete `entries`: one script call per `DROP_CHUNK` entries (a batch of
        1024 over 128 streams was 256 commands; now it is one)."""
        by_stream: dict[str, list[str]] = defaultdict(list)
        for entry in entries:
            by_stream[entry.stream].append(entry.entry_id)
        streams: list[str] = []
        args: list[Any] = [CONSUMER_GROUP]
        for stream, ids in by_stream.items():
            for at in range(0, len(ids), DROP_CHUNK):
                chunk = ids[at:at + DROP_CHUNK]
                streams.append(stream)
                args += [len(chunk), *chunk]
                if len(args) > DROP_CHUNK:
                    pipe.execute_command("EVAL", DROP_LUA, len(streams), *streams, *args)
                    streams, args = [], [CONSUMER_GROUP]
        if streams:
            pipe.execute_command("EVAL", DROP_LUA, len(streams), *streams, *args)

    def _dead_letter(self, dead: list[tuple[Entry, bytes, str]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for entry, data, reason in dead:
            logger.warning("dead-lettering %s %s: %s", entry.stream, entry.entry_id, reason)
            pipe.xadd(self.keys.dead, {"stream": entry.stream, "id": entry.entry_id,
                                       "reason": reason, "data": data}, maxlen=10_000,
                      approximate=True)
        self._queue_drop(pipe, [entry for entry, _, _ in dead])
        pipe.execute()
        self.totals["scheduler/dead_lettered"] += len(dead)

    def _timeout_message(self, state: ModeState, n: int, wanted: int, timeout_s: float) -> str:
        ready = self._ready_count(state)
        partial = len(state.groups) - ready
        producers = len(live_producers(self.redis, self.keys))
        if state.mode == "val":  # the pause holds train rollouts only
            where = f"val round {state.round}"
        else:
            paused = sorted(_text(p) for p in self.redis.smembers(self.keys.pause))
            where = f"version {self.version}; pause reasons: {paused or 'none'}"
        failed = int(self.totals["scheduler/failed_groups"])
        return (
            f"get_batch(mode={state.mode!r}) timed out after {timeout_s:g}s waiting for {n} "
            f"trajectories ({wanted} complete groups of {state.group_size}); have {ready} "
            f"complete and {partial} partial groups at {where}; groups dropped for a failed "
            f"member since this batcher started: {failed}; live producers: {producers}"
        )


def _is_int(value: Any) -> bool:
    """An integer (numpy's too), not a bool, a float or a string."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding makes many small dicts and the batcher holds thousands of trajectories, so
    the cyclic GC would rescan them over and over (measured: ~40% of the batcher's CPU).
    Messages have no reference cycles; collection resumes when the batch is handed out.

    What was allocated meanwhile is moved to the oldest generation unscanned (`freeze`, then
    `unfreeze`, which moves the frozen objects there): otherwise the first young collection
    after `enable` scans all of it (milliseconds on every hand-off). Cycles among them are
    still found by the next full collection. Skipped in a process that froze objects itself
    (its frozen set must stay frozen)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _iter_reply(reply: Any) -> list[tuple[str, list[Any]]]:
    """XREADGROUP's reply as [(stream name, [(id, fields), ...])] for RESP2 and RESP3."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(_text(k), v[0] if v and isinstance(v[0], list) else v)
                for k, v in reply.items()]
    return [(_text(stream), messages) for stream, messages in reply]

