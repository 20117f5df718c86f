"""The older import path of the connection helpers; they live in `schemas.redisconn`."""

from schemas.redisconn import (
    PASSWORD_ENV,
    SCHEMES,
    RedisUrlError,
    async_client,
    auth_message,
    check_url,
    is_auth_error,
    mask_url,
    sync_client,
)

__all__ = ["PASSWORD_ENV", "SCHEMES", "RedisUrlError", "async_client", "auth_message",
           "check_url", "is_auth_error", "mask_url", "sync_client"]
