"""A producer's client for its model servers: one asyncio HTTP session, many servers.

`ServerPool.chat(body, session=...)` posts a chat completion to the session's own server
(sticky sessions, `producers.llm.routing`; without a session: the server with the fewest
requests in flight), fitted to that server (`producers.llm.adapt`: which server it is and
its context window are learnt from `GET /models` at `check_model`,
`producers.llm.dialects`), and returns its JSON answer with the server and latency. What
can pass is retried and what cannot is raised:
- a connection error, a 5xx, 408 or 429: retried on the same server with capped backoff, up
  to `max_retries` times, then the server is marked down and another one is used; a request
  answered 500 or 502 more often than every server's retry budget, each time by a server that
  answered other requests since this one's previous error there (or, after a 500, whose
  health check `GET /models` answers: with one server too), is one they cannot serve:
  `EpisodeFailed` with the server's message, and the server is not set aside for it (an
  outage, where a server answers nobody, is waited out instead; 503, 504 and 429 say the
  server is busy, not the request);
- a timeout (`timeout_s`): when another server is up, this one is marked down (a server
  that hung once is likely still hung: every later turn would wait out the timeout on it
  first) and the turn goes to another at once; else as above. A server down for a timeout
  is probed with `GET /models` (5 s at most), not with a turn;
- a 400 saying the request is longer than the context window (every server's wording,
  `producers.llm.replies`), or an answer the server cut short to fit it: `ContextFull` (the
  episode ends truncated; the message names the server's own setting);
- a 400 or 422 naming a field the policy added and saying it is not accepted: the field is
  dropped for that server (one warning) and the request sent again at once;
- any other 4xx, or a 2xx body that is not a completion: `EpisodeFailed`, never retried;
- a server that lost the weights it was recorded with (restarted: it answers with its launch
  weights, or 404 for the LoRA adapter the request named): marked down at once, another one
  is used; the trainer's `ModelServers` loads them again (or its next update does).
A server marked down is tried again after a cooldown (0.25 s doubling to 5 s) by a single
request, so a dead server is not flooded. While every server is down, requests wait: one log
line when all are down, one when a server is back. Which server a request goes to and the
servers' health live in `producers.llm.servers` (`ServerSet`); what an error answer means
in `producers.llm.replies`.

Weight versions: `set_versions` tells the pool which version each server holds (what the
trainer recorded in `{RUN}:servers`) and which model name gets it (a vLLM LoRA adapter per
version); a request then names that model on that server, and its `Answer` carries the
version. `chat(body, min_version=v)` sends only to a server holding at least `v` and waits
(one log line) while none does. A server recorded as reporting its version (SGLang, vLLM with
`ModelServers(method="vllm")`) that answers with a label we did not load has lost those
weights: its answer is not used.

JSON with orjson: decoding a reply (logprobs, ~700 prompt ids) took 69 us with the
standard library and 19 us with orjson here. aiohttp, not httpx: measured against the
stand-in server (`python bench/bench_llm.py --compare-clients`), aiohttp's client cost
0.34-0.47 ms of CPU per request with 1,000 in flight and httpx's 19-26 ms (20 ms with 100).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from producers import metrics
from producers.lifetime import within
from producers.llm import adapt, routing, tito
from producers.llm.dialects import LLAMA_SERVER, context_limit, identify
from producers.llm.replies import (
    TRANSIENT_4XX,
    Transient,
    error_text,
    is_context_overflow,
    weight_labels,
)
from producers.llm.servers import COOLDOWN_MAX_S, COOLDOWN_S, HUNG_PROBE_S, Server, ServerSet
from schemas.errors import ContextFull, EpisodeFailed, PolicyError
from schemas.policy import ServerRecord, request_headers

logger = logging.getLogger(__name__)

BACKOFF_S = 0.05  # first retry on the same server; doubles
BACKOFF_MAX_S = 2.0
UNRESOLVED = "host name does not resolve"
RESOLVE_WAIT_S = 60.0  # at start, a host name that does not resolve for this long is an error
INTERNAL_ERROR = 500  # a server's own failure on a request (502-504: a gateway, or busy)


@dataclass
class Answer:
    """A server's answer to a chat request."""

    data: dict[str, Any]
    server: Server
    latency_s: float  # of the attempt that answered
    attempts: int
    version: int | None = None  # the version recorded for what answered: the adapter's the
    # request named (or the base model's), else the server's when it was sent (None: none)
    version_end: int | None = None  # full weights: the server's when it answered (differs
    # from `version` when an update landed mid-turn: the turn records both ends)


