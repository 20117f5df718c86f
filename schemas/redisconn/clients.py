"""Clients for a URL, of whatever deployment is behind it: one server, a cluster, Sentinel.

`sync_client(url)` / `await async_client(url)` return redis-py's own client for the
deployment: `Redis` for one server (and for `unix://`), `RedisCluster` when the server at a
`redis://` URL says it is a cluster node (one `INFO cluster` when the client is made), and
a Sentinel-made `Redis` (`Sentinel(...).master_for(SERVICE)`) for `redis+sentinel://`.
Wrong credentials, an unreachable server or a bad URL surface here, as redis-py's errors
or `RedisUrlError`.

A URL's password never reaches a log line, an argv or Redis. It can also come from
`ROLLSTREAM_REDIS_PASSWORD` (compose sets it beside a password-free URL, so characters such
as `@ / :` in a password need no URL escaping); sentinels with a password of their own read
`ROLLSTREAM_SENTINEL_PASSWORD`.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.retry
import redis.sentinel
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AuthenticationError,
    RedisClusterException,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from schemas.redisconn.urls import (
    RedisUrlError,
    check_url,
    is_sentinel_url,
    is_unix_url,
    mask_url,
    parse_sentinel_url,
)

logger = logging.getLogger(__name__)

PASSWORD_ENV = "ROLLSTREAM_REDIS_PASSWORD"
SENTINEL_PASSWORD_ENV = "ROLLSTREAM_SENTINEL_PASSWORD"

SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster


def _kwargs(url: str, options: dict[str, Any]) -> dict[str, Any]:
    password = os.environ.get(PASSWORD_ENV)
    if password and urlsplit(url).password is None and "password" not in options:
        options = {**options, "password": password}
    return options


def _cluster_error(url: str, exc: RedisClusterException) -> RedisUrlError:
    return RedisUrlError(f"Redis URL {mask_url(url)!r} names a Redis Cluster node, and "
                         f"redis-py refuses it as a cluster URL: {exc} (a cluster has only "
                         "database 0: drop the /N)")


def _says_cluster(info: dict[str, Any]) -> bool:
    return str(info.get("cluster_enabled", "0")) == "1"


def _refused_database(url: str, exc: ResponseError) -> RedisUrlError | None:
    """The server refuses the SELECT of the URL's database: a cluster node (database 0 only),
    or a number the server does not have."""
    if "SELECT is not allowed in cluster mode" in str(exc):
        return RedisUrlError(f"Redis URL {mask_url(url)!r} names a Redis Cluster node: a "
                             "cluster has only database 0, drop the /N")
    if "DB index is out of range" in str(exc):
        return RedisUrlError(f"Redis URL {mask_url(url)!r} names a database number the "
                             "server does not have (redis.conf `databases`: 16 by default, "
                             "numbered 0-15)")
    return None


def bad_database(url: str, exc: BaseException) -> RedisUrlError | None:
    """`exc` says the server has no such database as the URL names (or is a cluster node,
    database 0 only): a bad URL, not worth retrying. redis-py's asyncio client reports a
    refused SELECT as a `ConnectionError` carrying the server's words."""
    if isinstance(exc, ResponseError | RedisConnectionError):
        return _refused_database(url, ResponseError(str(exc)))
    return None


def _select_checked(url: str, client: redis.Redis) -> None:
    """A `unix://` URL's database is selected on connecting, so a number the server lacks
    surfaces at the first command: PING now, and name a refused SELECT as a bad URL. A
    server not reachable yet is not this check's business: the first real command says so."""
    try:
        client.ping()
    except (RedisConnectionError, redis.TimeoutError):
        return
    except ResponseError as exc:
        refused = bad_database(url, exc)
        if refused is None:
            raise
        client.close()
        raise refused from None


# -- sync ------------------------------------------------------------------------------------
def sync_client(url: str, **options: Any) -> SyncClient:
    """redis-py's client for the deployment at `url` (checked; see the module doc)."""
    check_url(url)
    options = _kwargs(url, options)
    if is_sentinel_url(url):
        return _sentinel_sync(url, options)
    client = redis.Redis.from_url(url, **options)
    try:
        if is_unix_url(url):
            if client.connection_pool.connection_kwargs.get("db"):
                _select_checked(url, client)
            return client
        if not _is_cluster_node(client):
            return client
    except ResponseError as exc:
        client.close()
        raise _refused_database(url, exc) or exc from None
    client.close()
    try:
        return redis.cluster.RedisCluster.from_url(url, **options)
    except RedisClusterException as exc:
        raise _cluster_error(url, exc) from None


def _info_refused(exc: ResponseError) -> bool:
    """INFO denied by an ACL or renamed away: then it is no cluster node a client could use
    (a cluster client needs CLUSTER SLOTS anyway)."""
    return str(exc).startswith(("NOPERM", "unknown command"))


