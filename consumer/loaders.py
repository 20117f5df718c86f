"""How a model server pauses and loads a checkpoint, per server (`ModelServers`' `method`), and
how it tells what it holds. Read from the servers' released code (docs/llm-servers.md):

- `"sglang"` (0.4.10, 0.5.23; `entrypoints/http_server.py`): `POST /update_weights_from_disk
  {"model_path", "weight_version", "abort_all_requests"}`; with a pause mode, `POST
  /pause_generation {"mode"}` first (`abort`: requests in flight end `finish_reason:
  "abort"`; `in_place`: they stay with their KV cache; `retract`: back to the queue, their
  cache recomputed; 0.4.10 takes no mode and aborts) and `POST /continue_generation` after.
  It holds: `GET /model_info`'s `weight_version` (`/get_weight_version` before 0.5).
- `"vllm"` (0.33, `VLLM_SERVER_DEV_MODE=1`; `entrypoints/rl/online/api_router.py`,
  `entrypoints/serve/dev/rpc/api_router.py`): `POST /pause?mode=abort|wait|keep`, `POST
  /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}`, `POST
  /update_weight_version {"new_version"}` (the label its answers' `weight_versions` carry),
  `POST /resume` (sent even when a step failed: a server is never left paused). It holds:
  `GET /weight_info`'s `weight_version`.
- `"vllm-lora"`: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`, `/v1/
  unload_lora_adapter {"lora_name"}` (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`); it holds the
  adapters `GET /v1/models` lists.

Every call goes through `ServerHTTP.request`, which names the server in each error
(`ServerUpdateError`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from schemas.errors import ServerUpdateError
from schemas.policy import error_message, request_headers

CHECK_TIMEOUT_S = 10.0  # asking a server what it holds (a load may take `timeout_s`)
PAUSE_MODES = {  # method -> its pause modes (None: the method's default, see ModelServers)
    "sglang": ("abort", "in_place", "retract"),
    "vllm": ("abort", "wait", "keep"),
    "vllm-lora": (),
}


class ServerHTTP:
    """JSON requests to model servers, with the API key, within `timeout_s`."""

    def __init__(self, api_key: str | None, timeout_s: float):
        self.headers = request_headers(api_key)
        self.timeout_s = timeout_s

    # -- SGLang -------------------------------------------------------------------------
    def sglang_load(self, base_url: str, version: int, checkpoint: str, *,
                    pause_mode: str | None, abort_requests: bool) -> None:
        root = _root(base_url)
        if pause_mode is not None:
            self._ok(base_url, f"{root}/pause_generation", {"mode": pause_mode},
                     f"pause_generation ({pause_mode})")
        with self._then(base_url, f"{root}/continue_generation", "continue_generation",
                        pause_mode is not None):
            status, data = self.post(base_url, f"{root}/update_weights_from_disk", {
                "model_path": checkpoint, "weight_version": str(version),
                "abort_all_requests": abort_requests and pause_mode is None})
            if status != 200 or not (isinstance(data, dict) and data.get("success")):
                raise ServerUpdateError(f"model server {base_url}: update_weights_from_disk to "
                                        f"version {version} failed (HTTP {status}): "
                                        f"{_message(data)}")

    def sglang_version(self, base_url: str) -> str | None:
        """The `weight_version` an SGLang server reports (None: it does not say)."""
        for route in ("/model_info", "/get_weight_version"):  # the older servers' route
            status, data = self.request(base_url, f"{_root(base_url)}{route}", None,
                                        min(self.timeout_s, CHECK_TIMEOUT_S))
            if status == 200 and isinstance(data, dict):
                value = data.get("weight_version")
                return None if value is None else str(value)
            if status != 404:
                raise ServerUpdateError(f"model server {base_url}: GET {route} failed "
                                        f"(HTTP {status}): {_message(data)}")
        return None

    # -- vLLM, full weights --------------------------------------------------------------
    def vllm_load(self, base_url: str, version: int, checkpoint: str, *,
                  pause_mode: str) -> None:
        """Pause, reload from `checkpoint`, label the weights `version`, resume."""
        root = _root(base_url)
        query = urllib.parse.urlencode({"mode": pause_mode})
        self._ok(base_url, f"{root}/pause?{query}", {}, f"pause?mode={pause_mode}",
                 dev_mode=True)
        with self._then(base_url, f"{root}/resume", "resume"):
            self._ok(base_url, f"{root}/collective_rpc", {
                "method": "reload_weights", "kwargs": {"weights_path": checkpoint}},
                f"collective_rpc reload_weights from {checkpoint}")
            self._ok(base_url, f"{root}/update_weight_version", {"new_version": str(version)},
                     f"update_weight_version to {version}")

    def vllm_version(self, base_url: str) -> str | None:
        """The weight version label a vLLM server reports (None: it does not say)."""
        status, data = self.request(base_url, f"{_root(base_url)}/weight_info", None,
                                    min(self.timeout_s, CHECK_TIMEOUT_S))
        if status == 200 and isinstance(data, dict) and data.get("weight_version") is not None:
            return str(data["weight_version"])
        if status in (200, 404):
            return None
        raise ServerUpdateError(f"model server {base_url}: GET /weight_info failed "
                                f"(HTTP {status}): {_message(data)}")

    # -- vLLM, LoRA adapters ------------------------------------------------------------
    def lora_load(self, base_url: str, name: str, checkpoint: str) -> None:
        status, data = self.post(base_url, f"{base_url}/load_lora_adapter",
                                 {"lora_name": name, "lora_path": checkpoint})
        if status != 200:
            raise ServerUpdateError(f"model server {base_url}: load_lora_adapter {name!r} "
                                    f"failed (HTTP {status}): {_message(data)}")

    def lora_unload(self, base_url: str, name: str) -> None:
        status, data = self.post(base_url, f"{base_url}/unload_lora_adapter",
                                 {"lora_name": name})
        if status not in (200, 404):  # 404: gone already
            raise ServerUpdateError(f"model server {base_url}: unload_lora_adapter {name!r} "
                                    f"failed (HTTP {status}): {_message(data)}")

    def model_ids(self, base_url: str) -> list[str]:
        """The model ids `GET /models` lists."""
        status, data = self.request(base_url, f"{base_url}/models", None,
                                    min(self.timeout_s, CHECK_TIMEOUT_S))
        if status != 200 or not isinstance(data, dict):
            raise ServerUpdateError(f"model server {base_url}: GET /models failed "
                                    f"(HTTP {status}): {_message(data)}")
        return [str(card.get("id", "")) for card in data.get("data") or []
                if isinstance(card, dict)]

    # -- HTTP ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _then(self, base_url: str, url: str, what: str, needed: bool = True) -> Iterator[None]:
        """Run the block, then POST `url` (a resume) whatever the block did: a server is
        never left paused. The block's own error wins over the resume's."""
        try:
            yield
        except BaseException:
            if needed:
                with contextlib.suppress(ServerUpdateError):
                    self._ok(base_url, url, {}, what)
            raise
        if needed:
            self._ok(base_url, url, {}, what)

    def _ok(self, base_url: str, url: str, body: dict[str, Any], what: str, *,
            dev_mode: bool = False) -> None:
        status, data = self.post(base_url, url, body)
        if status == 200:
            return
        hint = " (vLLM serves it only with VLLM_SERVER_DEV_MODE=1)" \
            if dev_mode and status == 404 else ""
        raise ServerUpdateError(f"model server {base_url}: {what} failed (HTTP {status}): "
                                f"{_message(data)}{hint}")

    def post(self, base_url: str, url: str, body: dict[str, Any]) -> tuple[int, Any]:
        return self.request(base_url, url, json.dumps(body).encode())

    def request(self, base_url: str, url: str, data: bytes | None,
                timeout_s: float | None = None) -> tuple[int, Any]:
        """(status, decoded JSON or text) of a GET (no data) or a JSON POST, within
        `timeout_s` (default: the loads' `timeout_s`); a server that cannot be reached is a
        `ServerUpdateError` naming it."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        request = urllib.request.Request(url, data=data, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except http.client.HTTPException as exc:  # something on the port that is not HTTP
            raise ServerUpdateError(f"model server {base_url}: {url} answered with no valid "
                                    f"HTTP ({type(exc).__name__})") from None
        except TimeoutError:  # it took the request and did not answer in time
            raise ServerUpdateError(f"model server {base_url}: {url} did not answer within "
                                    f"{timeout_s:g}s (a slow weight load? raise "
                                    "timeout_s)") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise ServerUpdateError(f"model server {base_url}: {url} did not answer within "
                                        f"{timeout_s:g}s") from None
            raise ServerUpdateError(f"model server {base_url}: {url} cannot be reached: "
                                    f"{reason}") from None
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")


def _root(base_url: str) -> str:
    """The server's root (SGLang's and vLLM's native endpoints live there): the base URL
    without /v1."""
    return base_url[:-3] if base_url.endswith("/v1") else base_url


def _message(data: Any) -> str:
    """What a server said went wrong (see `error_message`), else its first 200 characters."""
    message = error_message(data)
    return str(data)[:200] if message is None else message
