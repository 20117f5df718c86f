"""Which server a base URL is, told from its `GET /v1/models` answer, and what follows from
that: how to ask it for logprobs and weight versions, where its context limit is, and what its
own setting for the context window is called (so a message names the flag a user changes).

Read from the servers' released code (docs/llm-servers.md has the table):
- vLLM (0.10.2, 0.33.0): cards `owned_by: "vllm"` with `max_model_len`
  (`entrypoints/serve/engine/protocol.py:105-113`); logprobs with `logprobs: true`
  (`top_logprobs` defaults to 0); ids with `return_token_ids`; 0.33 labels each choice's
  tokens with `weight_versions` when asked `return_weight_versions` (0.10.2 does not know the
  field: its answers lack the key, and the pool stops asking).
- SGLang (0.4.10, 0.5.23): `owned_by: "sglang"`, `max_model_len` (`protocol.py:87-96`);
  logprobs with `logprobs: true`; versions in every answer's `metadata`.
- llama.cpp's `llama-server`: `owned_by: "llamacpp"`, the context in `data[].meta.n_ctx`
  (measured, tests/data/servers/llamacpp/models.json); `logprobs: true` alone returns 20 top
  logprobs per token (`server-common.cpp:1429-1438`), so it is asked for 1.
- llama-cpp-python's server (0.3.36): `owned_by: "me"` and `permissions` (`server/app.py:
  529-549`); logprobs only with a non-null `top_logprobs` (`llama_chat_format.py:731`).
- anything else (transformers serve, hosted APIs, routers that rewrite cards): `logprobs:
  true`; when its answers carry none, `top_logprobs: 1` is tried once before a warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Dialect:
    """What the pool knows of one kind of server."""

    name: str  # how messages name the server
    top_logprobs: int | None  # sent with `logprobs: true` (None: not sent)
    weight_versions: bool  # ask for per-token version spans (`return_weight_versions`)
    context_setting: str  # the server's own name for its context window


VLLM = Dialect("vLLM", None, True, "--max-model-len (max_model_len)")
SGLANG = Dialect("SGLang", None, False, "--context-length (max_model_len)")
LLAMA_SERVER = Dialect("llama-server", 1, False, "-c / --ctx-size (n_ctx)")
LLAMA_CPP_PYTHON = Dialect("llama-cpp-python", 1, False, "--n_ctx (n_ctx)")
OTHER = Dialect("OpenAI-compatible server", None, False, "its context window")

_BY_OWNER = {"vllm": VLLM, "sglang": SGLANG, "llamacpp": LLAMA_SERVER}


def identify(cards: list[Any]) -> Dialect:
    """The dialect of a server from the cards of its `GET /v1/models` answer."""
    for card in cards:
        if not isinstance(card, dict):
            continue
        found = _BY_OWNER.get(str(card.get("owned_by", "")).lower())
        if found is not None:
            return found
        if card.get("owned_by") == "me" and "permissions" in card:
            return LLAMA_CPP_PYTHON
    return OTHER


def context_limit(cards: list[Any], model: str | None = None) -> int | None:
    """The context window a server reports for `model` (or its first card): vLLM's and
    SGLang's `max_model_len`, llama-server's `meta.n_ctx`; None when it says nothing."""
    chosen = [c for c in cards if isinstance(c, dict) and (model is None or c.get("id") == model)]
    for card in chosen or [c for c in cards if isinstance(c, dict)]:
        for value in (card.get("max_model_len"), (card.get("meta") or {}).get("n_ctx")
                      if isinstance(card.get("meta"), dict) else None):
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None