def _is_cluster_node(client: redis.Redis) -> bool:
    try:
        return _says_cluster(client.info("cluster"))
    except ResponseError as exc:
        if _info_refused(exc):
            return False
        raise


# redis-py's default retry of a connection (redis 8: 10 more tries, backoff from 10 ms up to 1 s)
_RETRY_BASE = getattr(redis.client, "DEFAULT_RETRY_BASE", 0.01)
_RETRY_CAP = getattr(redis.client, "DEFAULT_RETRY_CAP", 1)
_RETRY_COUNT = getattr(redis.client, "DEFAULT_RETRY_COUNT", 10)


class _SyncRetry(redis.retry.Retry):
    """redis-py's default retry of a connection, but never of refused credentials: its
    `AuthenticationError` is a `ConnectionError`, so a sentinel refusing the password was
    asked 11 times over ~4 s before the one line said so."""

    def __init__(self) -> None:
        super().__init__(ExponentialWithJitterBackoff(base=_RETRY_BASE, cap=_RETRY_CAP),
                         _RETRY_COUNT)

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None,
                        with_failure_count: bool = False) -> Any:
        return super().call_with_retry(do, fail, _not_auth(is_retryable), with_failure_count)


class _AsyncRetry(redis.asyncio.retry.Retry):
    """`_SyncRetry` for the asyncio clients."""

    def __init__(self) -> None:
        super().__init__(ExponentialWithJitterBackoff(base=_RETRY_BASE, cap=_RETRY_CAP),
                         _RETRY_COUNT)

    async def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None,
                              with_failure_count: bool = False) -> Any:
        return await super().call_with_retry(do, fail, _not_auth(is_retryable),
                                             with_failure_count)


def _not_auth(is_retryable: Any) -> Any:
    def retryable(exc: Exception) -> bool:
        if is_auth_error(exc):
            return False
        return is_retryable is None or bool(is_retryable(exc))
    return retryable


def _sentinel_sync(url: str, options: dict[str, Any]) -> redis.Redis:
    parsed = parse_sentinel_url(url)
    node = _sentinel_node_options(parsed, options)
    sentinel = redis.sentinel.Sentinel(
        parsed.sentinels, sentinel_kwargs={**_sentinel_options(parsed, options),
                                           "retry": _SyncRetry()}, **node)
    return sentinel.master_for(parsed.service, db=parsed.db)


def _sentinel_node_options(parsed: Any, options: dict[str, Any]) -> dict[str, Any]:
    node = {**parsed.options, **options}
    if parsed.password is not None:
        node["password"] = parsed.password
    if parsed.username is not None:
        node["username"] = parsed.username
    if parsed.ssl:
        node["ssl"] = True
    return node


