"""The stand-in's weight, pause and admin endpoints, as each flavor's server serves them.

- vLLM 0.33.0 (dev mode, `entrypoints/rl/online/api_router.py`,
  `entrypoints/serve/dev/rpc/api_router.py`): `POST /pause?mode=abort|wait|keep` (abort: the
  requests in flight answer `finish_reason: "abort"` with their tokens so far; wait: the call
  returns once they finished; keep: they freeze and continue on `/resume`; in abort and wait
  modes new requests are answered 503 "Generation is paused. Please retry after it resumes."
  until `/resume`, `v1/engine/core.py:1796-1810`; keep queues them), `POST /resume`,
  `GET /is_paused`, `POST /collective_rpc {"method": "reload_weights", "kwargs":
  {"weights_path"}}`, `POST /update_weight_version {"new_version"}` (the label answers'
  `weight_versions` carry), `GET /weight_info`, `POST /abort_requests`; runtime LoRA
  (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`).
- vLLM 0.10.2: runtime LoRA; `/collective_rpc` `reload_weights` takes no arguments (it reloads
  the path the server started with, `v1/worker/gpu_model_runner.py:2430-2436`).
- SGLang 0.5.23 (`entrypoints/http_server.py`, `managers/tokenizer_manager.py`):
  `POST /update_weights_from_disk {"model_path", "weight_version", "abort_all_requests"}`
  (aborts what runs when asked, else waits for it, unless paused; afterwards `/v1/models`
  lists the new model_path, `_update_model_path_info`), `POST /pause_generation {"mode":
  "abort"|"in_place"|"retract"}` (new requests wait until `/continue_generation`),
  `GET /model_info` (and `/get_model_info`), `POST /update_weight_version`.
- SGLang 0.4.10: the same update (no `weight_version`), `/pause_generation` aborts everything,
  `/get_model_info` without a version.
- llama.cpp, llama-cpp-python, transformers serve: none (404).

Admin (every flavor): `POST /admin/faults {"kind", "count"}`, `GET /admin/stats`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from rollstream.fake_llm.faults import admin_faults_body
from rollstream.fake_llm.flavors import Refusal
from rollstream.fake_llm.responses import json_response, text_response

if TYPE_CHECKING:
    from aiohttp import web

FROZEN = ("keep", "in_place", "retract")  # pause modes that keep requests to continue later


class Control:
    """Loads and pauses of one `FakeLLMServer` (see the module docstring)."""

    def __init__(self, server: Any):  # the FakeLLMServer it belongs to
        self.server = server
        self.loaded: asyncio.Event | None = None  # cleared while weights load
        self.running: asyncio.Event | None = None  # cleared while paused
        self.pause_mode: str | None = None  # while paused: how

    def open(self) -> None:
        self.loaded, self.running = asyncio.Event(), asyncio.Event()
        self.loaded.set()
        self.running.set()
        self.pause_mode = None

    @property
    def label(self) -> str:
        """The weight version label answers carry now."""
        return self.server.options.weight_version

    @property
    def loading(self) -> bool:
        return self.loaded is not None and not self.loaded.is_set()

    # -- what a chat request meets ------------------------------------------------------
    async def admit(self) -> Refusal | None:
        """A new request during a pause: vLLM's abort and wait modes refuse it (503), the
        other pauses hold it until they end."""
        assert self.running is not None
        if self.running.is_set():
            return None
        if self.server.flavor.weights == "vllm" and self.pause_mode in ("abort", "wait"):
            return Refusal(503, "Generation is paused. Please retry after it resumes.",
                           "ServiceUnavailableError")
        await self.running.wait()
        return None

    def generating(self) -> bool:
        """No weight load in progress."""
        return self.loaded is None or self.loaded.is_set()

    async def wait_generating(self) -> None:
        assert self.loaded is not None
        await self.loaded.wait()

    async def frozen(self) -> bool:
        """A request that finished generating while paused in a freezing mode waits for the
        pause to end (True when it waited)."""
        assert self.running is not None
        if self.running.is_set() or self.pause_mode not in FROZEN:
            return False
        await self.running.wait()
        return True

    # -- routes -------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        weights = self.server.flavor.weights
        add_get, add_post = app.router.add_get, app.router.add_post
        if weights == "vllm":
            add_post("/pause", self._vllm_pause)
            add_post("/resume", self._resume)
            add_get("/is_paused", self._is_paused)
            add_post("/update_weight_version", self._update_weight_version)
            add_get("/weight_info", self._weight_info)
            add_post("/abort_requests", self._abort_requests)
        if weights in ("vllm", "vllm010"):
            add_post("/collective_rpc", self._collective_rpc)
        if self.server.flavor.lora:
            add_post("/v1/load_lora_adapter", self._load_lora)
            add_post("/v1/unload_lora_adapter", self._unload_lora)
        if weights in ("sglang", "sglang04"):
            add_post("/update_weights_from_disk", self._update_from_disk)
            add_post("/pause_generation", self._sglang_pause)
            add_post("/continue_generation", self._resume)
            add_get("/get_model_info", self._model_info)
        if weights == "sglang":
            add_get("/model_info", self._model_info)
            add_post("/update_weight_version", self._update_weight_version)
        add_post("/admin/faults", self._admin_faults)
        add_get("/admin/stats", self._admin_stats)

    # -- pause --------------------------------------------------------------------------
    def _pause(self, mode: str) -> int:
        """Pause in `mode`; the number of requests aborted."""
        assert self.running is not None
        self.pause_mode = mode
        self.running.clear()
        self.server.stats["pauses"] += 1
        return self.server.abort_all() if mode == "abort" else 0

    async def _vllm_pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in self.server.flavor.pause_modes:  # a Literal query parameter: 422
            return _json({"detail": [{"type": "literal_error", "loc": ["query", "mode"],
                                      "msg": "Input should be 'abort', 'wait' or 'keep'",
                                      "input": mode}]}, 422)
        self._pause(mode)
        if mode == "wait":
            while self.server.pending:
                await asyncio.sleep(0.01)
        return _json({"status": "paused"})

    async def _sglang_pause(self, request: web.Request) -> web.Response:
        body = await _body(request)
        mode = str(body.get("mode", "abort")) if self.server.flavor.weights == "sglang" \
            else "abort"  # 0.4.10 takes no mode: it aborts everything
        if mode not in self.server.flavor.pause_modes:
            return self._bad(f"mode {mode!r} is not one of abort, in_place, retract", 422)
        self._pause(mode)
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def _resume(self, request: web.Request) -> web.Response:
        assert self.running is not None
        self.pause_mode = None
        self.running.set()
        if self.server.flavor.weights == "vllm":
            return _json({"status": "resumed"})
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def _is_paused(self, request: web.Request) -> web.Response:
        assert self.running is not None
        return _json({"is_paused": not self.running.is_set()})

    async def _abort_requests(self, request: web.Request) -> web.Response:
        return _json({"status": "aborted", "aborted": self.server.abort_all()})

    # -- weights ------------------------------------------------------------------------
    async def _load(self, path: str) -> None:
        """Load `path` (load_time_s); new requests wait meanwhile (or are aborted), and
        until the caller's own `loaded.set()` when it had cleared it."""
        assert self.loaded is not None
        owned = self.loaded.is_set()
        self.loaded.clear()
        try:
            await asyncio.sleep(self.server.options.load_time_s)
            self.server.options.model_path = path
            self.server.stats["weight_updates"] += 1
        finally:
            if owned:
                self.loaded.set()

    async def _collective_rpc(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if body.get("method") != "reload_weights":
            return self._bad(f"method {body.get('method')!r}: only reload_weights here", 400)
        kwargs = body.get("kwargs") or {}
        if self.server.flavor.weights == "vllm010":
            if kwargs:  # reload_weights() takes no arguments in 0.10.2
                return _json({"error": f"reload_weights() got an unexpected keyword argument "
                                       f"{next(iter(kwargs))!r}"}, 500)
            path = self.server.options.model_path
        else:
            path = str(kwargs.get("weights_path") or self.server.options.model_path)
        await self._load(path)
        return _json({"results": [None]})

    async def _update_weight_version(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if "new_version" not in body:
            return self._bad("new_version is required", 422)
        if self.server.flavor.weights == "sglang" and body.get("abort_all_requests", True):
            self.server.abort_all()  # io_struct.py:2155-2159: aborts what runs by default
        self.server.options.weight_version = str(body["new_version"])
        if self.server.flavor.weights == "vllm":
            return _json({"success": True, "new_version": self.label})
        return _json({"success": True, "message": "Weight version updated."})

    async def _weight_info(self, request: web.Request) -> web.Response:
        return _json({"weight_version": self.label})

    async def _update_from_disk(self, request: web.Request) -> web.Response:
        """SGLang's update from disk: abort what runs (when asked) or wait for it (unless
        paused), load, take the new version, serve under the new model_path."""
        body = await _body(request)
        if "model_path" not in body:
            return self._bad("model_path is required", 400)
        path, server = str(body["model_path"]), self.server
        assert self.running is not None and self.loaded is not None
        self.loaded.clear()  # the writer lock: new requests wait from now
        try:
            aborted = server.abort_all() if body.get("abort_all_requests") else 0
            while self.running.is_set() and server.pending:  # requests in flight finish first
                await asyncio.sleep(0.01)
            await self._load(path)
            server.served = path  # tokenizer_manager.py:2365-2370 (0.4.10: :996-1000)
            if body.get("weight_version") is not None and server.flavor.weights == "sglang":
                server.options.weight_version = str(body["weight_version"])
        finally:
            self.loaded.set()
        return _json({"success": True, "message": "Succeeded to update model weights.",
                      "num_paused_requests": aborted})

    async def _model_info(self, request: web.Request) -> web.Response:
        opts = self.server.options
        info: dict[str, Any] = {"model_path": opts.model_path, "tokenizer_path": opts.model_path,
                                "is_generation": True}
        if self.server.flavor.weights == "sglang":
            info |= {"served_model_name": self.server.served,
                     "weight_version": self.label}
        return _json(info)

    async def _load_lora(self, request: web.Request) -> web.Response:
        body = await _body(request)
        try:
            name, path = str(body["lora_name"]), str(body["lora_path"])
        except KeyError as exc:
            return self._bad(f"bad request: {exc}", 400)
        if name in self.server.adapters:
            return self.server.refused(Refusal(
                400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput"))
        await asyncio.sleep(self.server.options.load_time_s)
        self.server.adapters[name] = path
        return _text(f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name = str(body.get("lora_name"))
        if self.server.adapters.pop(name, None) is None:
            return self.server.refused(Refusal(
                404, f"The lora adapter '{name}' cannot be found.", "NotFoundError"))
        return _text(f"Success: LoRA adapter '{name}' removed successfully.")

    # -- admin --------------------------------------------------------------------------
    async def _admin_faults(self, request: web.Request) -> web.Response:
        try:
            kind, count = admin_faults_body(await request.json())
            self.server.faults.fail_next(kind, count)
        except (ValueError, KeyError, TypeError) as exc:
            return self._bad(f"bad request: {exc}", 400)
        return _json({"scripted": self.server.faults.scripted})

    async def _admin_stats(self, request: web.Request) -> web.Response:
        return _json({**self.server.stats, "weight_version": self.label,
                      "adapters": sorted(self.server.adapters),
                      "flavor": self.server.flavor.name})

    def _bad(self, message: str, status: int) -> web.Response:
        return self.server.refused(Refusal(status, message))


async def _body(request: web.Request) -> dict[str, Any]:
    """A request's JSON object (an empty or unreadable body: {})."""
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _json(data: Any, status: int = 200) -> web.Response:
    return json_response(data, status)


def _text(text: str) -> web.Response:
    return text_response(text)
