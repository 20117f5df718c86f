"""What a batcher tells the run: its config, policy versions and weights, the sync pause's
lift, val rounds, the stop.

The config is published at start (producers read it from Redis; a run name in use with a
config it cannot resume is refused). A version is published only over the one before it,
with its weights, in one script (`PUBLISH_LUA`), fenced by the batcher's name. If Redis lost
the run's keys (a restart without persistence) or went back to an older state, what the
trainer knows is put back: config, version, consumer groups, the last weights.
"""

from __future__ import annotations

import logging
from typing import Any

from consumer.liveness import Heartbeat
from consumer.state import BatcherState, ModeState
from consumer.writes import Writer
from schemas.config import RolloutConfig
from schemas.errors import RunConflict, VersionConflict
from schemas.keys import CONSUMER_GROUP, Keys
from schemas.redisconn import REDIS_ERRORS, publish, queue_publish, transaction

logger = logging.getLogger(__name__)

WEIGHTS_KEPT = 3  # the last weights published that stay in Redis (versions without any skipped)
MAX_WEIGHTS_BYTES = 64 * 2**20  # a Redis value is no place for a real checkpoint

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


class Publisher:
    """The run's shared keys, as one batcher (`index`) writes them. `publish_config`: whether
    this batcher owns the config (publishes it, and puts the run back when Redis lost it)."""

    def __init__(self, redis: Any, keys: Keys, config: RolloutConfig, shared: BatcherState, *,
                 index: int, streams: list[str], alive: Heartbeat, writer: Writer,
                 publish_config: bool):
        self.redis = redis
        self.keys = keys
        self.config = config
        self._shared = shared
        self._consumer = shared.consumer
        self.index = index
        self._streams = streams  # every stream this batcher reads, of every mode
        self._alive = alive
        self._writer = writer
        self._owns_config = publish_config
        self._last_weights: tuple[int, bytes] | None = None  # put back if Redis loses them

    def start(self) -> None:
        """Check the run's published config against this one, publish it (if owned), create
        the consumer groups, and read the version."""
        self._check_published_config()
        if self._owns_config:
            self._publish_config()
        self.create_groups()
        self._shared.version = int(self.redis.get(self.keys.version) or 0)

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
        pipe.setnx(keys.version, self._shared.version)
        pipe.setnx(keys.val_round, 0)
        pipe.delete(keys.stop)
        queue_publish(pipe, keys.control, b"version")
        pipe.execute()

    def sync_version(self) -> None:
        """Read the version; if the run's keys are gone (a Redis restarted without
        persistence), put back what the trainer knows: config, version, consumer groups."""
        raw = self.redis.get(self.keys.version)
        if raw is not None and int(raw) < self._shared.version and self._owns_config:
            self._put_version_back(int(raw))
            return
        if raw is not None:
            self._shared.version = int(raw)
            return
        if self.redis.get(self.keys.config) is not None or not self._owns_config:
            self.redis.setnx(self.keys.version, self._shared.version)
            return
        logger.warning("run %s: its keys are gone (Redis restarted without persistence?); "
                       "restoring config, version %d and consumer groups; trajectories that "
                       "were in Redis are lost", self.keys.run, self._shared.version)
        self._publish_config()
        self.create_groups()
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
            "expire instead of training twice", self.keys.run, found, self._shared.version,
            self._shared.version)
        self.redis.eval(RAISE_VERSION_LUA, 1, self.keys.version, self._shared.version)
        self._restore_weights()
        publish(self.redis, self.keys.control, b"version")

    def _restore_weights(self) -> None:
        """Put back the weights of this trainer's version if Redis lost them (they were
        published with it: producers of a learning policy wait for them)."""
        if self._last_weights is not None and self._last_weights[0] == self._shared.version:
            self.redis.set(self.keys.weights(self._shared.version), self._last_weights[1], nx=True)

    def create_groups(self) -> None:
        """The consumer group `batcher` on every stream this batcher reads (made if missing)."""
        pipe = self.redis.pipeline(transaction=False)
        for stream in self._streams:
            pipe.xgroup_create(stream, CONSUMER_GROUP, id="0", mkstream=True)
        errors = [reply for reply in pipe.execute(raise_on_error=False)
                  if isinstance(reply, Exception)]
        for error in errors:
            # each carries the frames it was raised in, and through them this one: a cycle
            # that would keep this Publisher (and the heartbeat it holds, which beats while
            # it lives) alive until a full collection
            error.__traceback__ = None
        failed = next((error for error in errors if "BUSYGROUP" not in str(error)), None)
        if failed is not None:
            raise failed

    def publish_version(self, version: int, weights: bytes | None) -> int:
        """`Batcher.publish_version` once its arguments are checked: `version` over the one
        before it, with its weights if given; wakes the producers."""
        keys = self.keys
        script_keys = [keys.version, keys.weights(version), keys.weights_kept,
                       keys.batcher_alive(self._consumer)]
        args = [version, 1 if weights is not None else 0, weights if weights is not None else b"",
                WEIGHTS_KEPT, self._alive.mark]

        def publish() -> tuple[int, int]:
            (reply,) = self._writer.durable_write(
                f"publish of version {version}",
                lambda pipe: pipe.execute_command("EVAL", PUBLISH_LUA, len(script_keys),
                                                  *script_keys, *args))
            return int(reply[0]), int(reply[1])

        code, current = publish()
        if code == -3:  # this batcher's name is another's now (the script checked)
            self._alive.lose()
            self._alive.check()
        if code == -2 or (code == -1 and int(current) < self._shared.version):
            # no version key: Redis lost the run (restarted without persistence); an older
            # one: it lost writes. Either way, what this trainer knows goes back first
            self.sync_version()  # puts back config, version and groups, as get_batch does
            code, current = publish()
        if code < 0:
            raise VersionConflict(
                f"publish_version({version}): the run {keys.run!r} is at version {int(current)}; "
                f"only {int(current) + 1} can follow it (another trainer publishing?)")
        if weights is not None:
            self._last_weights = (version, weights)
        self._shared.version = version
        self.notify(b"version")
        return version

    def stop_run(self) -> None:
        """Tell every producer of the run to exit (a deliberate end of the run; a trainer
        that publishes the config again clears it)."""
        self.redis.set(self.keys.stop, 1)
        publish(self.redis, self.keys.control, b"stop")

    def resume_sync(self) -> None:
        """This batcher waits for a train batch again: the sync pause is lifted (producers
        run while any batcher waits; admission holds them to the current version)."""
        if not self.config.is_sync:
            return
        pipe = transaction(self.redis)
        pipe.srem(self.keys.sync_handed, self.index)
        pipe.srem(self.keys.pause, "sync")
        queue_publish(pipe, self.keys.control, b"pause")
        pipe.execute()

    def start_val_round(self, state: ModeState) -> None:
        """Ask the val envs for a new round (they play it once); `state` takes its number."""
        pipe = transaction(self.redis)
        pipe.incr(self.keys.val_round)
        pipe.delete(self.keys.cursor("val"))
        state.round = int(pipe.execute()[0])
        state.round_started = True
        publish(self.redis, self.keys.control, b"val_round")

    def notify(self, message: bytes) -> None:
        """Wake the producers early; they also poll, so a lost message only costs a poll."""
        try:
            publish(self.redis, self.keys.control, message)
        except REDIS_ERRORS as exc:
            logger.warning("could not notify producers (%s); they notice on their next poll", exc)
