"""The command line's exceptions, and which exceptions are a runtime failure (exit 1).

`rollstream.cli.main` turns them into exit statuses: `UsageError` and `ConfigError` exit 2 with
`rollstream: error: ...`, `RUNTIME_FAILURES` exit 1 with the exception's name and text.
"""

from __future__ import annotations

from schemas.errors import RollstreamError
from schemas.redisconn import REDIS_ERRORS

RUNTIME_FAILURES: tuple[type[Exception], ...] = (RollstreamError, *REDIS_ERRORS)  # exit 1


class UsageError(Exception):
    """A bad command line: exit status 2."""


class RunNotFound(RollstreamError):
    """An operator command named a run that has no published config: exit status 1."""
