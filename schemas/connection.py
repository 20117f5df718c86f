"""Redis connections of every part, made in one place: URL checks, password, masking.

A URL's password never reaches a log line, an argv or Redis: `mask_url` is what any message
prints. A password can also come from `ROLLSTREAM_REDIS_PASSWORD` (compose sets it beside a
password-free URL, so characters such as `@ / :` in a password need no URL escaping).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.exceptions import AuthenticationError, ResponseError

from schemas.errors import ConfigError

PASSWORD_ENV = "ROLLSTREAM_REDIS_PASSWORD"
SCHEMES = ("redis", "rediss", "unix")


class RedisUrlError(ConfigError):
    """A Redis URL that cannot be used; the message shows it masked."""


def mask_url(url: str) -> str:
    """The URL with its password (if any) replaced by `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def check_url(url: str | None) -> str:
    """The URL if rollstream can use it, else `RedisUrlError` naming it (masked)."""
    if not url:
        raise RedisUrlError("no Redis URL: pass --redis-url or set ROLLSTREAM_REDIS_URL")
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise RedisUrlError(f"bad Redis URL {mask_url(url)!r}: the scheme must be one of "
                            f"{', '.join(s + '://' for s in SCHEMES)}")
    try:
        redis.connection.parse_url(url)
    except ValueError as exc:
        raise RedisUrlError(f"bad Redis URL {mask_url(url)!r}: {exc}") from None
    return url


def _kwargs(url: str, options: dict[str, Any]) -> dict[str, Any]:
    password = os.environ.get(PASSWORD_ENV)
    if password and urlsplit(url).password is None and "password" not in options:
        options = {**options, "password": password}
    return options


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A `redis.Redis` for `url` (checked), with the password from the environment if the
    URL has none."""
    check_url(url)
    return redis.Redis.from_url(url, **_kwargs(url, options))


def async_client(url: str, **options: Any) -> redis.asyncio.Redis:
    """The asyncio twin of `sync_client`."""
    check_url(url)
    return redis.asyncio.Redis.from_url(url, **_kwargs(url, options))


def is_auth_error(exc: BaseException) -> bool:
    """Whether `exc` says the credentials are wrong or missing: not transient, never retried."""
    if isinstance(exc, AuthenticationError):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))


def auth_message(url: str) -> str:
    """One line for an authentication failure, with the URL masked."""
    return (f"Redis at {mask_url(url)} refused the credentials: check the password in the URL "
            f"or {PASSWORD_ENV}")
