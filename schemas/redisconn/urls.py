"""Redis URLs: the forms rollstream takes, their checks, and masking for messages.

- `redis://[[user]:password@]host[:port][/db]` (`rediss://` with TLS): one server, or any
  node of a Redis Cluster (detected when the client connects; a cluster has only db 0).
- `unix://[[user]:password@]/path/to/redis.sock[?db=N]`: one server on a unix socket.
- `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/SERVICE[/db]`
  (`rediss+sentinel://` with TLS): the primary that these sentinels name for SERVICE;
  the sentinel port defaults to 26379. The password is the data nodes'; sentinels that
  need one of their own read it from `ROLLSTREAM_SENTINEL_PASSWORD`.

Query options are the connection's own (`?socket_timeout=5`); an unknown one is an error
naming it (redis-py would pass it on and fail later with a traceback). A password never
travels in a query option: it belongs in the user part or `ROLLSTREAM_REDIS_PASSWORD`.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.connection import URL_QUERY_ARGUMENT_PARSERS, Connection, SSLConnection

from schemas.errors import ConfigError

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES)
SENTINEL_PORT = 26379
SENTINEL_FORM = "redis+sentinel://HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]"


class RedisUrlError(ConfigError):
    """A Redis URL that cannot be used; the message shows it masked."""


def mask_url(url: str) -> str:
    """The URL with its password (if any) replaced by `***` (any scheme, several hosts).

    The user part ends at the last `@` before the query, not at the first `/`: a password
    typed with a raw `/` (it should be `%2F`) makes the URL unparsable, and the message that
    says so must not show it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    before_query, query_mark, query = rest.partition("?")
    query = _mask_query(query)
    userinfo, at, tail = before_query.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if at and colon:
        before_query = f"{user}:***@{tail}"
    return f"{scheme}://{before_query}{query_mark}{query}"


def _mask_query(query: str) -> str:
    """A query with the value of every `...password=` option replaced by `***` (redis-py
    takes `?password=`; rollstream refuses it, and the message must not show it)."""
    if "password" not in unquote(query).lower():
        return query
    out = []
    for option in query.split("&"):
        name, eq, _ = option.partition("=")
        out.append(f"{name}=***" if eq and "password" in unquote(name).lower() else option)
    return "&".join(out)


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_sentinel_url(url: str) -> bool:
    return scheme_of(url) in SENTINEL_SCHEMES


def check_url(url: str | None) -> str:
    """The URL if rollstream can use it, else `RedisUrlError` naming it (masked)."""
    if not url:
        raise RedisUrlError("no Redis URL: pass --redis-url, set ROLLSTREAM_REDIS_URL or "
                            "REDIS_URL, or give the --config file a redis_url")
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        raise RedisUrlError(f"bad Redis URL {mask_url(url)!r}: the scheme must be one of "
                            f"{', '.join(s + '://' for s in SCHEMES)}")
    if scheme != "unix":
        _check_user_part(url)
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
        return url
    try:
        options = redis.connection.parse_url(url)
    except ValueError as exc:
        raise RedisUrlError(f"bad Redis URL {mask_url(url)!r}: {exc}") from None
    if scheme in ("redis", "rediss"):
        _check_host_and_db(url)
    _check_options(url, options.get("connection_class", Connection))
    return url


def _check_user_part(url: str) -> None:
    """A `/` typed raw in the password ends the host part early, and redis-py's complaint
    (about the port or the host it then sees) would quote a piece of the password."""
    userinfo = url.partition("://")[2].partition("?")[0].rpartition("@")[0]
    if "/" in userinfo:
        raise RedisUrlError(f"bad Redis URL {mask_url(url)!r}: its user part holds a raw '/'; "
                            "write the password's '/' as %2F (or set ROLLSTREAM_REDIS_PASSWORD)")


def _check_host_and_db(url: str) -> None:
    """A server URL names its host, and its path is at most a database number: redis-py
    would take `redis://` as localhost and `/abc` as db 0 without a word."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise RedisUrlError(f"bad Redis URL {mask_url(url)!r}: no host "
                            "(redis://[[user]:password@]HOST[:PORT][/DB])")
    db = unquote(parts.path)[1:]
    if db and not db.isdigit():
        raise RedisUrlError(f"bad Redis URL {mask_url(url)!r}: the path must be a database "
                            f"number, not {db!r}")


@functools.cache
def _allowed_options(connection_class: type) -> frozenset[str]:
    """Query options a connection of this class takes (its constructors' parameters).
    redis-py's own classes only: `object.__init__`'s signature would be parsed from text
    with `ast`, which CPython 3.11 cannot do in two threads at once (producer threads)."""
    names = set(URL_QUERY_ARGUMENT_PARSERS)
    for cls in inspect.getmro(connection_class):
        init = cls.__dict__.get("__init__")
        if init is not None and cls.__module__.startswith("redis"):
            names.update(p for p in inspect.signature(init).parameters
                         if p not in ("self", "args", "kwargs"))
    return frozenset(names - {"password", "username", "host", "port", "path",
                              "connection_class"})


def _check_options(url: str, connection_class: type) -> None:
    allowed = _allowed_options(connection_class)
    for name in parse_qs(urlsplit(url).query):
        if name in ("password", "username"):
            raise RedisUrlError(
                f"bad Redis URL {mask_url(url)!r}: put the {name} in the URL's user part "
                f"(redis://user:password@host) or ROLLSTREAM_REDIS_PASSWORD, not in "
                f"'?{name}='")
        if name not in allowed:
            raise RedisUrlError(
                f"bad Redis URL {mask_url(url)!r}: unknown option {name!r}; a Redis Cluster "
                f"needs no option (any node's redis:// URL is detected as one), Sentinel is "
                f"{SENTINEL_FORM}")


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed `redis+sentinel://` URL."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    ssl: bool = False
    username: str | None = None
    password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # connection options (query)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """`redis+sentinel://[[user]:password@]h1[:p1][,h2[:p2]...]/SERVICE[/DB][?options]`."""
    masked = mask_url(url)

    def bad(problem: str) -> RedisUrlError:
        return RedisUrlError(f"bad Sentinel URL {masked!r}: {problem} (the form is "
                             f"{SENTINEL_FORM})")

    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon and secret else None
    sentinels = []
    for item in filter(None, hosts.split(",")):
        host, colon, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host or (colon and not port.isdigit()):
            raise bad(f"bad sentinel address {item!r}")
        sentinels.append((host.strip("[]"), int(port) if port else SENTINEL_PORT))
    if not sentinels:
        raise bad("no sentinel host")
    parts = [unquote(p) for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise bad("the path must be /SERVICE or /SERVICE/DB")
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise bad(f"database {parts[1]!r} is not a number")
        db = int(parts[1])
    options: dict[str, Any] = {}
    ssl = scheme.lower() == "rediss+sentinel"
    if query:
        probe = f"{'rediss' if ssl else 'redis'}://h/?{query}"
        _check_options(url, SSLConnection if ssl else Connection)
        options = redis.connection.parse_url(probe)
        options = {k: v for k, v in options.items()
                   if k not in ("host", "connection_class", "db")}
    return SentinelUrl(sentinels, parts[0], db, ssl, username, password, options)


def is_unix_url(url: str) -> bool:
    return scheme_of(url) == "unix"

