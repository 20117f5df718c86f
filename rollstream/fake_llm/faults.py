"""Faults the stand-in injects into chat requests: 500s, hangs and dropped connections at a
rate (`error_rate`, `hang_rate`, `drop_rate`), exactly the next N requests (`fail_next`,
`POST /admin/faults {"kind", "count"}`), or every request whose body carries a marker
(`fail_marked`: a request the server cannot serve, whatever the retries)."""

from __future__ import annotations

import asyncio
import collections
import random
import threading
from typing import TYPE_CHECKING, Any

from rollstream.fake_llm.flavors import Refusal
from rollstream.fake_llm.options import FakeLLMOptions
from rollstream.fake_llm.responses import json_response

if TYPE_CHECKING:
    from aiohttp import web

FAULT_KINDS = ("500", "503", "400", "hang", "drop", "bad_shape")


class Faults:
    """Which fault, if any, the next chat request gets."""

    def __init__(self, options: FakeLLMOptions):
        self.options = options
        self._scripted: collections.deque[str] = collections.deque()
        self._marked: bytes | None = None  # requests carrying this are answered `_status`
        self._status = 502
        self._rng = random.Random(options.seed ^ 0xFA17)
        self._lock = threading.Lock()

    @property
    def scripted(self) -> int:
        return len(self._scripted)

    def fail_next(self, kind: str, count: int = 1) -> None:
        """Answer the next `count` chat requests with a fault: 500 (the server's own error),
        503 (busy), 400, hang, drop, or bad_shape (HTTP 200, JSON that is no completion:
        `{"choices": ["x"]}`)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {kind!r} is not one of {', '.join(FAULT_KINDS)}")
        with self._lock:
            self._scripted.extend([kind] * count)

    def fail_marked(self, marker: bytes | str | None, status: int = 502) -> None:
        """Answer every chat request whose body carries `marker` with HTTP `status`; None:
        stop."""
        self._marked = marker.encode() if isinstance(marker, str) else marker
        self._status = status

    def pick(self, raw: bytes, stats: collections.Counter[str]) -> str | None:
        """The fault of this request (counted in `stats`), or None."""
        kind = self._choose(raw)
        if kind is not None:
            stats[f"fault:{kind}"] += 1
        return kind

    def _choose(self, raw: bytes) -> str | None:
        if self._marked is not None and self._marked in raw:
            return "marked"
        with self._lock:
            if self._scripted:
                return self._scripted.popleft()
        opts = self.options
        if opts.error_rate or opts.hang_rate or opts.drop_rate:
            x = self._rng.random()
            for kind, rate in (("500", opts.error_rate), ("hang", opts.hang_rate),
                               ("drop", opts.drop_rate)):
                if x < rate:
                    return kind
                x -= rate
        return None

    async def respond(self, kind: str, request: web.Request, server: Any
                      ) -> web.StreamResponse:
        """The answer of a fault (a hang is the server's: it waits like a generation);
        `server` is the FakeLLMServer, which shapes errors as its flavor does."""
        if kind == "marked":
            return server.refused(Refusal(self._status, "upstream worker crashed"
                                          if self._status == 502 else "internal error",
                                          "InternalServerError"))
        if kind == "500":
            return server.refused(Refusal(500, "injected fault", "InternalServerError"))
        if kind == "503":
            return server.refused(Refusal(503, "injected: busy", "ServiceUnavailableError"))
        if kind == "400":
            return server.refused(Refusal(400, "injected bad request"))
        if kind == "bad_shape":
            return json_response({"choices": ["x"]})
        # drop: close the connection unanswered
        if request.transport is not None:
            request.transport.close()
        await asyncio.sleep(3600)  # cancelled once aiohttp sees the closed connection
        raise AssertionError("unreachable")  # pragma: no cover


def admin_faults_body(body: Any) -> tuple[str, int]:
    """(kind, count) of a `POST /admin/faults` body; ValueError, KeyError or TypeError when
    it is not one."""
    return str(body["kind"]), int(body.get("count", 1))
