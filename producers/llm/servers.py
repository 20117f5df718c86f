"""The servers of a `ServerPool`: what is known of each (requests in flight, health, the
weight version it holds) and which one a request goes to.

`pick` hands out the up server with the fewest requests in flight (ties rotate), or for a
request of a session its own server within the load bound (`producers.llm.routing`), or a down
server whose cooldown is over to the one request that tries it, or waits until one of those
exists. A server is marked down by the pool after a failure (`mark_down`) and up when it
answers (`mark_up`); the cooldown before the next try starts at 0.25 s and doubles to 5 s,
so a dead server is not flooded. A server down for a timeout is tried with `GET /models`
(the pool's health check, 5 s at most), not with a turn, which would wait out the timeout
there. One log line when every server is down, one when a server is back.

Versions: `set_versions` records which weight version each server holds (and the model name
that gets it, a vLLM LoRA adapter per version); `pick(min_version=v)` hands out only servers
holding at least `v` and waits (one log line) while none does. Where the trainer has loaded
weights into some servers, one without a record (it missed those updates) is not used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from producers import metrics
from producers.lifetime import within
from producers.llm import routing
from producers.llm.dialects import LLAMA_SERVER, OTHER, Dialect
from producers.llm.replies import Transient
from schemas.errors import PolicyError
from schemas.policy import ServerRecord

logger = logging.getLogger(__name__)

UNRECORDED = ("no weight version recorded for it where the run's other servers have one (it "
              "missed their updates): not used until the trainer's ModelServers loads it")
HUNG_PROBE_S = 5.0  # a server set aside for a timeout must answer GET /models within this
COOLDOWN_S = 0.25  # a server marked down is tried again after this; doubles
COOLDOWN_MAX_S = 5.0
VERSION_RECHECK_S = 1.0  # a request waiting for a server's version looks again at least this
# often (`set_versions` wakes it at once when a version changes)

HealthCheck = Callable[["Server"], Awaitable["list[dict[str, Any]] | str"]]  # GET /models: its
# model cards, or why it does not answer


@dataclass(eq=False)
class Server:
    """One model server and what the pool knows of it."""

    base_url: str
    inflight: int = 0
    down: bool = False
    retry_at: float = 0.0  # when down: the monotonic time of the next try
    probing: bool = False  # when down: a request is trying it now
    downs: int = 0  # times marked down in a row (the cooldown doubles)
    served: int = 0
    version: int | None = None  # the weight version it holds, as recorded (None: unknown)
    model: str | None = None  # the model name requests name to get that version (None: the
    # pool's model; a LoRA adapter's name on vLLM)
    reports: bool = False  # recorded as reporting `weight_version` in each answer (SGLang)
    loaded_at: float | None = None  # when its record's load was recorded (`ServerRecord`)
    down_reason: str = ""  # when down: why (the failure that set it aside)
    hung: bool = False  # down for a timeout: probed with `GET /models`, not with a turn
    # what the pool learnt of it (producers.llm.adapt): which server it is, its context
    # window, the fields its requests get or lose, what was said of its answers
    dialect: Dialect = OTHER
    context_len: int | None = None
    adds: dict[str, Any] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    said: set[str] = field(default_factory=set)
    learning: bool = True  # its answers are still looked at (adapt.learn)

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def completions_url(self) -> str:
        """Where token-id prompts go (producers.llm.tito): `/completions`, and llama-server's
        own `/completion` beside its `/v1` (its OpenAI one gives no exact ids)."""
        if self.dialect is LLAMA_SERVER:
            root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
            return f"{root}/completion"
        return f"{self.base_url}/completions"

    @property
    def models_url(self) -> str:
        return f"{self.base_url}/models"


class ServerSet:
    """The pool's servers, their health and versions, and the choice of one per request (see
    the module docstring). `start()` on the event loop before the first `pick`; `close()`
    cancels the health checks in flight."""

    def __init__(self, base_urls: list[str], *, health_check: HealthCheck,
                 cooldown_max_s: float = COOLDOWN_MAX_S, sticky: bool = True,
                 load_factor: float = routing.LOAD_FACTOR):
        self.servers = [Server(url.rstrip("/")) for url in base_urls]
        self.sticky = sticky  # sessions to their own server (else: the least loaded)
        self.load_factor = load_factor
        self.cooldown_max_s = cooldown_max_s
        self.version_waiting = 0  # requests waiting for a server to hold their min_version
        self._version_wait_logged: int | None = None
        self._health_check = health_check
        self._changed: asyncio.Event | None = None  # set when a server comes back
        self._run_loads = False  # the trainer has recorded weights for a server of the pool
        self._probes: set[asyncio.Future[None]] = set()  # health checks of hung servers
        self._all_down = False
        self._turn = 0  # rotates ties between equally loaded servers

    def start(self) -> None:
        self._changed = asyncio.Event()

    async def close(self) -> None:
        for probe in list(self._probes):
            probe.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)

    @property
    def inflight(self) -> int:
        return sum(server.inflight for server in self.servers)

    def down(self) -> dict[str, str]:
        """The servers set aside now: base URL -> why."""
        down = {s.base_url: s.down_reason for s in self.servers if s.down}
        down.update({s.base_url: UNRECORDED for s in self.servers if self.unrecorded(s)})
        return down

    def unrecorded(self, server: Server) -> bool:
        """Not used: the trainer has loaded weights into the other servers, and this one has
        no record of any (it missed those updates, or came since): its turns would come from
        its launch weights, labelled with the run's version."""
        return self._run_loads and server.version is None

    def set_versions(self, records: dict[str, ServerRecord]) -> bool:
        """Each server's record from `{RUN}:servers`, by base URL (a server without a record:
        version unknown). True when something changed; waiting requests look again at once."""
        changed = False
        # the trainer loads weights into this pool's servers: one without a record missed
        # every update the others took (or was added since) and holds its launch weights
        self._run_loads = any(s.base_url in records for s in self.servers)
        for server in self.servers:
            record = records.get(server.base_url)
            seen = (None, None, False, None) if record is None else (
                record.version, record.model, record.reports, record.loaded_at)
            if seen != (server.version, server.model, server.reports, server.loaded_at):
                server.version, server.model, server.reports, server.loaded_at = seen
                changed = True
                if server.down:  # set aside for weights it lacked (or lost in a restart,
                    server.retry_at = time.monotonic()  # loaded again): try what it holds now
        if changed and self._changed is not None:
            self._changed.set()
        return changed

    # -- picking -----------------------------------------------------------------------------
    async def pick(self, avoid: Server | None, min_version: int | None = None,
                   session: str | None = None) -> Server:
        """A down server whose cooldown is over (as the one request trying it), else the up
        server with the fewest requests in flight (not `avoid` if another is up), else wait
        until one of those exists. With `min_version`, only servers holding at least that
        version count (a server with no recorded version holds 0, the initial weights).
        With `session` (and `sticky`), an up server is the session's own within the load
        bound (`producers.llm.routing`), counted in `/metrics` at a request's first pick."""
        assert self._changed is not None
        while True:
            now = time.monotonic()
            usable = [s for s in self.servers if not self.unrecorded(s)
                      and (min_version is None or (s.version or 0) >= min_version)]
            ready = [s for s in usable if s.down and not s.probing and s.retry_at <= now]
            for server in [s for s in ready if s.hung]:  # a turn would wait out the timeout
                server.probing = True
                probe = asyncio.ensure_future(self._probe_hung(server))
                self._probes.add(probe)
                probe.add_done_callback(self._probes.discard)
            ready = [s for s in ready if not s.hung]
            up = [s for s in usable if not s.down]
            if ready and (avoid not in ready or not up):
                server = min(ready, key=_retry_at)
                server.probing = True
                if session is not None and self.sticky and avoid is None:
                    metrics.llm_session(routing.outcome(session, server, self.servers))
                return server
            if len(up) > 1 and avoid in up:
                up.remove(avoid)
            if up and session is not None and self.sticky:
                server, how = routing.route(session, up, self.servers, self.load_factor)
                if avoid is None:
                    metrics.llm_session(how)
                return server
            if up:
                self._turn += 1
                start = self._turn % len(up)
                return min(up[start:] + up[:start], key=_inflight)
            if not usable:
                await self._wait_version(min_version or 0)
                continue
            if not self._all_down and all(s.down for s in self.servers):
                self._all_down = True
                logger.warning("all %d model servers are down; turns wait until one answers",
                               len(self.servers))
            waits = [s.retry_at for s in usable if not s.probing]
            timeout_s = max(0.01, min(waits) - now) if waits else self.cooldown_max_s
            await self._wait_change(timeout_s)

    async def _wait_version(self, min_version: int) -> None:
        """Wait for a look at the servers' versions (`set_versions`, or a recheck)."""
        if self._version_wait_logged != min_version:
            self._version_wait_logged = min_version
            logger.warning("no model server holds weight version >= %d yet (%s); turns wait "
                           "(require_version)", min_version, ", ".join(
                               f"{s.base_url}: {s.version if s.version is not None else '?'}"
                               for s in self.servers))
        self.version_waiting += 1
        try:
            await self._wait_change(VERSION_RECHECK_S)
        finally:
            self.version_waiting -= 1

    async def _wait_change(self, timeout_s: float) -> None:
        assert self._changed is not None
        self._changed.clear()
        try:
            await within(self._changed.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    # -- health ------------------------------------------------------------------------------
    def mark_down(self, server: Server, exc: Exception) -> None:
        server.down = True
        server.down_reason = str(exc)
        server.hung = isinstance(exc, Transient) and exc.timeout
        self._cool_down(server)
        if not self._all_down:
            others = "using the others" if len(self.servers) > 1 else "waiting for it"
            logger.warning("model server %s is down (%s); %s", server.base_url, exc, others)

    async def _probe_hung(self, server: Server) -> None:
        """A server set aside for a timeout, tried with `GET /models` (at most
        `HUNG_PROBE_S`) instead of a turn: a hung server would hold that turn for the whole
        timeout at every try. Answering marks it up; a turn that times out there again
        sets it aside again, for twice as long."""
        try:
            found = await within(self._health_check(server), HUNG_PROBE_S)
        except asyncio.TimeoutError:
            found = f"no answer to GET /models within {HUNG_PROBE_S:g}s"
        except PolicyError as exc:
            found = str(exc)
        if isinstance(found, str):
            self.probe_failed(server, Transient(found, timeout=True))
            return
        downs = server.downs
        self.mark_up(server)
        server.downs = downs  # a turn answered resets the cooldown, a health check does not

    def probe_failed(self, server: Server, exc: Exception) -> None:
        server.down_reason = str(exc)  # why now: the record may have moved on since
        self._cool_down(server)
        logger.debug("model server %s still down: %s", server.base_url, exc)
        assert self._changed is not None
        self._changed.set()  # waiters recompute when to look again

    def _cool_down(self, server: Server) -> None:
        """One more failure in a row: the next try waits twice as long (up to the cap)."""
        server.downs += 1
        server.probing = False
        server.retry_at = time.monotonic() + min(COOLDOWN_S * 2 ** (server.downs - 1),
                                                 self.cooldown_max_s)

    def mark_up(self, server: Server) -> None:
        if not server.down:
            server.downs = 0
            return
        server.down = server.probing = server.hung = False
        server.downs = 0
        server.down_reason = ""
        if self._all_down:
            self._all_down = False
            logger.warning("model server %s is back; turns resume", server.base_url)
        else:
            logger.info("model server %s is back", server.base_url)
        assert self._changed is not None
        self._changed.set()


def _inflight(server: Server) -> int:
    return server.inflight


def _retry_at(server: Server) -> float:
    return server.retry_at
