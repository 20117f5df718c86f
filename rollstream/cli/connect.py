"""Which Redis and which run a command means, and its client: flags first, then the
environment, then a `--config` file's `redis_url` / `run`."""

from __future__ import annotations

import argparse

from schemas.config import RolloutConfig, resolve_redis_url, resolve_run
from schemas.errors import RedisSetupError
from schemas.redisconn import (
    REDIS_ERRORS,
    SyncClient,
    auth_message,
    check_url,
    error_text,
    is_auth_error,
    mask_url,
    sync_client,
)


def connect(url: str | None) -> SyncClient:
    """A client for `url` (any deployment), checked by a PING: a bad URL exits 2, an
    unreachable Redis or wrong credentials exit 1, each with one line (the URL masked)."""
    client = None
    try:
        client = sync_client(check_url(url), socket_timeout=10, socket_connect_timeout=5)
        client.ping()
    except REDIS_ERRORS as exc:
        if client is not None:
            client.close()
        if is_auth_error(exc):
            raise RedisSetupError(auth_message(str(url))) from None
        raise RedisSetupError(f"cannot reach Redis at {mask_url(str(url))}: "
                              f"{error_text(exc)}") from None
    return client


def lookup(args: argparse.Namespace) -> tuple[str | None, str]:
    """(Redis URL, run name) for the operator commands and `produce`: flags, the
    environment, then the `--config` file's `redis_url` / `run`."""
    config = RolloutConfig.from_yaml(args.config) if args.config else None
    return resolve_redis_url(args.redis_url, config), resolve_run(args.run, config)


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
