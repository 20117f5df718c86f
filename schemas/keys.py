"""Redis key names of a run, built in one place.

Every key starts with the run name in braces, a Redis Cluster hash tag, so a run's keys share
one slot and the multi-key commit script works on a cluster too.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import ConfigError

CONSUMER_GROUP = "batcher"  # the consumer group on every trajectory stream
BATCHER_CLOSED = b"closed"  # a batcher's liveness key after close(): its entries are claimable
MODES = ("train", "val")


_GLOB = frozenset("*?[]\\")  # special in a Redis SCAN/KEYS pattern


def check_run_name(run: str, where: str = "run name") -> str:
    """`run` if it can name a run's keys, else `ConfigError` naming `where` it came from (a
    brace or ':' would break the hash tag, a space the CLI's quoting)."""
    if not run or any(c in run for c in "{}: \t\n"):
        named = f"{where} {run!r}" if where else repr(run)
        raise ConfigError(f"{named}: a run name must be non-empty, without braces, ':' or "
                          "spaces")
    return run


@dataclass(frozen=True)
class Keys:
    """Key builder for one run: `Keys("exp1").stream("train", 17) == "{exp1}:traj:train:17"`."""

    run: str

    def __post_init__(self) -> None:
        check_run_name(self.run)

    @property
    def prefix(self) -> str:
        return "{" + self.run + "}"

    @property
    def config(self) -> str:  # string: the resolved config (JSON)
        return f"{self.prefix}:config"

    @property
    def version(self) -> str:  # string int: the policy version, owned by the trainer
        return f"{self.prefix}:version"

    @property
    def pause(self) -> str:  # set: reasons the train producers are paused (sync, operator)
        return f"{self.prefix}:pause"

    @property
    def sync_handed(self) -> str:  # set: batcher indexes that handed out this sync step's batch
        return f"{self.prefix}:sync_handed"

    @property
    def val_round(self) -> str:  # string int: the val round asked for
        return f"{self.prefix}:val_round"

    @property
    def control(self) -> str:  # pub/sub channel: wakes producers on version/pause/stop
        return f"{self.prefix}:control"

    @property
    def producers(self) -> str:  # zset: producer id -> last heartbeat (ms, server clock)
        return f"{self.prefix}:producers"

    @property
    def stop(self) -> str:  # string: set when the run is over; producers exit
        return f"{self.prefix}:stop"

    @property
    def producer_caps(self) -> str:  # hash: producer id -> its --max-shards (capped ones only)
        return f"{self.prefix}:producer_caps"

    @property
    def producer_stats(self) -> str:  # hash: producer id -> its stats record (msgpack)
        return f"{self.prefix}:producer_stats"

    @property
    def producer_seen(self) -> str:  # zset: producer id -> last stats record (ms, server clock)
        return f"{self.prefix}:producer_seen"

    @property
    def batchers(self) -> str:  # hash: batcher consumer name -> its state record (msgpack)
        return f"{self.prefix}:batchers"

    @property
    def wait_mark(self) -> str:  # string int: bumped right before each WAIT for replicas
        return f"{self.prefix}:wait_mark"

    @property
    def dead(self) -> str:  # stream: entries that failed to decode, with the reason
        return f"{self.prefix}:dead"

    @property
    def servers(self) -> str:  # hash: model server base URL -> the weight version it holds
        return f"{self.prefix}:servers"

    @property
    def samples(self) -> str:  # stream, capped: a sample of finished trajectories (`ui`)
        return f"{self.prefix}:samples"

    def stream(self, mode: str, group_id: int) -> str:  # stream: finished trajectories
        return f"{self.prefix}:traj:{mode}:{group_id}"

    def cursor(self, mode: str) -> str:  # hash: env id -> next episode k
        return f"{self.prefix}:cursor:{mode}"

    def lease(self, mode: str, shard: int) -> str:  # string, PX ttl: producer holding a shard
        return f"{self.prefix}:lease:{mode}:{shard}"

    def weights(self, version: int) -> str:  # string: policy weights (the trainer's bytes)
        return f"{self.prefix}:weights:{version}"

    @property
    def weights_kept(self) -> str:  # list: the versions whose weights are kept, newest first
        return f"{self.prefix}:weights_kept"

    def inflight(self, mode: str, consumer: str) -> str:  # string: a handed-out, unacked batch
        return f"{self.prefix}:inflight:{mode}:{consumer}"

    def batcher_alive(self, consumer: str) -> str:  # string, PX ttl: the batcher's process lives
        return f"{self.prefix}:alive:{consumer}"

    def batchers_alive_pattern(self) -> str:
        """SCAN pattern of the run's batcher liveness keys (`batcher_alive`)."""
        return self.pattern()[:-1] + "alive:*"

    def pattern(self) -> str:
        """SCAN pattern matching every key of the run and no other: the glob characters a run
        name may hold (`* ? [ ] \\`) are escaped, so `reset --run 'exp*'` never matches exp1's
        keys."""
        return "".join("\\" + c if c in _GLOB else c for c in self.prefix) + ":*"
