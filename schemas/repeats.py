"""Warnings that repeat, logged once per kind per interval with a count of the rest.

An env that always raises, or a first prompt that never fits the model, fails every
episode the same way: one warning per episode was hundreds of identical lines a minute
(found by an audit: 732 lines in 20 s). `Repeats.warning` logs the first line of a kind at
once and then at most one every `every_s`, saying how many like it were held back; the
counters (`rollstream_*_total`, batch metrics) still count every one. A kind is the line
with its numbers masked, so "env 3 episode 7" and "env 12 episode 9" are one kind.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

_NUMBERS = re.compile(r"\d+")
MAX_KINDS = 256  # kinds remembered; past it the oldest is forgotten (logged again when seen)


class Repeats:
    def __init__(self, logger: logging.Logger, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self._logger = logger
        self.every_s = every_s
        self._clock = clock
        self._kinds: dict[str, list[float]] = {}  # kind -> [last logged at, held back since]

    def warning(self, message: str) -> bool:
        """Log `message` unless one of its kind was logged within `every_s` (then count it).
        True when it was logged."""
        kind = _NUMBERS.sub("#", message)
        now = self._clock()
        seen = self._kinds.get(kind)
        if seen is not None and now - seen[0] < self.every_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            message += (f" ({seen[1]:.0f} more like it in the last {now - seen[0]:.0f}s "
                        "not logged)")
        self._kinds.pop(kind, None)  # re-inserted last: the dict stays oldest-first
        self._kinds[kind] = [now, 0]
        if len(self._kinds) > MAX_KINDS:
            del self._kinds[next(iter(self._kinds))]
        self._logger.warning("%s", message)
        return True
