"""A task repeated on a daemon thread for as long as its owner lives: a batcher's liveness
heartbeat, the model servers' watch.

The thread holds only a weak reference to the owner, so it ends at `stop()` or once the owner
is garbage (an owner dropped without being closed does not keep its thread, or what the
thread keeps alive in Redis, forever). Nothing the task raises ends the thread: each failure
is one log line, and the next round tries again (a cluster client that reaches no node
raises `RedisClusterException`, which is none of redis-py's `RedisError`s).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

Owner = TypeVar("Owner")


class Periodic(Generic[Owner]):
    """`task(owner)` every `interval_s` from `start()` until `stop()` or the owner is gone;
    a failed round is logged at `log_level` with `what` and its cause."""

    def __init__(self, owner: Owner, task: Callable[[Owner], object], interval_s: float, *,
                 name: str, what: str, log_level: int = logging.WARNING):
        self._owner = weakref.ref(owner)
        self._task = task
        self.interval_s = interval_s
        self._name, self._what, self._log_level = name, what, log_level
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread, unless it runs already (a thread that ended is replaced)."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread, waiting for a round in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            owner = self._owner()
            if owner is None:
                return
            try:
                self._task(owner)
            except Exception as exc:
                logger.log(self._log_level, "%s failed: %s: %s", self._what,
                           type(exc).__name__, " ".join(str(exc).split()))
            del owner  # no strong reference while waiting for the next round
