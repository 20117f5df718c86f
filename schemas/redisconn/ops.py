"""Everything that depends on the kind of deployment, in one module: how a run's control
messages are published and heard, how a MULTI and a pipelined script are queued, how a write
waits for replicas, which node holds a run, and which errors a retry can cure.

- One server, and Sentinel (a `Redis` whose pool connects to the primary the sentinels name):
  PUBLISH/SUBSCRIBE; a pipeline travels on one connection.
- Redis Cluster (`RedisCluster`): SPUBLISH/SSUBSCRIBE, so a run's control messages stay on
  the shard that holds its slot instead of going to every node; a pipeline is split by node
  and each node's part travels on one connection. redis-py refuses `evalsha` and `publish`
  on a cluster pipeline (blocked methods); `execute_command("EVALSHA", ...)` routes by the
  script's keys like any keyed command. Its asyncio cluster MULTI is not usable (redis-py
  7.4 to 8.1): it fails on `smembers` (the reply callback is handed a `keys` argument it
  does not take), and it queues each command by running the cluster client on a new event
  loop in a thread, which breaks once the client must refresh its slot map after a failover
  ("attached to a different loop"). asyncio code reads atomically with a script instead;
  `transaction` refuses an asyncio cluster client.

Every key of a run shares the run's hash tag, so on a cluster a run lives on the one node
that owns its slot; MULTI, scripts and WAIT all run there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.exceptions import (
    AskError,
    ClusterError,
    ConnectionError,
    ReadOnlyError,
    RedisError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

from schemas.keys import Keys
from schemas.redisconn.clients import is_auth_error

logger = logging.getLogger(__name__)

CLUSTER_CLIENTS = (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)
CLUSTER_PIPELINES = (redis.cluster.ClusterPipeline, redis.asyncio.cluster.ClusterPipeline)
SENTINEL_POOLS = (redis.sentinel.SentinelConnectionPool,
                  redis.asyncio.sentinel.SentinelConnectionPool)

# What a Redis call can raise besides a bug: redis-py's errors, and a slot that no node
# serves for a moment (a cluster client raises it outside RedisError).
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, SlotNotCoveredError)
# What a retry can cure: the server or its owner is changing (failover, resharding).
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    ConnectionError, TimeoutError, ClusterError, TryAgainError, AskError, ReadOnlyError,
    SlotNotCoveredError)


def is_transient(exc: BaseException) -> bool:
    """A connection error, a failover or a slot on the move (MOVED, ASK, READONLY,
    TRYAGAIN, CLUSTERDOWN): back off and retry. Wrong credentials are never transient."""
    return isinstance(exc, TRANSIENT_ERRORS) and not is_auth_error(exc)


def is_cluster(client: Any) -> bool:
    return isinstance(client, CLUSTER_CLIENTS)


def _is_cluster_pipeline(pipe: Any) -> bool:
    return isinstance(pipe, CLUSTER_PIPELINES)


# -- publish, MULTI, scripts -----------------------------------------------------------------
def publish(client: Any, channel: str, message: bytes) -> Any:
    """Publish on a run's channel: SPUBLISH on a cluster, PUBLISH elsewhere (an awaitable
    for an asyncio client)."""
    if is_cluster(client):
        return client.spublish(channel, message)
    return client.publish(channel, message)


def queue_publish(pipe: Any, channel: str, message: bytes) -> None:
    """`publish` queued in a pipeline or MULTI (SPUBLISH is allowed in a cluster MULTI)."""
    if _is_cluster_pipeline(pipe):
        pipe.spublish(channel, message)
    else:
        pipe.publish(channel, message)


def transaction(client: Any) -> Any:
    """A MULTI/EXEC pipeline of a sync client. Every key in it must be one run's (one slot on
    a cluster). asyncio code uses a script (see the module doc)."""
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        raise TypeError("an asyncio RedisCluster's MULTI is not usable here; read or write "
                        "atomically with a script")
    return client.pipeline(transaction=True)


def queue_script(pipe: Any, sha: str, keys: list[str], args: list[Any]) -> None:
    """EVALSHA in a pipeline, on every kind of client."""
    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)


TIME_LUA = "return redis.call('TIME')"


def server_ms(client: Any, key: str) -> int:
    """The clock of the server that holds `key`, in milliseconds (the clock heartbeats are
    written with; on a cluster each node has its own, so TIME runs in a script keyed there)."""
    if is_cluster(client):
        seconds, micros = client.eval(TIME_LUA, 1, key)
    else:
        seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- where a run lives -----------------------------------------------------------------------
def owner(client: Any, key: str) -> str:
    """`host:port` of the server that holds `key` as this client knows it now, "" when it
    knows none yet (no round trip: a cluster client's slot map, a Sentinel pool's last
    primary)."""
    if is_cluster(client):
        try:
            return str(client.get_node_from_key(key).name)
        except SlotNotCoveredError:
            return ""
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SENTINEL_POOLS):
        address = pool.master_address
        return f"{address[0]}:{address[1]}" if address else ""
    options = client.get_connection_kwargs()
    return str(options.get("path") or f"{options.get('host')}:{options.get('port')}")


class OwnerWatch:
    """Remembers which server holds a run and logs one line when that changes."""

    def __init__(self, keys: Keys, who: str):
        self.keys = keys
        self.who = who
        self.current: str | None = None

    def note(self, client: Any) -> None:
        now = owner(client, self.keys.prefix)
        if not now:
            return  # not known right now (a slot in failover, no connection yet)
        if self.current is not None and now != self.current:
            logger.warning("%s: run %s is now served by %s (was %s)", self.who, self.keys.run,
                           now, self.current)
        self.current = now


@dataclass(frozen=True)
class Location:
    """Where a run lives, for `rollstream status` and `config check`."""

    kind: str  # "server", "cluster" or "sentinel"
    node: str
    replicas: int  # replicas of that node online (in sync)
    slot: int | None = None
    service: str | None = None

    def __str__(self) -> str:
        replicas = f"{self.replicas} replica{'s' if self.replicas != 1 else ''} online"
        if self.kind == "cluster":
            return f"Redis Cluster slot {self.slot} on node {self.node} ({replicas})"
        if self.kind == "sentinel":
            return f"Sentinel service {self.service!r}, primary {self.node} ({replicas})"
        return f"server {self.node} ({replicas})"


def locate(client: Any, keys: Keys) -> Location:
    """Which node holds run `keys.run` and how many replicas it has (sync client)."""
    if is_cluster(client):
        node = client.get_node_from_key(keys.prefix)
        info = client.info("replication", target_nodes=node)
        info = info.get(node.name, info) if isinstance(info, dict) else info
        return Location("cluster", node.name, _replicas_online(info),
                        slot=int(client.keyslot(keys.prefix)))
    info = client.info("replication")
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SENTINEL_POOLS):
        return Location("sentinel", owner(client, keys.prefix), _replicas_online(info),
                        service=pool.service_name)
    return Location("server", owner(client, keys.prefix), _replicas_online(info))


def _replicas_online(info: dict[str, Any]) -> int:
    return sum(1 for name, value in info.items()
               if name.startswith("slave") and isinstance(value, dict)
               and value.get("state") == "online")


# -- acknowledged means replicated ------------------------------------------------------------
class ReplicaWait:
    """`min_replicas`: a write counts as acknowledged once that many replicas have it.

    `queue(pipe)` goes at the end of a pipeline: an INCR of the run's wait mark, then WAIT,
    on the same connection as the writes before it (WAIT is refused inside a script and does
    not block inside MULTI). WAIT counts replicas that have the connection's last write;
    the INCR is a write every replica must receive after everything the primary did before,
    so the WAIT also covers a write whose reply was lost (made on another connection) when
    the resend, answered DUPLICATE, wrote nothing. (Redis up to 7.0 stamps that offset after
    any command, which covers it too; the mark does not depend on it.) On a cluster both go
    to the node that owns the run's slot, in that node's part of the pipeline (one
    connection); if the owner changed while the pipeline ran (a redirect), the count is not
    trusted."""

    def __init__(self, client: Any, keys: Keys, replicas: int, timeout_ms: int):
        self.client = client
        self.keys = keys
        self.replicas = replicas
        socket_timeout = client.get_connection_kwargs().get("socket_timeout")
        if socket_timeout:  # the reply must come before the client gives up on the socket
            timeout_ms = min(timeout_ms, max(1, int(socket_timeout * 1000 * 0.8)))
        self.timeout_ms = timeout_ms

    @property
    def enabled(self) -> bool:
        return self.replicas > 0

    def queue(self, pipe: Any) -> str | None:
        """Queue the mark and the WAIT; returns the owner they were sent to (cluster)."""
        pipe.incr(self.keys.wait_mark)
        if _is_cluster_pipeline(pipe):
            node = self.client.get_node_from_key(self.keys.prefix)
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms, target_nodes=node)
            return str(node.name)
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
        return None

    def shortfall(self, sent_to: str | None, replies: list[Any]) -> str | None:
        """None when the writes before the WAIT reached `replicas` replicas; else why not.
        `replies` are the pipeline's, the WAIT's last."""
        mark, count = replies[-2], replies[-1]
        for reply in (mark, count):
            if isinstance(reply, Exception):
                return f"WAIT failed: {reply}"
        if sent_to is not None and owner(self.client, self.keys.prefix) != sent_to:
            return f"the run moved from {sent_to} while waiting for replicas"
        if int(count) < self.replicas:
            return (f"on {int(count)} of {self.replicas} replica(s) after {self.timeout_ms} ms")
        return None


# -- the control channel ---------------------------------------------------------------------
class ControlSubscription:
    """An asyncio subscription to a run's channel: SSUBSCRIBE on a cluster (on the node that
    owns the run; when the client's slot map names another node, `get` raises
    ConnectionError so the caller subscribes again there), SUBSCRIBE elsewhere."""

    def __init__(self, client: Any, channel: str):
        self.client = client
        self.channel = channel
        self._pubsub: Any = None
        self._node: str | None = None

    async def open(self) -> None:
        if is_cluster(self.client):
            self._node = owner(self.client, self.channel)
            self._pubsub = self.client.pubsub()
            await self._pubsub.ssubscribe(self.channel)
        else:
            self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            await self._pubsub.subscribe(self.channel)

    async def get(self, timeout_s: float) -> Any:
        """The next message's data, or None after `timeout_s`."""
        if self._node is None:
            message = await self._pubsub.get_message(timeout=timeout_s)
        else:
            now = owner(self.client, self.channel)
            if now and now != self._node:
                raise ConnectionError(f"the run's channel moved from {self._node} to {now}")
            message = await self._pubsub.get_sharded_message(ignore_subscribe_messages=True,
                                                             timeout=timeout_s)
        return None if message is None else message.get("data")

    async def close(self) -> None:
        if self._pubsub is not None:
            await self._pubsub.aclose()
            self._pubsub = None
