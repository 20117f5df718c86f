"""A producer's client for its model servers: one asyncio HTTP session, many servers.

`ServerPool.chat(body)` posts a chat completion to the server with the fewest requests in
flight and returns its JSON answer with the server and latency. What can pass is retried and
what cannot is raised:
- a connection error, a 5xx, 408 or 429: retried on the same server with capped backoff, up
  to `max_retries` times, then the server is marked down and another one is used; a request
  answered 500 or 502 more often than every server's retry budget, each time by a server that
  answered other requests since this one's previous error there, is one they cannot serve:
  `EpisodeFailed` (an outage, where a server answers nobody, is waited out instead; 503, 504
  and 429 say the server is busy, not the request);
- a timeout (`timeout_s`): when another server is up, this one is marked down (a server
  that hung once is likely still hung: every later turn would wait out the timeout on it
  first) and the turn goes to another at once; else as above. A server down for a timeout
  is probed with `GET /models` (5 s at most), not with a turn;
- a 400 saying the request is longer than the context window: `ContextFull` (the episode
  ends truncated);
- any other 4xx, or a 2xx body that is not a completion: `EpisodeFailed`, never retried;
- a server that lost the weights it was recorded with (restarted: it answers with its launch
  weights, or 404 for the LoRA adapter the request named): marked down at once, another one
  is used; the trainer's `ModelServers` loads them again (or its next update does).
A server marked down is tried again after a cooldown (0.25 s doubling to 5 s) by a single
request, so a dead server is not flooded. While every server is down, requests wait: one log
line when all are down, one when a server is back.

Weight versions: `set_versions` tells the pool which version each server holds (what the
trainer recorded in `{RUN}:servers`) and which model name gets it (a vLLM LoRA adapter per
version); a request then names that model on that server, and its `Answer` carries the
version. `chat(body, min_version=v)` sends only to a server holding at least `v` and waits
(one log line) while none does. A server recorded as reporting its version (SGLang,
`weight_version` set by the update) that answers without one has lost those weights: its
answer is not used.

JSON with orjson: decoding a reply (logprobs, ~700 prompt ids) took 69 us with the
standard library and 19 us with orjson here. aiohttp, not httpx: measured against the
stand-in server (`python bench/bench_llm.py --compare-clients`), aiohttp's client cost
0.34-0.47 ms of CPU per request with 1,000 in flight and httpx's 19-26 ms (20 ms with 100).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from producers import metrics
from schemas.errors import ContextFull, EpisodeFailed, PolicyError
from schemas.policy import (
    ServerRecord,
    error_message,
    reported_weight_version,
    request_headers,
)

logger = logging.getLogger(__name__)

TRANSIENT_4XX = frozenset((408, 429))  # timeouts and rate limits: worth another try
BACKOFF_S = 0.05  # first retry on the same server; doubles
BACKOFF_MAX_S = 2.0
UNRECORDED = ("no weight version recorded for it where the run's other servers have one (it "
              "missed their updates): not used until the trainer's ModelServers loads it")
HUNG_PROBE_S = 5.0  # a server set aside for a timeout must answer GET /models within this
COOLDOWN_S = 0.25  # a server marked down is tried again after this; doubles
COOLDOWN_MAX_S = 5.0
VERSION_RECHECK_S = 1.0  # a request waiting for a server's version looks again at least this
# often (`set_versions` wakes it at once when a version changes)


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
    down_reason: str = ""  # when down: why (the failure that set it aside)
    hung: bool = False  # down for a timeout: probed with `GET /models`, not with a turn

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def models_url(self) -> str:
        return f"{self.base_url}/models"


@dataclass
class Answer:
    """A server's answer to a chat request."""

    data: dict[str, Any]
    server: Server
    latency_s: float  # of the attempt that answered
    attempts: int
    version: int | None = None  # the version recorded for what answered: the adapter's the
    # request named (or the base model's), else the server's when it answered (None: none)


class _Transient(Exception):
    """A failure worth retrying; `timeout` when the server did not answer in time, `lost` when
    it lost the weights it was recorded with (not worth retrying there)."""

    def __init__(self, message: str, *, timeout: bool = False, lost: bool = False,
                 status: int | None = None):
        super().__init__(message)
        self.timeout = timeout
        self.lost = lost
        self.status = status  # the HTTP status of an error answer


class ServerPool:
    """Chat requests over several OpenAI-compatible servers (see the module docstring).

    `start()` opens the session, `close()` closes it; `check_model(model)` at start. At most
    `max_inflight` requests are in flight; more wait for a slot.
    """

    def __init__(self, base_urls: list[str], *, api_key: str | None = None,
                 timeout_s: float = 600.0, max_retries: int = 3, max_inflight: int = 1024,
                 cooldown_max_s: float = COOLDOWN_MAX_S, model: str | None = None):
        self.servers = [Server(url.rstrip("/")) for url in base_urls]
        # request bodies start with this (the model is their first key): a server whose
        # version is another model name gets the body with that name spliced in
        self._model_prefix = b'{"model":' + orjson.dumps(model) if model else b""
        self.version_waiting = 0  # requests waiting for a server to hold their min_version
        self._version_wait_logged: int | None = None
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_inflight = max_inflight
        self.cooldown_max_s = cooldown_max_s
        self._headers = request_headers(api_key)
        self._slots: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession | None = None
        self._changed: asyncio.Event | None = None  # set when a server comes back
        self._run_loads = False  # the trainer has recorded weights for a server of the pool
        self._probes: set[asyncio.Future[None]] = set()  # health checks of hung servers
        self._no_model_list: set[str] = set()  # servers that answered 404 for /models
        self._all_down = False
        self._turn = 0  # rotates ties between equally loaded servers

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._slots = asyncio.Semaphore(self.max_inflight)
        self._changed = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=self.max_inflight, limit_per_host=0,
                                         ttl_dns_cache=300, enable_cleanup_closed=False)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"), raise_for_status=False)

    async def close(self) -> None:
        for probe in list(self._probes):
            probe.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def inflight(self) -> int:
        return sum(server.inflight for server in self.servers)

    def servers_down(self) -> dict[str, str]:
        """The servers set aside now: base URL -> why."""
        down = {s.base_url: s.down_reason for s in self.servers if s.down}
        down.update({s.base_url: UNRECORDED for s in self.servers if self._unrecorded(s)})
        return down

    def _unrecorded(self, server: Server) -> bool:
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
            seen = (None, None, False) if record is None else (
                record.version, record.model, record.reports)
            if seen != (server.version, server.model, server.reports):
                server.version, server.model, server.reports = seen
                changed = True
                if server.down:  # set aside for weights it lacked: try what it holds now
                    server.retry_at = time.monotonic()
        if changed and self._changed is not None:
            self._changed.set()
        return changed

    # -- start check -------------------------------------------------------------------------
    async def check_model(self, model: str) -> None:
        """Wait until every server has answered `GET /models` (a down server is retried with
        backoff; one log line while waiting). `PolicyError` when no server serves `model` or
        one refuses the API key; servers that answer without the model are left out."""
        assert self._session is not None
        pending = list(self.servers)
        served: list[str] = []
        lacking: list[str] = []
        wait_s, logged = COOLDOWN_S, False
        why: dict[str, str] = {}  # base URL -> why it does not answer yet
        while pending:
            for server in list(pending):
                found = await self._models(server)
                if isinstance(found, str):
                    why[server.base_url] = found
                    continue
                pending.remove(server)
                (served if model in found else lacking).append(server.base_url)
                if model not in found:
                    logger.warning("model server %s does not serve %r (it serves %s); not used",
                                   server.base_url, model, ", ".join(sorted(found)) or "nothing")
            if served or not pending:
                break  # one server with the model is enough to start
            if not logged:
                logger.warning("waiting for model servers: %s", "; ".join(
                    f"{s.base_url} not answering ({why[s.base_url]})" for s in pending))
                logged = True
            await asyncio.sleep(wait_s)
            wait_s = min(wait_s * 2, self.cooldown_max_s)
        if not served:
            no_list = [url for url in lacking if url in self._no_model_list]
            if no_list:
                raise PolicyError(f"no model server lists its models: {', '.join(no_list)} "
                                  "answered 404 for /models; is the base URL missing its /v1? "
                                  f"(policy.base_urls; model {model!r})")
            raise PolicyError(f"model {model!r} is unknown to every server "
                              f"({', '.join(lacking)})")
        if lacking:
            self.servers = [s for s in self.servers if s.base_url not in lacking]

    async def _models(self, server: Server) -> set[str] | str:
        """The model ids a server lists, or why it does not answer (a name that does not
        resolve, a refused connection, TLS to a plain-HTTP port, a timeout, a 5xx)."""
        assert self._session is not None
        try:
            async with self._session.get(server.models_url, headers=self._headers) as resp:
                raw = await resp.read()
                status = resp.status
        except asyncio.TimeoutError:
            return "no answer in time"
        except (aiohttp.ClientError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"[:300]
        if status in (401, 403):
            raise PolicyError(f"model server {server.base_url} refused the API key "
                              f"(HTTP {status})")
        if status >= 500 or status in TRANSIENT_4XX:
            return f"HTTP {status}"
        if status == 404:
            logger.warning("model server %s answered 404 for %s: is the base URL missing its "
                           "/v1?", server.base_url, server.models_url)
            self._no_model_list.add(server.base_url)
            return set()
        try:
            return {str(card["id"]) for card in orjson.loads(raw)["data"]}
        except (ValueError, KeyError, TypeError):
            return set()  # not an OpenAI model list: serves nothing we can name

    # -- requests ----------------------------------------------------------------------------
    async def chat(self, body: bytes, *, min_version: int | None = None) -> Answer:
        """POST `body` to `/chat/completions` (see the module docstring for the retries), to
        a server holding at least `min_version` when given."""
        assert self._slots is not None
        async with self._slots:
            server = await self._pick(avoid=None, min_version=min_version)
            probe = server.down  # a down server is handed out only to the request trying it
            tries = attempts = refused = 0
            # each server's answers to others up to this request's last failure there: an
            # error counts against the request only when the server has answered others
            # since (so an outage, where it answers nobody, is waited out)
            answered: dict[str, int] = {}
            try:
                while True:
                    attempts += 1
                    before = answered.setdefault(server.base_url, server.served)
                    try:
                        data, latency_s, version = await self._post(server, body)
                    except _Transient as exc:
                        if exc.status in (500, 502) and server.served > before:
                            refused += 1  # failed while the server answers other requests
                            if refused > self._refusal_limit:
                                raise self._poisoned(refused, exc) from None
                        answered[server.base_url] = server.served
                        server, tries = await self._after_failure(server, probe, tries, exc,
                                                                  min_version)
                        probe = server.down
                        continue
                    self._mark_up(server)
                    server.served += 1
                    return Answer(data, server, latency_s, attempts, version)
            except BaseException:
                if probe:
                    server.probing = False  # cancelled or refused while trying it
                raise

    @property
    def _refusal_limit(self) -> int:
        """Error answers one request may get while the servers answer others: every server's
        full retry budget."""
        return (self.max_retries + 1) * len(self.servers)

    def _poisoned(self, refused: int, exc: _Transient) -> EpisodeFailed:
        return EpisodeFailed(f"the model servers failed this request {refused} times while "
                             f"answering others (last: {exc}): a request they cannot serve")

    async def _post(self, server: Server, body: bytes
                    ) -> tuple[dict[str, Any], float, int | None]:
        """One attempt: (answer, latency, recorded version); `_Transient` or `EpisodeFailed`
        on failure."""
        assert self._session is not None
        model, version = server.model, server.version  # an adapter fixes its version now
        reports = server.reports
        if model is not None:
            body = self._naming(body, model)
        server.inflight += 1
        t0 = time.perf_counter()
        try:
            async with self._session.post(server.chat_url, data=body,
                                          headers=self._headers) as resp:
                raw = await resp.read()
                status = resp.status
        except asyncio.TimeoutError:
            metrics.llm_error(server.base_url, "timeout")
            raise _Transient(f"no answer within {self.timeout_s:g}s", timeout=True) from None
        except (aiohttp.ClientError, OSError) as exc:
            metrics.llm_error(server.base_url, "connection")
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        finally:
            server.inflight -= 1
        latency_s = time.perf_counter() - t0
        if status >= 500 or status in TRANSIENT_4XX:
            metrics.llm_error(server.base_url, "http_5xx" if status >= 500 else f"http_{status}")
            raise _Transient(f"HTTP {status}: {_message(raw)}", status=status)
        if status == 404 and model is not None:  # restarted: the adapter is gone
            metrics.llm_error(server.base_url, "lost_weights")
            raise _Transient(f"it does not have {model!r} (HTTP 404): unloaded, or the server "
                             "restarted (the trainer's ModelServers loads it again)", lost=True)
        if status >= 400 and is_context_overflow(status, raw):
            metrics.llm_error(server.base_url, "context_full")
            self._mark_up(server)
            raise ContextFull(f"model server {server.base_url} refused the turn for its "
                              f"length (HTTP {status}): {_message(raw)}")
        if status >= 400:
            metrics.llm_error(server.base_url, "http_4xx")
            self._mark_up(server)  # it answered: up, but this request will not pass
            raise EpisodeFailed(f"model server {server.base_url} refused the request "
                                f"(HTTP {status}): {_message(raw)}")
        try:
            data = orjson.loads(raw)
            if not isinstance(data, dict) or not data.get("choices"):
                raise ValueError("no choices")
            choice = data["choices"][0]
            if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
                raise ValueError("choices[0] holds no message")
        except ValueError as exc:  # orjson.JSONDecodeError is a ValueError
            metrics.llm_error(server.base_url, "bad_reply")
            raise EpisodeFailed(f"model server {server.base_url} answered HTTP {status} "
                                f"without a completion ({exc})") from None
        if reports and model is None and version is not None:
            reported = reported_weight_version(data)
            if reported is not None and not reported.isdigit():  # not a version we loaded
                metrics.llm_error(server.base_url, "lost_weights")
                raise _Transient(f"it answers with weight_version {reported!r} where version "
                                 f"{version} was loaded: restarted? (the trainer's "
                                 "ModelServers loads it again)", lost=True)
        metrics.llm_request(server.base_url, latency_s)
        if model is None and server.model is None:  # full weights: what it holds now
            version = server.version
        return data, latency_s, version  # else the version of the model the request named

    def _naming(self, body: bytes, model: str) -> bytes:
        """`body` asking for `model`: the model is the body's first key, so a splice."""
        prefix = self._model_prefix
        if prefix and body.startswith(prefix):
            return b'{"model":' + orjson.dumps(model) + body[len(prefix):]
        data = orjson.loads(body)  # a body built elsewhere: decode, rename, encode
        data["model"] = model
        return orjson.dumps(data)

    async def _after_failure(self, server: Server, probe: bool, tries: int,
                             exc: _Transient, min_version: int | None) -> tuple[Server, int]:
        """The server (and its try count) for the next attempt after a transient failure."""
        if probe:
            self._probe_failed(server, exc)
            return await self._pick(avoid=server, min_version=min_version), 0
        if server.down:  # another request marked it down meanwhile
            return await self._pick(avoid=server, min_version=min_version), 0
        if exc.lost:  # until it holds them again: the trainer's ModelServers reloads them
            self._mark_down(server, exc)
            return await self._pick(avoid=server, min_version=min_version), 0
        if exc.timeout and any(s is not server and not s.down for s in self.servers):
            self._mark_down(server, exc)  # hung: set aside, one request probes it later
            return await self._pick(avoid=server, min_version=min_version), 0
        tries += 1
        if tries > self.max_retries:
            self._mark_down(server, exc)
            return await self._pick(avoid=server, min_version=min_version), 0
        await asyncio.sleep(min(BACKOFF_S * 2 ** (tries - 1), BACKOFF_MAX_S))
        return server, tries

    async def _pick(self, avoid: Server | None, min_version: int | None = None) -> Server:
        """A down server whose cooldown is over (as the one request trying it), else the up
        server with the fewest requests in flight (not `avoid` if another is up), else wait
        until one of those exists. With `min_version`, only servers holding at least that
        version count (a server with no recorded version holds 0, the initial weights)."""
        assert self._changed is not None
        while True:
            now = time.monotonic()
            usable = [s for s in self.servers if not self._unrecorded(s)
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
                return server
            if len(up) > 1 and avoid in up:
                up.remove(avoid)
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
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    def _mark_down(self, server: Server, exc: Exception) -> None:
        server.down = True
        server.down_reason = str(exc)
        server.hung = isinstance(exc, _Transient) and exc.timeout
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
            found = await asyncio.wait_for(self._models(server), HUNG_PROBE_S)
        except asyncio.TimeoutError:
            found = f"no answer to GET /models within {HUNG_PROBE_S:g}s"
        except PolicyError as exc:
            found = str(exc)
        if isinstance(found, str):
            self._probe_failed(server, _Transient(found, timeout=True))
            return
        downs = server.downs
        self._mark_up(server)
        server.downs = downs  # a turn answered resets the cooldown, a health check does not

    def _probe_failed(self, server: Server, exc: Exception) -> None:
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

    def _mark_up(self, server: Server) -> None:
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


# How servers word a request longer than the model's context window: vLLM's frontend "This
# model's maximum context length is 4096 tokens. However, you requested ..." and its engine
# "The decoder prompt (length 5000) is longer than the maximum model length of 4096";
# SGLang "Requested token count exceeds the model's maximum context length ..." and "The
# input (5000 tokens) is longer than the model's context length (4096 tokens)"; OpenAI's
# error code `context_length_exceeded` (whatever its message says); others "context window".
CONTEXT_OVERFLOW = ("context length", "context_length", "context window",
                    "maximum model length", "input is too long", "prompt is too long")


def is_context_overflow(status: int, raw: bytes) -> bool:
    """A 400 (or 413/422) whose body (its message or its error code) says the request is
    longer than the context window."""
    if status not in (400, 413, 422):
        return False
    text = raw[:4096].decode(errors="replace").lower()
    return any(phrase in text for phrase in CONTEXT_OVERFLOW)


def _message(raw: bytes) -> str:
    """What an error body says went wrong (see `error_message`), else its first 200
    characters."""
    try:
        message = error_message(orjson.loads(raw))
    except ValueError:
        message = None
    return raw[:200].decode(errors="replace") if message is None else message
