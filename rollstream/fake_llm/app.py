"""The stand-in server: `FakeLLMServer` serves the scripted model (`player`) over HTTP with
aiohttp, shaped as one server's flavor answers (`flavors`), with faults (`faults`) and the
flavor's weight and pause endpoints (`control`).

A chat request goes: key check, parse, the model check (flavors that check it), faults, the
flavor's refusals (strict fields, logprobs rules), the pause (a vLLM pause in abort or wait
mode answers 503; other pauses and a weight load make it wait), the context window (refused,
or the turn's budget cut to fit, as the flavor's server does), the reply (seeded by the body),
its latency (a weight update or an abort ends it early: `finish_reason: "abort"` with the
tokens so far; a pause in keep / in_place / retract mode freezes it), then the flavor's shape
with the weight-version spans of the tokens. `stats["tokens_generated"]` counts the tokens the
model sampled (a request aborted or closed by its client had sampled half of its reply:
those are also in `stats["tokens_cut"]`), so a test can compare them with what trajectories
carry.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import math
import random
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollstream.fake_llm.completions import add_routes as add_completion_routes
from rollstream.fake_llm.control import Control
from rollstream.fake_llm.faults import Faults
from rollstream.fake_llm.flavors import FLAVORS, Flavor, Refusal, Reply
from rollstream.fake_llm.options import FakeLLMOptions
from rollstream.fake_llm.player import (
    SPECIAL_IDS,
    add_tool_calls,
    offers_python,
    pieces,
    render_prompt,
    reply,
    tool_reply,
)
from rollstream.fake_llm.prefix_cache import PrefixCache
from rollstream.fake_llm.responses import json_response, text_response, unauthorized

if TYPE_CHECKING:
    from aiohttp import web


@dataclass(eq=False)
class Pending:
    """A request being answered: its wake-up (the latency timer, or an abort)."""

    done: asyncio.Future[str]
    timer: asyncio.TimerHandle | None = None


class FakeLLMServer:
    """The stand-in server. `start()` serves on a thread of its own (tests), `serve()` in the
    caller's loop (the command line). `stats`, `requests`, `answers` and the fault methods
    for tests."""

    def __init__(self, options: FakeLLMOptions | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, keep_requests: int = 1000):
        self.options = options or FakeLLMOptions()
        self.flavor: Flavor = FLAVORS[self.options.flavor]
        self.host, self.port = host, port
        self.stats: collections.Counter[str] = collections.Counter()
        self.requests: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=keep_requests)  # bodies of recent chat requests
        self.answers: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=keep_requests)  # seed, model, weight_version, finish_reason of each answer
        self.served = self.options.model  # the name /v1/models lists (SGLang: the checkpoint
        # path after an update)
        self.adapters: dict[str, str] = {}  # LoRA adapter name -> path
        self.faults = Faults(self.options)
        self.control = Control(self)
        self.prefix_cache = PrefixCache(self.options.prefix_cache_tokens,
                                        self.options.prefill_s_per_token)
        self._hold: bytes | None = None  # requests whose body carries this wait for release()
        # token-id prompt -> the rest of an aborted completion (its continuation's answer)
        self.unfinished: dict[tuple[int, ...], tuple[list[int], list[float], int]] = {}
        self._held: set[Pending] = set()
        self.pending: set[Pending] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    # -- public --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What a policy's `base_urls` takes."""
        return f"{self.url}/v1"

    @property
    def in_flight(self) -> int:
        return self.stats["in_flight"]

    @property
    def loading(self) -> bool:
        """A weight update is loading now."""
        return self.control.loading

    @property
    def _loaded(self) -> asyncio.Event | None:  # tests look at it to see a load start
        return self.control.loaded

    def fail_next(self, kind: str, count: int = 1) -> None:
        """Answer the next `count` chat requests with a fault (see `Faults.fail_next`)."""
        self.faults.fail_next(kind, count)

    def fail_marked(self, marker: bytes | str | None, status: int = 502) -> None:
        """Answer every chat request whose body carries `marker` with HTTP `status` (a
        request the server cannot serve, whatever the retries); None: stop."""
        self.faults.fail_marked(marker, status)

    def hold(self, marker: bytes | str = b"") -> None:
        """Keep the chat requests whose body carries `marker` (b"": every one) in flight
        until `release()` (`stats["held"]` counts them); a weight update aborts them and a
        client that leaves closes them, as with any request in flight."""
        self._hold = marker.encode() if isinstance(marker, str) else marker

    def release(self) -> None:
        """Stop holding; the held requests are answered now (after their latency)."""
        self._hold = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._release_held)

    def _release_held(self) -> None:
        for pending in list(self._held):
            settle(pending, "done")

    def abort_all(self, why: str = "abort") -> int:
        """End every request in flight early (they answer `finish_reason: "abort"`)."""
        count = len(self.pending)
        for pending in list(self.pending):
            settle(pending, why)
        return count

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> FakeLLMServer:
        """Serve on a daemon thread; returns once listening (`port` is then the real one)."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=main, daemon=True, name="fake-llm")
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        """Stop serving (the port refuses connections, open connections are closed). The same
        object can `start()` again on the same port: a server that comes back."""
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop = self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def serve(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Serve in the running loop until `stop` is set; `ready` is set once listening."""
        self._loop = asyncio.get_running_loop()
        await self._open()
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            await self._close()

    async def _open(self) -> None:
        from aiohttp import web  # imported here: the command line stays quick without it

        _raise_fd_limit()
        self.control.open()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self.control.add_routes(app)
        add_completion_routes(app, self)  # token-id prompts, /tokenize
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, backlog=4096)
        await site.start()
        server = getattr(site, "_server", None)
        if self.port == 0 and server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        self.abort_all("stop")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- endpoints -----------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return text_response("")

    async def _models(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return unauthorized()
        return json_response(self.flavor.models(self.served, self.options.model_path,
                                                self.options.max_model_len, self.adapters))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            return unauthorized()
        import orjson

        raw = await request.read()
        try:
            body = orjson.loads(raw)
            model = body["model"]
            if not isinstance(body["messages"], list):
                raise TypeError("messages is not a list")
        except (ValueError, KeyError, TypeError) as exc:
            return self.refused(Refusal(400, f"bad request: {exc}"))
        if self.flavor.checks_model and model != self.served and model not in self.adapters:
            self.stats["unknown_model"] += 1
            return self.refused(self.flavor.not_found(model))
        stats = self.stats
        stats["requests"] += 1
        stats[f"model:{model}"] += 1
        self.requests.append(body)
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        try:
            return await self._answer(request, body, raw, model)
        except asyncio.CancelledError:
            stats["cancelled"] += 1  # the client closed the request before the answer
            raise
        finally:
            stats["in_flight"] -= 1

    async def _answer(self, request: web.Request, body: dict[str, Any], raw: bytes,
                      model: str) -> web.StreamResponse:
        fault = self.faults.pick(raw, self.stats)
        hang = fault == "hang"
        if fault is not None and not hang:
            return await self.faults.respond(fault, request, self)
        refusal = self.flavor.refuse(body)
        if refusal is not None:
            self.stats["refused"] += 1
            return self.refused(refusal)
        paused = await self.control.admit()
        if paused is not None:
            return self.refused(paused)
        prompt = render_prompt(body["messages"], drop_thinking=self.options.drop_thinking)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        budget = self.flavor.fit(len(prompt), limit if isinstance(limit, int) else None,
                                 self.options.max_model_len)
        if isinstance(budget, Refusal):
            self.stats["context_overflow"] += 1
            return self.refused(budget)
        if not self.control.generating():
            if self.options.during_load == "abort":
                return self._completion(body, model, self._aborted(prompt))
            await self.control.wait_generating()
        return await self._generate(body, model, raw, prompt, budget, hang)

    async def _generate(self, body: dict[str, Any], model: str, raw: bytes,
                        prompt: list[str], budget: int, hang: bool) -> web.Response:
        """The reply, after its latency (held while `hold` says so: its first tokens come
        from the weights in force when it started, the rest from those at its end)."""
        opts = self.options
        rng = random.Random(int.from_bytes(
            hashlib.blake2b(raw, digest_size=8, key=str(opts.seed).encode()).digest(),
            "little"))
        text, good = reply(body["messages"], float(body.get("temperature", 1.0) or 0.0), rng,
                           p_good=opts.p_good, malformed_share=opts.malformed_share,
                           think_words=opts.think_words)
        if offers_python(body.get("tools")):  # scripted tool calls (player.tool_reply)
            text = tool_reply(body["messages"], rng, malformed_share=opts.malformed_share) or text
        tokens = pieces(text) + ["<|im_end|>"]
        finish = "stop"
        if 0 < budget < len(tokens):
            tokens, finish = tokens[:budget], "length"
            text = "".join(p for p in tokens if p not in SPECIAL_IDS)
        low, high = (-0.4, -0.01) if good else (-3.0, -0.3)
        logprobs = [round(rng.uniform(low, high), 4) for _ in tokens]
        delay = opts.latency_s * math.exp(opts.latency_sigma * rng.gauss(0, 1))
        cached = self.prefix_cache.lookup(prompt)  # its prefix cache (prefix_cache.py)
        delay += self.prefix_cache.prefill_s(prompt, cached)
        first = self.control.label
        try:  # (a client that closes the request: half its tokens were sampled by then)
            if self._hold is not None and self._hold in raw:
                self.stats["held"] += 1
                try:
                    why = await self.wait(None, held=True)
                finally:
                    self.stats["held"] -= 1
                if why != "done":
                    self.stats["aborted"] += 1
                    return self._completion(body, model, self._aborted(prompt, tokens, logprobs,
                                                                       first))
            why = await self.wait(None if hang else delay)
            if why != "done":
                self.stats["aborted"] += 1
                return self._completion(body, model, self._aborted(prompt, tokens, logprobs, first))
            await self.control.frozen()  # paused in keep / in_place / retract: continued after
        except asyncio.CancelledError:
            self.stats["tokens_generated"] += len(tokens) // 2
            self.stats["tokens_cut"] += len(tokens) // 2
            raise
        last = self.control.label
        spans = [(first, 0, len(tokens))]
        if last != first:  # the weights changed while it was frozen: half by each
            half = len(tokens) // 2
            spans = [(first, 0, half), (last, half, len(tokens))]
        self.stats["completed"] += 1
        self.stats["tokens_generated"] += len(tokens)  # what the model sampled
        self.prefix_cache.store(prompt + tokens)
        return self._completion(body, model, Reply(text, tokens, logprobs, finish, prompt,
                                                   spans), cached)

    def _aborted(self, prompt: list[str], tokens: list[str] | None = None,
                 logprobs: list[float] | None = None, label: str | None = None) -> Reply:
        """What an aborted request answers: the tokens generated so far (half, here)."""
        label = self.control.label if label is None else label
        if tokens is not None:  # sampled before the abort
            self.stats["tokens_generated"] += len(tokens) // 2
            self.stats["tokens_cut"] += len(tokens) // 2  # of requests that did not finish
        if not self.flavor.abort_finish or tokens is None:
            return Reply("", [], [], "abort", prompt, [(label, 0, 0)])
        kept = tokens[: len(tokens) // 2]  # SGLang 0.5.23 too (fake_llm/completions.py)
        text = "".join(p for p in kept if p not in SPECIAL_IDS)
        return Reply(text, kept, (logprobs or [])[: len(kept)], "abort", prompt,
                     [(label, 0, len(kept))])

    def _completion(self, body: dict[str, Any], model: str, answer: Reply,
                    cached: int | None = None) -> web.Response:
        if not self.options.token_ids:
            body = {k: v for k, v in body.items() if k != "return_token_ids"}
        out = self.flavor.answer(body, model, answer)
        if body.get("tools") and body.get("tool_choice") != "none":  # a server's tool parser
            add_tool_calls(out, self.flavor.name)
        if cached is not None:
            self.prefix_cache.report(out, cached)
        self.answers.append({"seed": body.get("seed"), "model": model,
                             "finish_reason": answer.finish, "tokens": len(answer.pieces),
                             "weight_version": answer.spans[-1][0] if answer.spans
                             else self.control.label})
        return json_response(out)

    async def wait(self, delay_s: float | None, held: bool = False) -> str:
        """Sleep `delay_s` (None: until aborted, or released when `held`); "done", or why it
        ended early."""
        assert self._loop is not None
        pending = Pending(self._loop.create_future())
        if delay_s is not None:
            pending.timer = self._loop.call_later(delay_s, settle, pending, "done")
        self.pending.add(pending)
        if held:
            self._held.add(pending)
        try:
            return await pending.done
        finally:
            self.pending.discard(pending)
            self._held.discard(pending)
            if pending.timer is not None:
                pending.timer.cancel()

    def refused(self, refusal: Refusal) -> web.Response:
        return json_response(self.flavor.error(refusal), status=refusal.status)

    def authorized(self, request: web.Request) -> bool:
        key = self.options.api_key
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"


def settle(pending: Pending, why: str) -> None:
    if not pending.done.done():
        pending.done.set_result(why)


def _raise_fd_limit() -> None:
    """Thousands of connections need more file descriptors than a shell's usual 1024."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
