"""Project exceptions, in one place: every part raises these, never bare Exceptions."""

from __future__ import annotations


class RollstreamError(Exception):
    """Base of every rollstream error."""


class ConfigError(RollstreamError, ValueError):
    """A config that cannot run; the message names the field."""


class DecodeError(RollstreamError, ValueError):
    """A stream entry that is not a valid trajectory message; the message says why."""


class BatchTimeout(RollstreamError, TimeoutError):
    """`get_batch` ran out of time; the message says what it was waiting for."""


class RedisSetupError(RollstreamError):
    """The Redis server could not be reached or started; the message names the URL."""
