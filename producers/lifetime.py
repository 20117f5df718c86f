"""How long a producer runs: its stop event and its deadline (`seconds`), shared by its parts.

The stop event is set by a signal, `request_stop()`, the run's stop key or the deadline; every
wait of the producer's own loops ends when it is set.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass
class Lifetime:
    stop: asyncio.Event
    deadline: float | None = None  # monotonic time `seconds` runs out (None: no limit)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    async def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, or less when the stop comes first."""
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass
