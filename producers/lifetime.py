"""How long a producer runs: its stop event and its deadline (`seconds`), shared by its parts;
and `within`, the producer's one way to await with a deadline.

The stop event is set by a signal, `request_stop()`, the run's stop key or the deadline; every
wait of the producer's own loops ends when it is set.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """`await awaitable`, raising `TimeoutError` after `timeout_s` (None: no deadline).

    Not `asyncio.wait_for`: on Python 3.11 it returns the result when the awaiting task is
    cancelled in the same loop step the awaited thing finishes, and the cancellation is lost
    (CPython gh-86296, fixed in 3.12). A producer stopping cancels its env tasks; an env task
    that lost its cancellation that way (an env server's reply landing with it) played on
    and waited for ever on a commit the stopped committer would never flush: the producer
    hung at exit (tests/test_envs_openenv.py's killed server, about one run in five).
    `asyncio.timeout` counts cancellations and never loses one. Python 3.10 has no
    `asyncio.timeout` and keeps `wait_for`.
    """
    if sys.version_info < (3, 11):  # pragma: no cover - CI runs 3.11
        return await asyncio.wait_for(awaitable, timeout_s)
    async with asyncio.timeout(timeout_s):
        return await awaitable


@dataclass
class Lifetime:
    stop: asyncio.Event
    deadline: float | None = None  # monotonic time `seconds` runs out (None: no limit)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    async def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, or less when the stop comes first."""
        try:
            await within(self.stop.wait(), seconds)
        except TimeoutError:
            pass
