"""One run as the page sees it, refreshed from Redis every interval by one reader, however
many browsers look: the status snapshot (`rollstream.status.snapshot`, the same document as
`rollstream status --json`), the sampled trajectories (`SampleFeed`) and their history.

Everything it sends is built here once per refresh and masked (`redact`). It only reads:
the run's config, what `status` reads, and the sample stream; never a trajectory stream's
entries, never a write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from rollstream.status.snapshot import snapshot
from rollstream.ui.feed import OUTCOMES, SampleFeed
from rollstream.ui.history import History
from rollstream.ui.redact import config_summary, redact
from schemas.config import RolloutConfig
from schemas.errors import ConfigError
from schemas.keys import Keys
from schemas.redisconn import REDIS_ERRORS, SyncClient, error_text, mask_url

logger = logging.getLogger(__name__)


class RunView:
    """The run's state for the page; `refresh()` (blocking: run it off the event loop)."""

    def __init__(self, client: SyncClient, keys: Keys, config: RolloutConfig, redis_url: str, *,
                 keep: int = 1000, points: int = 900):
        self.client = client
        self.keys = keys
        self.config = config
        self._raw_config: Any = None  # the published config's bytes, as last read
        self.redis_url = mask_url(redis_url)
        self.feed = SampleFeed(keys, keep=keep)
        self.history = History(points)
        self.snapshot: dict[str, Any] = {}
        self.error: str | None = None
        self.updated_at: float | None = None
        self.refreshes = 0
        self.state: dict[str, Any] = self._state()

    def refresh(self) -> None:
        """Read the run once more; a Redis error is kept (shown on the page), not raised."""
        try:
            self._read_config()
            snap = snapshot(self.client, self.keys, self.config)
            self.feed.read(self.client)
        except REDIS_ERRORS as exc:
            self.error = f"cannot read the run from Redis at {self.redis_url}: {error_text(exc)}"
            logger.warning("%s", self.error)
        except Exception as exc:  # a record this version cannot read: the page says so, goes on
            self.error = f"cannot read the run: {type(exc).__name__}: {exc}"
            logger.exception("reading run %s failed", self.keys.run)
        else:
            now = time.time()
            self.snapshot, self.error, self.updated_at = snap, None, now
            self.history.add(now, snap, self.feed.recent)
            self.refreshes += 1
        self.state = self._state()

    def _read_config(self) -> None:
        """A trainer that starts the run again may publish another config: follow it."""
        raw = self.client.get(self.keys.config)
        if raw is None or raw == self._raw_config:
            return
        try:
            self.config = RolloutConfig.from_json(raw)
        except ConfigError as exc:
            logger.warning("run %s: the published config cannot be read (%s); showing the "
                           "previous one", self.keys.run, exc)
        self._raw_config = raw

    def _state(self) -> dict[str, Any]:
        feed = self.feed
        return redact({
            "run": self.keys.run, "redis": self.redis_url, "updated_at": self.updated_at,
            "error": self.error, "refreshes": self.refreshes,
            "config": config_summary(self.config, self.keys.run), "snapshot": self.snapshot,
            "history": self.history.view(),
            "samples": {"received": feed.received, "undecodable": feed.undecodable,
                        "kept": len(feed.trajectories), "groups": len(feed.groups),
                        "tags": feed.tags(), "tools": tool_counts(feed.trajectories.values())},
        })

    def groups(self, *, tag: str | None, outcome: str, mode: str | None,
               limit: int) -> dict[str, Any]:
        members = {mode_: self.config.manager(mode_).members for mode_ in self.config.modes()}
        groups = self.feed.groups_view(tag=tag, outcome=outcome, mode=mode, limit=limit,
                                       members=members)
        return redact({"groups": groups, "tags": self.feed.tags(), "outcomes": list(OUTCOMES),
                       "received": self.feed.received})

    def trajectory(self, uid: str) -> dict[str, Any] | None:
        sample = self.feed.trajectories.get(uid)
        return None if sample is None else redact(sample)


def tool_counts(samples: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Tool calls run and malformed (`producers/tools/loop.py` records both on a step) over
    the samples the page keeps: a parser that never matches shows as malformed at once."""
    calls = malformed = 0
    for sample in samples:
        for step in sample.get("steps") or ():
            calls += int(step.get("tool_calls") or 0)
            malformed += int(step.get("tool_malformed") or 0)
    return {"calls": calls, "malformed": malformed}
