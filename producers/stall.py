"""Notices when something blocks a producer's event loop, and says where.

Every env of a producer, its commits and its lease heartbeat share one asyncio event loop. A
policy whose `act` blocks (a `time.sleep`, a synchronous HTTP client, a model run in the
loop's thread) or an env whose `reset`/`step` blocks holds all of them: the producer shows
as live at 0 trajectories/s, and past `lease_ttl_s` its shards lapse to other producers. A
`LoopWatch` ticks on the loop and is checked from a thread of its own; when the loop has not
ticked for `threshold_s`, the thread logs one warning naming the code the loop's thread is
in at that moment (its innermost frames outside the standard library), and the stall is
counted once the loop runs again. The warning repeats at most every `REPEAT_S` (the stalls
in between are counted and said in the next one) and once more for a stall that outlasts
the lease ttl.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger(__name__)

STALL_WARN_S = 2.0  # a loop blocked this long is warned about (lease ttls under 6 s: ttl / 3)
REPEAT_S = 30.0  # at most one warning per this long (every stall is still counted)
WHERE_FRAMES = 3  # frames named in the warning, innermost first

_STDLIB = tuple(os.path.realpath(sysconfig.get_paths()[name]) + os.sep
                for name in ("stdlib", "platstdlib"))


def stall_threshold_s(lease_ttl_s: float) -> float:
    """How long the loop may be blocked before a warning: `STALL_WARN_S` (a val round's
    start resets hundreds of envs in one pass: ~0.5 s, ~1 s on a loaded machine), or a
    third of the lease ttl when that is shorter (the heartbeat's interval: one beat
    missed)."""
    return min(STALL_WARN_S, lease_ttl_s / 3)


class LoopWatch:
    """Watches one event loop from a daemon thread. `start()` on the loop; `stop()` anywhere.

    `stalls` (count), `stalled_s` (their total) and `longest_s` are read by the producer's
    counters; `on_stall(seconds, where)` is called on the loop once each stall is over.
    """

    def __init__(self, threshold_s: float, *, name: str, lease_ttl_s: float,
                 on_stall: Callable[[float, str], None] | None = None):
        self.threshold_s = threshold_s
        self.name = name
        self.lease_ttl_s = lease_ttl_s
        self.on_stall = on_stall
        self.stalls = 0
        self.stalled_s = 0.0
        self.longest_s = 0.0
        self._tick_s = threshold_s / 4
        self._last = time.monotonic()  # when the loop last ticked
        # (the tick it is blocked since, where its thread is): set by the watching thread
        self._blocked: tuple[float, str] | None = None
        self._past_ttl = False
        self._said = False  # the current stall's first warning was logged
        self._unwarned = 0  # stalls since the last warning
        self._warned_at = -REPEAT_S
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start ticking on the running loop and watching from a thread."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._last = time.monotonic()
        self._handle = self._loop.call_later(self._tick_s, self._tick)
        self._thread = threading.Thread(target=self._watch, daemon=True, name="loop-watch")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    # on the loop
    def _tick(self) -> None:
        now = time.monotonic()
        blocked, self._blocked = self._blocked, None
        if blocked is not None and blocked[0] == self._last:  # seen blocked: it is over now
            where = blocked[1]
            seconds = now - self._last - self._tick_s
            self.stalls += 1
            self.stalled_s += seconds
            self.longest_s = max(self.longest_s, seconds)
            if self._past_ttl and self._said:
                logger.warning("producer %s: its event loop ran again after %.1fs", self.name,
                               seconds)
            self._past_ttl = False
            if self.on_stall is not None:
                self.on_stall(seconds, where)
        self._last = now
        if not self._stop.is_set() and self._loop is not None:
            self._handle = self._loop.call_later(self._tick_s, self._tick)

    # on the watching thread
    def _watch(self) -> None:
        while not self._stop.wait(self._tick_s):
            last = self._last
            blocked_s = time.monotonic() - last - self._tick_s
            if blocked_s < self.threshold_s:
                continue
            blocked = self._blocked
            if blocked is None or blocked[0] != last:  # a new stall
                where = self._where()
                self._blocked = (last, where)
                self._first_warning(blocked_s, where)
            elif not self._past_ttl and blocked_s >= self.lease_ttl_s:
                self._past_ttl = True
                if not self._said:  # its first warning was held back (REPEAT_S): so is this
                    continue
                logger.warning(
                    "producer %s: its event loop is still blocked after %.0fs, past the lease "
                    "ttl (%gs): other producers take its shards and replay their episodes; "
                    "blocked in %s", self.name, blocked_s, self.lease_ttl_s, self._where())

    def _first_warning(self, blocked_s: float, where: str) -> None:
        now = time.monotonic()
        self._said = now - self._warned_at >= REPEAT_S
        if not self._said:
            self._unwarned += 1
            return
        more = (f" ({self._unwarned} more stall(s) since the last warning)"
                if self._unwarned else "")
        self._warned_at, self._unwarned = now, 0
        logger.warning(
            "producer %s: its event loop has been blocked for %.1fs, in %s%s. Every env of "
            "this producer, its commits and its lease heartbeat wait meanwhile: a policy's "
            "act must await its I/O (not block), and an env that blocks needs "
            "custom_envs.<tag>.threaded: true", self.name, blocked_s, where, more)

    def _where(self) -> str:
        """The innermost frames of the loop's thread outside the standard library."""
        frame = sys._current_frames().get(self._loop_thread)
        return describe_stack(frame) if frame is not None else "an unknown place"


def describe_stack(frame: FrameType | None, limit: int = WHERE_FRAMES) -> str:
    """`file:line in function` of the innermost `limit` frames outside the standard library,
    innermost first, joined by ' < ' (the standard library's innermost one if there is no
    other)."""
    named: list[str] = []
    innermost: str | None = None
    while frame is not None and len(named) < limit:
        code = frame.f_code
        text = f"{_short(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
        innermost = innermost or text
        if not _in_stdlib(code.co_filename):
            named.append(text)
        frame = frame.f_back
    return " < ".join(named) if named else innermost or "an unknown place"


def _in_stdlib(path: str) -> bool:
    """True for the standard library's files (asyncio's among them), not for installed
    packages, which a system Python keeps beneath it."""
    real = os.path.realpath(path)
    return real.startswith(_STDLIB) and "-packages" + os.sep not in real


def _short(path: str) -> str:
    """A path relative to the working directory when it is under it, else as given."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if relative.startswith("..") else relative