class ServerPool:
    """Chat requests over several OpenAI-compatible servers (see the module docstring).

    `start()` opens the session, `close()` closes it; `check_model(model)` at start. At most
    `max_inflight` requests are in flight; more wait for a slot.
    """

    def __init__(self, base_urls: list[str], *, api_key: str | None = None,
                 timeout_s: float = 600.0, max_retries: int = 3, max_inflight: int = 1024,
                 cooldown_max_s: float = COOLDOWN_MAX_S, model: str | None = None,
                 resolve_wait_s: float = RESOLVE_WAIT_S, sticky: bool = True,
                 load_factor: float = routing.LOAD_FACTOR,
                 session_header: str | None = routing.SESSION_HEADER):
        self._servers = ServerSet(base_urls, health_check=self._models,
                                  cooldown_max_s=cooldown_max_s, sticky=sticky,
                                  load_factor=load_factor)
        self.session_header = session_header
        self.model = model
        self.resolve_wait_s = resolve_wait_s
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_inflight = max_inflight
        self.cooldown_max_s = cooldown_max_s
        self._headers = request_headers(api_key)
        self._slots: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession | None = None
        self._no_model_list: set[str] = set()  # servers that answered 404 for /models

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._slots = asyncio.Semaphore(self.max_inflight)
        self._servers.start()
        connector = aiohttp.TCPConnector(limit=self.max_inflight, limit_per_host=0,
                                         ttl_dns_cache=300, enable_cleanup_closed=False)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"), raise_for_status=False)

    async def close(self) -> None:
        await self._servers.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- the servers (`ServerSet`) -----------------------------------------------------------
    @property
    def servers(self) -> list[Server]:
        return self._servers.servers

    @property
    def inflight(self) -> int:
        return self._servers.inflight

    @property
    def version_waiting(self) -> int:
        """Requests waiting for a server to hold their `min_version`."""
        return self._servers.version_waiting

    def servers_down(self) -> dict[str, str]:
        """The servers set aside now: base URL -> why."""
        return self._servers.down()

    def set_versions(self, records: dict[str, ServerRecord]) -> bool:
        """Each server's record from `{RUN}:servers`, by base URL (a server without a record:
        version unknown). True when something changed; waiting requests look again at once."""
        return self._servers.set_versions(records)

    # -- start check -------------------------------------------------------------------------
    async def check_model(self, model: str,
                          records: dict[str, ServerRecord] | None = None) -> None:
        """Wait until every server has answered `GET /models` (a down server is retried with
        backoff; one log line while waiting), and learn from its answer which server it is
        and its context window (`producers.llm.dialects`). `PolicyError` when no server
        serves `model` or one refuses the API key, or when no server answered and every one
        of them has a host name that has not resolved for `resolve_wait_s`; servers that
        answer without the model are left out. A server serving the checkpoint its record
        names (`records`, from `{RUN}:servers`) serves the model: SGLang lists a checkpoint's
        path as its model after loading it (`tokenizer_manager.py:2365-2370`)."""
        assert self._session is not None
        pending = list(self.servers)
        served: list[str] = []
        lacking: list[str] = []
        wait_s, logged = COOLDOWN_S, False
        why: dict[str, str] = {}  # base URL -> why it does not answer yet
        unresolved_since: dict[str, float] = {}  # base URL -> since when its host has not resolved
        while pending:
            for server in list(pending):
                found = await self._models(server)
                if isinstance(found, str):
                    why[server.base_url] = found
                    if found.startswith(UNRESOLVED):
                        unresolved_since.setdefault(server.base_url, time.monotonic())
                    else:
                        unresolved_since.pop(server.base_url, None)
                    continue
                pending.remove(server)
                names = {str(card.get("id")) for card in found}
                record = (records or {}).get(server.base_url)
                ours = model in names or (record is not None and record.checkpoint in names)
                (served if ours else lacking).append(server.base_url)
                if ours:
                    self._learn_server(server, found, model if model in names else None)
                else:
                    logger.warning("model server %s does not serve %r (it serves %s); not used",
                                   server.base_url, model, ", ".join(sorted(names)) or "nothing")
            if served or not pending:
                break  # one server with the model is enough to start
            self._give_up_unresolved(pending, unresolved_since, why)
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
            self._servers.servers = [s for s in self.servers if s.base_url not in lacking]

    def _give_up_unresolved(self, pending: list[Server], since: dict[str, float],
                            why: dict[str, str]) -> None:
        """`PolicyError` once every server still waited for has a host name that has not
        resolved for `resolve_wait_s` (a name that never resolves is a typo or a service
        that does not exist here: `http://vllm:8000/v1` outside compose)."""
        now = time.monotonic()
        if all(s.base_url in since and now - since[s.base_url] >= self.resolve_wait_s
               for s in pending):
            hosts = "; ".join(f"{s.base_url} ({why[s.base_url]})" for s in pending)
            raise PolicyError(f"model server host names do not resolve after "
                              f"{self.resolve_wait_s:g}s: {hosts} (policy.base_urls)")

    def _learn_server(self, server: Server, cards: list[dict[str, Any]],
                      model: str | None) -> None:
        """Which server it is, its context window, what its requests add."""
        server.dialect = identify(cards)
        server.context_len = context_limit(cards, model)
        if server.dialect.top_logprobs is not None:
            server.adds["top_logprobs"] = server.dialect.top_logprobs
        if server.dialect.weight_versions:
            server.adds["return_weight_versions"] = True
        logger.info("model server %s: %s, context %s", server.base_url, server.dialect.name,
                    server.context_len or "not reported")

    async def _models(self, server: Server) -> list[dict[str, Any]] | str:
        """The model cards a server lists, or why it does not answer (a name that does not
        resolve, a refused connection, TLS to a plain-HTTP port, a timeout, a 5xx)."""
        assert self._session is not None
        try:
            async with self._session.get(server.models_url, headers=self._headers) as resp:
                raw = await resp.read()
                status = resp.status
        except asyncio.TimeoutError:
            return "no answer in time"
        except (aiohttp.ClientError, OSError) as exc:
            if isinstance(getattr(exc, "os_error", exc), socket.gaierror):
                return f"{UNRESOLVED}: {exc}"[:300]
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
            return []
        try:
            cards = orjson.loads(raw)["data"]
            return [card for card in cards if isinstance(card, dict) and "id" in card]
        except (ValueError, KeyError, TypeError):
            return []  # not an OpenAI model list: serves nothing we can name

    # -- requests ----------------------------------------------------------------------------
    async def chat(self, body: dict[str, Any] | bytes, *, min_version: int | None = None,
                   session: str | None = None) -> Answer:
        """POST `body` (a request dict, or its JSON) to `/chat/completions`, shaped for the
        server it goes to (`producers.llm.adapt`; see the module docstring for the retries),
        to a server holding at least `min_version` when given. A body with a `prompt` (a
        token-id prompt, `producers.llm.tito`) goes to `/completions` instead. A `session`
        (`routing.session_key`) goes to its own server (`producers.llm.routing`) and names
        itself in the `session_header` for routers."""
        assert self._slots is not None
        if isinstance(body, bytes | bytearray):
            body = orjson.loads(body)
        assert isinstance(body, dict)
        async with self._slots:
            server = await self._servers.pick(avoid=None, min_version=min_version,
                                              session=session)
            headers = self._headers
            if session is not None and self.session_header:
                headers = {**headers, self.session_header: session}
            probe = server.down  # a down server is handed out only to the request trying it
            tries = attempts = refused = 0
            # each server's answers to others up to this request's last failure there: an
            # error counts against the request only when the server has answered others
            # since, or its health check answers after a 500 (so an outage, where it answers
            # nobody, is waited out)
            answered: dict[str, int] = {}
            try:
                while True:
                    attempts += 1
                    before = answered.setdefault(server.base_url, server.served)
                    try:
                        data, latency_s, version, version_end = await self._post(
                            server, body, headers)
                    except Transient as exc:
                        if exc.status in (500, 502) and (server.served > before
                                                         or await self._healthy(server, exc)):
                            refused += 1  # failed while the server answers others or its
                            exc.refused = True  # health check: this request, not the server
                            if refused > self._refusal_limit:
                                raise self._poisoned(server, refused, exc) from None
                        answered[server.base_url] = server.served
                        server, tries = await self._after_failure(server, probe, tries, exc,
                                                                  min_version, session)
                        probe = server.down
                        continue
                    self._servers.mark_up(server)
                    server.served += 1
                    return Answer(data, server, latency_s, attempts, version, version_end)
            except BaseException:
                if probe:
                    server.probing = False  # cancelled or refused while trying it
                raise

    @property
    def _refusal_limit(self) -> int:
        """Error answers one request may get while the servers answer others: every server's
        full retry budget."""
        return (self.max_retries + 1) * len(self.servers)

    async def _healthy(self, server: Server, exc: Transient) -> bool:
        """After an HTTP 500 (the server's own failure on this request: a gateway's 502 or a
        busy 503 say nothing of the request), whether the server's health check (`GET
        /models`) answers: then the failure is this request's, even with one server."""
        if exc.status != INTERNAL_ERROR:
            return False
        try:
            found = await within(self._models(server), HUNG_PROBE_S)
        except (asyncio.TimeoutError, PolicyError):
            return False
        return not isinstance(found, str)

    def _poisoned(self, server: Server, refused: int, exc: Transient) -> EpisodeFailed:
        return EpisodeFailed(f"the model servers failed this request {refused} times while "
                             f"answering others or their health check (last: model server "
                             f"{server.base_url}, {exc}): a request they cannot serve")

    async def _post(self, server: Server, body: dict[str, Any], headers: dict[str, str]
                    ) -> tuple[dict[str, Any], float, int | None, int | None]:
        """One attempt: (answer, latency, recorded version at send and at answer);
        `Transient`, `ContextFull` or `EpisodeFailed` on failure. A field the server
        refuses is dropped for it and the request sent again at once."""
        assert self._session is not None
        model, version = server.model, server.version  # an adapter fixes its version now
        reports = server.reports
        sent, payload = adapt.shape(server, body)
        url = server.chat_url
        if "prompt" in body:  # token-in/token-out
            url = server.completions_url
            if server.dialect is LLAMA_SERVER:
                sent, payload = tito.llama_native(sent)
        server.inflight += 1
        t0 = time.perf_counter()
        try:
            async with self._session.post(url, data=payload, headers=headers) as resp:
                raw = await resp.read()
                status = resp.status
        except asyncio.TimeoutError:
            metrics.llm_error(server.base_url, "timeout")
            raise Transient(f"no answer within {self.timeout_s:g}s", timeout=True) from None
        except (aiohttp.ClientError, OSError) as exc:
            metrics.llm_error(server.base_url, "connection")
            raise Transient(f"{type(exc).__name__}: {exc}") from None
        finally:
            server.inflight -= 1
        latency_s = time.perf_counter() - t0
        if status >= 400 and is_context_overflow(status, raw):
            metrics.llm_error(server.base_url, "context_full")
            self._servers.mark_up(server)
            limit = f", {server.context_len} tokens" if server.context_len else ""
            raise ContextFull(f"model server {server.base_url} ({server.dialect.name}) refused "
                              f"the turn for its length (HTTP {status}): {error_text(raw)} "
                              f"[its window: {server.dialect.context_setting}{limit}]")
        if status >= 500 or status in TRANSIENT_4XX:
            metrics.llm_error(server.base_url, "http_5xx" if status >= 500 else f"http_{status}")
            raise Transient(f"HTTP {status}: {error_text(raw)}", status=status)
        if status == 404 and model is not None:  # restarted: the adapter is gone
            metrics.llm_error(server.base_url, "lost_weights")
            raise Transient(f"it does not have {model!r} (HTTP 404): unloaded, or the server "
                             "restarted (the trainer's ModelServers loads it again)", lost=True)
        refused = adapt.refused_fields(status, raw, sent)
        if refused:
            adapt.drop(server, refused, status, error_text(raw))
            return await self._post(server, body, headers)
        if status >= 400:
            metrics.llm_error(server.base_url, "http_4xx")
            self._servers.mark_up(server)  # it answered: up, but this request will not pass
            raise EpisodeFailed(f"model server {server.base_url} refused the request "
                                f"(HTTP {status}): {error_text(raw)}")
        try:
            if "prompt" in body:  # token-in/token-out: the prompt ids are ours (tito.py)
                raw = tito.without_prompt_echo(raw)
            data = orjson.loads(raw)
            if "return_tokens" in sent and isinstance(data, dict):
                data = tito.from_llama_native(data)
            if not isinstance(data, dict) or not data.get("choices"):
                raise ValueError("no choices")
            choice = data["choices"][0]
            if not isinstance(choice, dict) or not (
                    isinstance(choice.get("message"), dict) or isinstance(choice.get("text"), str)):
                raise ValueError("choices[0] holds no message")
        except ValueError as exc:  # orjson.JSONDecodeError is a ValueError
            metrics.llm_error(server.base_url, "bad_reply")
            raise EpisodeFailed(f"model server {server.base_url} answered HTTP {status} "
                                f"without a completion ({exc})") from None
        if reports and model is None and version is not None:
            labels = weight_labels(data)  # the newest span: what it holds now (a turn kept
            # through the first update began under its launch weights, "default")
            lost = labels[-1][0] if labels and not labels[-1][0].isdigit() else None
            if lost is not None:  # not a version we loaded: its launch weights
                metrics.llm_error(server.base_url, "lost_weights")
                raise Transient(f"it answers with weight_version {lost!r} where version "
                                 f"{version} was loaded: restarted? (the trainer's "
                                 "ModelServers loads it again)", lost=True)
        if server.learning:
            adapt.learn(server, sent, data)
        if choice.get("finish_reason") == "length":
            self._servers.mark_up(server)
            adapt.check_cut(server, sent, data)
        metrics.llm_request(server.base_url, latency_s)
        end = version  # else the version of the model the request named
        if model is None and server.model is None:  # full weights: what it held at send
            # and holds now; never labelled with the newer alone (its first tokens are older)
            end = server.version
            version = end if version is None or end is None else min(version, end)
        return data, latency_s, version, end

    async def _after_failure(self, server: Server, probe: bool, tries: int,
                             exc: Transient, min_version: int | None,
                             session: str | None = None) -> tuple[Server, int]:
        """The server (and its try count) for the next attempt after a transient failure."""
        def pick() -> Any:
            return self._servers.pick(avoid=server, min_version=min_version, session=session)

        if probe:
            self._servers.probe_failed(server, exc)
            return await pick(), 0
        if server.down:  # another request marked it down meanwhile
            return await pick(), 0
        if exc.lost:  # until it holds them again: the trainer's ModelServers reloads them
            self._servers.mark_down(server, exc)
            return await pick(), 0
        if exc.timeout and any(s is not server and not s.down for s in self.servers):
            self._servers.mark_down(server, exc)  # hung: set aside, one request probes it later
            return await pick(), 0
        tries += 1
        if tries > self.max_retries:
            if not exc.refused:  # a server that answers others is not down for this request
                self._servers.mark_down(server, exc)
            return await pick(), 0
        await asyncio.sleep(min(BACKOFF_S * 2 ** (tries - 1), BACKOFF_MAX_S))
        return server, tries
