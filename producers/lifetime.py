"""How long a producer runs: its stop event and its deadline (`seconds`), shared by its parts;
`within`, the producer's one way to await with a deadline; and `cancel_and_wait`, its one way
to end a task it started.

The stop event is set by a signal, `request_stop()`, the run's stop key or the deadline; every
wait of the producer's own loops ends when it is set.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

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


CANCEL_AGAIN_S = 0.05  # `cancel_and_wait`: a task still running this long after its cancel
# is cancelled again


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel `tasks` and wait until each has ended, cancelling again any that goes on.

    One `cancel()` is not always enough on Python 3.11: redis-py 8.1's asyncio client sends
    each command with `asyncio.wait_for(writer.drain(), ...)` (`redis/asyncio/connection.py`,
    `send_packed_command`), and `wait_for` drops a cancellation that lands in the loop step
    in which `drain()` finishes (CPython gh-86296, fixed in 3.12). A task looping on Redis
    commands whose cancel landed there played on: measured with a loop of `EXISTS` against
    a local Redis cancelled at a random moment, 29 of 40 cancels were lost
    (tests/test_guards.py). A loop with no stop of its own (`while True`, such as the policy's
    reader of the servers' versions) then never ended, and whoever awaited it hung."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
    for task in tasks:  # their errors are not this wait's business: retrieved, not raised
        if not task.cancelled():
            task.exception()


@dataclass
class Lifetime:
    stop: asyncio.Event
    deadline: float | None = None  # monotonic time `seconds` runs out (None: no limit)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    async def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, or less when the stop or the deadline comes first."""
        if self.deadline is not None:
            seconds = max(0.0, min(seconds, self.deadline - time.monotonic()))
        try:
            await within(self.stop.wait(), seconds)
        except TimeoutError:
            pass