def _sentinel_options(parsed: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Options of the connections to the sentinels themselves: timeouts and TLS, and their
    own password from the environment, never the data nodes' password."""
    keep = ("socket_timeout", "socket_connect_timeout", "socket_keepalive")
    out = {k: v for k, v in {**parsed.options, **options}.items() if k in keep}
    if parsed.ssl:
        out["ssl"] = True
    password = os.environ.get(SENTINEL_PASSWORD_ENV)
    if password:
        out["password"] = password
    return out


def run_client(target: str | Any, **options: Any) -> SyncClient:
    """A sync client for a URL, or the client given, made a `RedisCluster` when it is a plain
    `Redis` connected to a cluster node (a run's keys live on the node owning their slot)."""
    if isinstance(target, str):
        return sync_client(target, **options)
    if isinstance(target, redis.cluster.RedisCluster) or not isinstance(target, redis.Redis):
        return target
    pool = target.connection_pool
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        return target
    kwargs = dict(pool.connection_kwargs)
    if "path" in kwargs or not _is_cluster_node(target):
        return target
    logger.info("the Redis client given is connected to a cluster node (%s:%s); using a "
                "cluster client", kwargs.get("host"), kwargs.get("port"))
    if pool.connection_class is not None and issubclass(pool.connection_class,
                                                          redis.connection.SSLConnection):
        kwargs["ssl"] = True
    return redis.cluster.RedisCluster(**{k: v for k, v in kwargs.items() if k != "db"})


# -- async -----------------------------------------------------------------------------------
async def async_client(url: str, **options: Any) -> AsyncClient:
    """The asyncio twin of `sync_client` (a cluster client is initialized before it returns,
    so its slot map is known)."""
    check_url(url)
    options = _kwargs(url, options)
    if is_sentinel_url(url):
        return _sentinel_async(url, options)
    client = redis.asyncio.Redis.from_url(url, **options)
    try:
        if is_unix_url(url):
            if client.connection_pool.connection_kwargs.get("db"):
                await _select_checked_async(url, client)
            return client
        cluster = await _is_cluster_node_async(client)
    except ResponseError as exc:
        await client.aclose()
        raise _refused_database(url, exc) or exc from None
    except BaseException:
        await client.aclose()
        raise
    if not cluster:
        return client
    await client.aclose()
    allowed = set(inspect.signature(redis.asyncio.cluster.RedisCluster.__init__).parameters)
    try:
        made = _Cluster.from_url(
            url, **{k: v for k, v in options.items() if k in allowed})
    except RedisClusterException as exc:
        raise _cluster_error(url, exc) from None
    try:
        await made.initialize()
    except BaseException:
        await made.aclose()
        raise
    return made


async def _select_checked_async(url: str, client: redis.asyncio.Redis) -> None:
    """The asyncio twin of `_select_checked`. redis-py's asyncio connection wraps the refused
    SELECT in a `ConnectionError` carrying the server's words; those name a bad URL."""
    try:
        await client.ping()
    except (RedisConnectionError, redis.TimeoutError) as exc:
        refused = bad_database(url, exc)
        if refused is not None:
            await client.aclose()
            raise refused from None


def _closed_under_a_command(exc: AttributeError) -> bool:
    """redis-py's asyncio connection raises `AttributeError: 'NoneType' object has no
    attribute 'writelines'` (or `read...`) when another task disconnected it while a
    command was on its way, which its cluster client does to every connection of a node
    when the slot map changes (a failover). True for that (raised inside redis-py): a lost
    connection. Any other AttributeError is a bug and stays one."""
    if "'NoneType' object has no attribute" not in str(exc):
        return False
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    where = last.tb_frame.f_code.co_filename.replace(os.sep, "/") if last else ""
    return "/redis/" in where


@contextmanager
def _lost_connection_named() -> Iterator[None]:
    """Raise a connection closed under a command as the `ConnectionError` it is, which
    every caller retries."""
    try:
        yield
    except AttributeError as exc:
        if not _closed_under_a_command(exc):
            raise
        raise RedisConnectionError(f"connection closed under a command ({exc})") from exc


class _ClusterPipeline(redis.asyncio.cluster.ClusterPipeline):
    async def execute(self, raise_on_error: bool = True,
                      allow_redirections: bool = True) -> list[Any]:
        with _lost_connection_named():
            return await super().execute(raise_on_error, allow_redirections)


class _Cluster(redis.asyncio.cluster.RedisCluster):
    """redis-py's asyncio cluster client with its failover race named a connection error
    (`_closed_under_a_command`); seen once in a test that kills a primary mid-run, where it
    ended a producer's control poll with an AttributeError."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        with _lost_connection_named():
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None,
                 shard_hint: Any | None = None) -> redis.asyncio.cluster.ClusterPipeline:
        if shard_hint:  # refused, with redis-py's own message
            return super().pipeline(transaction, shard_hint)
        return _ClusterPipeline(self, transaction)  # type: ignore[abstract]


async def _is_cluster_node_async(client: redis.asyncio.Redis) -> bool:
    try:
        return _says_cluster(await client.info("cluster"))
    except ResponseError as exc:
        if _info_refused(exc):
            return False
        raise


def _sentinel_async(url: str, options: dict[str, Any]) -> redis.asyncio.Redis:
    parsed = parse_sentinel_url(url)
    node = _sentinel_node_options(parsed, options)
    sentinel = redis.asyncio.sentinel.Sentinel(
        parsed.sentinels, sentinel_kwargs={**_sentinel_options(parsed, options),
                                           "retry": _AsyncRetry()}, **node)
    return sentinel.master_for(parsed.service, db=parsed.db)


# -- errors ----------------------------------------------------------------------------------
# redis-py's "no master" errors, of its sync and its asyncio Sentinel (two classes)
_NO_MASTER = (redis.sentinel.MasterNotFoundError, redis.asyncio.sentinel.MasterNotFoundError)


def is_auth_error(exc: BaseException) -> bool:
    """Whether `exc` says the credentials are wrong or missing: not transient, never retried."""
    if isinstance(exc, AuthenticationError):
        return True
    if isinstance(exc, _NO_MASTER):
        # redis-py asks every sentinel and folds what each raised into this one error: a
        # sentinel that wants a password answers no master at all
        return "AuthenticationError" in str(exc)
    return isinstance(exc, ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))


def error_text(exc: BaseException) -> str:
    """`exc`'s message for one line: redis-py's sentinel errors end in the repr of a whole
    client (pools, connections, retry settings), hundreds of characters saying nothing."""
    return str(exc).split(" : <redis.", 1)[0]


def auth_message(url: str) -> str:
    """One line for an authentication failure, with the URL masked."""
    message = (f"Redis at {mask_url(url)} refused the credentials: check the password in the "
               f"URL or {PASSWORD_ENV}")
    if is_sentinel_url(url):
        message += f" (and for sentinels with a password of their own, {SENTINEL_PASSWORD_ENV})"
    return message
