"""What differs between inference servers, as their released code answers: one `Flavor` per
server and version. The stand-in (`rollstream.fake_llm.app`) plays the same scripted model
under every flavor; the flavor decides which requests it refuses and how, how it fits a turn
into the context window, and the shape of every answer.

Read from the released packages (citations are `file:line` inside each package; the field
lists and error wordings are also extracted by `scripts/server_shapes.py` into
`tests/data/servers/shapes.json`, which `tests/test_server_flavors.py` holds the flavors to):

- `vllm`, vLLM 0.33.0: ids top-level `prompt_token_ids` and choice `token_ids`; logprobs
  with `logprobs: true`; versions in choice `weight_versions` spans; max_tokens cut to fit.
- `vllm010`, vLLM 0.10.2: the same ids and logprobs; no versions; a long turn refused (400).
- `sglang`, SGLang 0.5.23: ids per choice (`prompt_token_ids`, `response_token_ids`);
  versions in `metadata`; a long turn refused (400, three wordings).
- `sglang04`, SGLang 0.4.10: no ids, no versions.
- `llamacpp`, llama.cpp's `llama-server` (as vendored in llama-cpp-python 0.3.36): ids only
  in `logprobs.content[].id`; logprobs by default (20 tops), none with `top_logprobs: 0`;
  generation stops at the end of the context (`length`).
- `llama-cpp-python`, its 0.3.36 server: no ids; logprobs only with a non-null
  `top_logprobs`; a long prompt 400, a turn that reaches the context's end 500.
- `strict`, transformers serve 5.24.0: 422 for any field OpenAI's API lacks; no ids, no
  logprobs, no context check.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rollstream.fake_llm.player import SPECIAL_IDS, token_id

# OpenAI's chat request fields (openai 3.57.0, types/chat/completion_create_params.py
# CompletionCreateParamsBase) plus what transformers serve 5.24 adds
# (cli/serving/chat_completion.py:63-66) and `stream`: everything else is a 422.
OPENAI_CHAT_FIELDS = frozenset((
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions",
    "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities",
    "moderation", "n", "parallel_tool_calls", "prediction", "presence_penalty",
    "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "reasoning_effort",
    "response_format", "safety_identifier", "seed", "service_tier", "stop", "store",
    "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user",
    "verbosity", "web_search_options", "stream", "generation_config", "chat_template_kwargs"))


@dataclass
class Reply:
    """One generated turn, before a flavor shapes it."""

    text: str
    pieces: list[str]  # the reply's tokens (the last may be <|im_end|>)
    logprobs: list[float]
    finish: str  # stop, length or abort
    prompt: list[str]  # the prompt's tokens
    spans: list[tuple[str, int, int]] = field(default_factory=list)  # weight version label,
    # first token, end token: who sampled which tokens


@dataclass
class Refusal:
    """An error answer: HTTP status, message, error type (and a flavor's own extra fields)."""

    status: int
    message: str
    kind: str = "BadRequestError"
    param: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Flavor:
    """vLLM 0.33.0 (`vllm/entrypoints/openai/chat_completion/protocol.py` and `serving.py`);
    the other flavors change what differs."""

    name = "vllm"
    title = "vLLM 0.33.0"
    owned_by = "vllm"
    checks_model = True  # an unknown `model` is a 404 (vLLM's serving_models)
    lora = True  # runtime LoRA adapters (VLLM_ALLOW_RUNTIME_LORA_UPDATING)
    weights = "vllm"  # which control endpoints (rollstream.fake_llm.control)
    pause_modes: tuple[str, ...] = ("abort", "wait", "keep")  # /pause?mode=
    abort_finish = True  # aborted requests answer finish_reason "abort"

    # -- requests ------------------------------------------------------------------------
    def refuse(self, body: dict[str, Any]) -> Refusal | None:
        """The request's own errors, before any generation."""
        top = body.get("top_logprobs")
        # chat_completion/protocol.py:913-925: negative top_logprobs (other than -1), or
        # top_logprobs without logprobs
        if isinstance(top, int) and (top < -1 or (top != 0 and not body.get("logprobs"))):
            return Refusal(400, "when using `top_logprobs`, `logprobs` must be set to true.",
                           param="top_logprobs")
        return None

    def fit(self, prompt_n: int, max_tokens: int | None, n_ctx: int
            ) -> Refusal | int:
        """A refusal for the context window, else how many tokens the turn may generate."""
        # renderers/params.py:272-284 (max_tokens past the window), :531-552 (the prompt)
        if max_tokens is not None and max_tokens > n_ctx:
            return Refusal(400, f"max_tokens={max_tokens} cannot be greater than "
                                f"max_model_len={n_ctx}. Please request fewer output tokens.",
                           param="max_tokens")
        if prompt_n > n_ctx:
            return Refusal(400, f"This model's maximum context length is {n_ctx} tokens. "
                                f"However, your prompt contains {prompt_n} input tokens, which "
                                "exceeds this limit even without any output tokens. Please "
                                "reduce the length of the input prompt.", param="input_tokens")
        # serve/utils/api_utils.py:234-270: max_tokens is cut to what fits, not refused;
        # sampling_params.py:691-696 refuses the 0 left by a prompt of exactly the window
        budget = n_ctx - prompt_n if max_tokens is None else min(max_tokens, n_ctx - prompt_n)
        if budget < 1:
            return Refusal(400, f"max_tokens must be at least 1, got {budget}.",
                           param="max_tokens")
        return budget

    # -- answers -------------------------------------------------------------------------
    def answer(self, body: dict[str, Any], model: str, reply: Reply) -> dict[str, Any]:
        """A chat completion as `ChatCompletionResponse.model_dump()` gives it (every field,
        None where unset; ChatMessage drops an empty `tool_calls`)."""
        ids = bool(body.get("return_token_ids"))
        choice: dict[str, Any] = {
            "index": 0,
            "message": self.message(reply.text),
            "logprobs": self.logprobs(body, reply),
            "finish_reason": reply.finish,
            "stop_reason": None,
            "token_ids": _ids(reply.pieces) if ids else None,
            "routed_experts": None,
            "weight_versions": self.spans(reply) if body.get("return_weight_versions")
            else None,
        }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "service_tier": None, "system_fingerprint": None, "usage": self.usage(reply),
            "prompt_logprobs": None,
            "prompt_token_ids": _ids(reply.prompt) if ids else None,
            "prompt_text": None, "kv_transfer_params": None, "ec_transfer_params": None,
            "metrics": None,
        }

    def message(self, text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                "audio": None, "function_call": None, "reasoning": None}

    def usage(self, reply: Reply) -> dict[str, Any]:
        n, m = len(reply.prompt), len(reply.pieces)
        return {"prompt_tokens": n, "total_tokens": n + m, "completion_tokens": m,
                "prompt_tokens_details": None, "completion_tokens_details": None}

    def logprobs(self, body: dict[str, Any], reply: Reply) -> dict[str, Any] | None:
        """`ChatCompletionLogProbs`: one entry per token, `top_logprobs` entries as asked."""
        if not body.get("logprobs"):
            return None
        top = body.get("top_logprobs") or 0
        return {"content": [self.entry(piece, lp, top) for piece, lp
                            in zip(reply.pieces, reply.logprobs, strict=True)]}

    def entry(self, piece: str, logprob: float, top: int) -> dict[str, Any]:
        tops = [{"token": piece, "logprob": logprob, "bytes": list(piece.encode())}][:top]
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode()),
                "top_logprobs": tops}

    def spans(self, reply: Reply) -> list[dict[str, Any]]:
        """`WeightVersionSpan`s (vllm/outputs.py:50-55): output tokens [start, end) were
        sampled by weights labelled `version`."""
        return [{"version": v, "start": s, "end": e} for v, s, e in reply.spans]

    def error(self, refusal: Refusal) -> dict[str, Any]:
        """`ErrorResponse` (serve/engine/protocol.py:79-87)."""
        return {"error": {"message": refusal.message, "type": refusal.kind,
                          "param": refusal.param, "code": refusal.status}}

    def not_found(self, model: str) -> Refusal:
        return Refusal(404, f"The model `{model}` does not exist.", "NotFoundError", "model")

    def models(self, served: str, root: str, n_ctx: int,
               adapters: dict[str, str]) -> dict[str, Any]:
        """`GET /v1/models`: `ModelCard`s (serve/engine/protocol.py:105-113)."""
        now = int(time.time())
        cards = [{"id": served, "object": "model", "created": now, "owned_by": self.owned_by,
                  "root": root, "parent": None, "max_model_len": n_ctx, "permission": []}]
        cards += [{"id": name, "object": "model", "created": now, "owned_by": self.owned_by,
                   "root": path, "parent": served, "max_model_len": n_ctx, "permission": []}
                  for name, path in adapters.items()]
        return {"object": "list", "data": cards}


class VLLM010(Flavor):
    """vLLM 0.10.2 (`vllm/entrypoints/openai/protocol.py`, `serving_engine.py`): no weight
    versions, no pause; a turn longer than the window is refused, not cut."""

    name = "vllm010"
    title = "vLLM 0.10.2"
    weights = "vllm010"
    pause_modes = ()

    def refuse(self, body: dict[str, Any]) -> Refusal | None:
        top = body.get("top_logprobs")  # protocol.py:820-841
        if isinstance(top, int) and (top < 0 or (top > 0 and not body.get("logprobs"))):
            return Refusal(400, "when using `top_logprobs`, `logprobs` must be set to true.",
                           param="top_logprobs")
        return None

    def fit(self, prompt_n: int, max_tokens: int | None, n_ctx: int) -> Refusal | int:
        # serving_engine.py:618-690
        if prompt_n >= n_ctx:
            return Refusal(400, f"This model's maximum context length is {n_ctx} tokens. "
                                f"However, your request has {prompt_n} input tokens. Please "
                                "reduce the length of the input messages.")
        if max_tokens is not None and prompt_n + max_tokens > n_ctx:
            return Refusal(400, f"'max_tokens' or 'max_completion_tokens' is too large: "
                                f"{max_tokens}. This model's maximum context length is {n_ctx} "
                                f"tokens and your request has {prompt_n} input tokens "
                                f"({max_tokens} > {n_ctx} - {prompt_n}).")
        return n_ctx - prompt_n if max_tokens is None else max_tokens

    def answer(self, body: dict[str, Any], model: str, reply: Reply) -> dict[str, Any]:
        out = super().answer(body, model, reply)
        for key in ("prompt_text", "ec_transfer_params", "metrics"):
            del out[key]
        for key in ("routed_experts", "weight_versions"):
            del out["choices"][0][key]
        del out["usage"]["completion_tokens_details"]
        return out

    def message(self, text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                "audio": None, "function_call": None, "reasoning_content": None}


class SGLang(Flavor):
    """SGLang 0.5.23 (`sglang/srt/entrypoints/openai/protocol.py`, `serving_chat.py`)."""

    name = "sglang"
    title = "SGLang 0.5.23"
    owned_by = "sglang"
    checks_model = False  # chat answers `model=request.model` whatever it is (:3046)
    lora = False
    weights = "sglang"
    pause_modes: tuple[str, ...] = ("abort", "in_place", "retract")  # io_struct.py:1927-1946
    total_check_ge = False  # tokenizer_manager.py:1357 (0.4.10: >=)

    def refuse(self, body: dict[str, Any]) -> Refusal | None:
        if body.get("stream") and body.get("return_token_ids"):  # serving_chat.py:1309-1320
            return Refusal(400, "return_token_ids is not supported with streaming on "
                                "/v1/chat/completions.", "BadRequest")
        return None  # top_logprobs alone is ignored (serving_chat.py:1372-1374)

    def fit(self, prompt_n: int, max_tokens: int | None, n_ctx: int) -> Refusal | int:
        # tokenizer_manager.py:1335-1375, then the scheduler (scheduler.py:3246-3254,
        # managers/utils.py:259-285) with max_req_input_len = context - 1 - 5
        # (tp_worker.py:568-572; the KV pool taken as large)
        if prompt_n >= n_ctx:
            return Refusal(400, f"The input ({prompt_n} tokens) is longer than the model's "
                                f"context length ({n_ctx} tokens).", "BadRequest")
        if max_tokens is not None and (
                prompt_n + max_tokens >= n_ctx if self.total_check_ge
                else prompt_n + max_tokens > n_ctx):
            return Refusal(400, f"Requested token count exceeds the model's maximum context "
                                f"length of {n_ctx} tokens. You requested a total of "
                                f"{prompt_n + max_tokens} tokens: {prompt_n} tokens from the "
                                f"input messages and {max_tokens} tokens for the completion. "
                                "Please reduce the number of tokens in the input messages or "
                                "the completion to fit within the limit.", "BadRequest")
        allowed = n_ctx - 1 - 5
        if prompt_n >= allowed:
            return Refusal(400, f"Input length ({prompt_n} tokens) exceeds the maximum allowed "
                                f"length ({allowed} tokens). Use a shorter input or enable "
                                "--allow-auto-truncate.", "BadRequest")
        return n_ctx - prompt_n if max_tokens is None else max_tokens

    def answer(self, body: dict[str, Any], model: str, reply: Reply) -> dict[str, Any]:
        """serving_chat.py:2975-3049: ids per choice (their keys dropped when None,
        protocol.py:1318-1333), `metadata` with the version (weight_versions.py:90-118)."""
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": reply.text, "reasoning_content": None},
            "logprobs": self.logprobs(body, reply),
            "finish_reason": reply.finish,
            "matched_stop": token_id("<|im_end|>") if reply.finish == "stop" else None,
        }
        if body.get("return_token_ids") or body.get("return_prompt_token_ids"):
            choice["prompt_token_ids"] = _ids(reply.prompt)
        if body.get("return_token_ids"):
            choice["response_token_ids"] = _ids(reply.pieces)
        n, m = len(reply.prompt), len(reply.pieces)
        return {
            "id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice],
            "usage": {"prompt_tokens": n, "total_tokens": n + m, "completion_tokens": m,
                      "prompt_tokens_details": None, "reasoning_tokens": 0,
                      "completion_tokens_details": None},
            "metadata": {"weight_version": reply.spans[-1][0],
                         "weight_versions": self.spans(reply)},
        }

    def entry(self, piece: str, logprob: float, top: int) -> dict[str, Any]:
        tops = [{"token": piece, "bytes": list(piece.encode()), "logprob": logprob}][:top]
        return {"token": piece, "bytes": list(piece.encode()), "logprob": logprob,
                "top_logprobs": tops}

    def error(self, refusal: Refusal) -> dict[str, Any]:
        """`ErrorResponse`, flat (protocol.py:106-111, serving_base.py:123-128)."""
        return {"object": "error", "message": refusal.message, "type": refusal.kind,
                "param": refusal.param, "code": refusal.status}

    def models(self, served: str, root: str, n_ctx: int,
               adapters: dict[str, str]) -> dict[str, Any]:
        """http_server.py:1993-2022: one card named as the tokenizer manager serves it (the
        checkpoint path after an update)."""
        return {"object": "list", "data": [
            {"id": served, "object": "model", "created": int(time.time()),
             "owned_by": self.owned_by, "root": served, "parent": None,
             "max_model_len": n_ctx}]}


class SGLang04(SGLang):
    """SGLang 0.4.10: no ids, no `metadata`, `/pause_generation` aborts everything."""

    name = "sglang04"
    title = "SGLang 0.4.10"
    weights = "sglang04"
    pause_modes = ("abort",)  # tokenizer_manager.py:958-966: no mode
    total_check_ge = True  # tokenizer_manager.py:571

    def refuse(self, body: dict[str, Any]) -> Refusal | None:
        return None

    def answer(self, body: dict[str, Any], model: str, reply: Reply) -> dict[str, Any]:
        out = super().answer(body, model, reply)  # protocol.py:476-512: no ids, no metadata
        choice = out["choices"][0]
        choice.pop("prompt_token_ids", None)
        choice.pop("response_token_ids", None)
        del out["metadata"]
        del out["usage"]["reasoning_tokens"], out["usage"]["completion_tokens_details"]
        return out

    def models(self, served: str, root: str, n_ctx: int,
               adapters: dict[str, str]) -> dict[str, Any]:
        out = super().models(served, root, n_ctx, adapters)  # protocol.py:30-37: no parent
        del out["data"][0]["parent"]
        return out


class LlamaServer(Flavor):
    """llama.cpp's `llama-server` as vendored in llama-cpp-python 0.3.36 (`tools/server/`),
    and as measured (tests/data/servers/llamacpp)."""

    name = "llamacpp"
    title = "llama.cpp llama-server (llama-cpp-python 0.3.36's vendored copy)"
    owned_by = "llamacpp"
    checks_model = False
    lora = False
    weights = "none"
    pause_modes = ()
    abort_finish = False

    def refuse(self, body: dict[str, Any]) -> Refusal | None:
        if not body.get("logprobs") and body.get("top_logprobs") is not None:
            return Refusal(400, "top_logprobs requires logprobs to be set to true",
                           "invalid_request_error")  # server-common.cpp:1429-1438
        return None

    def fit(self, prompt_n: int, max_tokens: int | None, n_ctx: int) -> Refusal | int:
        if prompt_n >= n_ctx:  # server-context.cpp:3185-3192
            return Refusal(400, f"request ({prompt_n} tokens) exceeds the available context "
                                f"size ({n_ctx} tokens), try increasing it",
                           "exceed_context_size_error",
                           extra={"n_prompt_tokens": prompt_n, "n_ctx": n_ctx})
        # no context shift: generation stops at the end of the context (length),
        # server-context.cpp:1866-1873
        left = n_ctx - prompt_n
        return left if max_tokens is None else min(max_tokens, left)

    def answer(self, body: dict[str, Any], model: str, reply: Reply) -> dict[str, Any]:
        choice: dict[str, Any] = {"finish_reason": reply.finish, "index": 0,
                                  "message": {"role": "assistant", "content": reply.text}}
        logprobs = self.logprobs(body, reply)
        if logprobs is not None:  # server-task.cpp:375-392: the key only with logprobs
            choice["logprobs"] = logprobs
        n, m = len(reply.prompt), len(reply.pieces)
        return {"choices": [choice], "created": int(time.time()), "model": model,
                "system_fingerprint": "b1-0c1e570", "object": "chat.completion",
                "usage": {"completion_tokens": m, "prompt_tokens": n, "total_tokens": n + m,
                          "prompt_tokens_details": {"cached_tokens": 0}},
                "id": f"chatcmpl-{uuid.uuid4().hex[:32]}",
                "timings": {"cache_n": 0, "prompt_n": n, "predicted_n": m}}

    def logprobs(self, body: dict[str, Any], reply: Reply) -> dict[str, Any] | None:
        # n_probs = top_logprobs, default 20; 0 collects nothing (server-context.cpp:2058)
        if not body.get("logprobs"):
            return None
        top = body.get("top_logprobs")
        top = 20 if top is None else top
        if top <= 0:
            return None
        return {"content": [self.entry(piece, lp, top) for piece, lp
                            in zip(reply.pieces, reply.logprobs, strict=True)]}

    def entry(self, piece: str, logprob: float, top: int) -> dict[str, Any]:
        """server-task.cpp:264-300: the sampled token's `id` with each entry."""
        one = {"id": token_id(piece), "token": piece, "bytes": list(piece.encode()),
               "logprob": logprob}
        tops = [one] + [{"id": token_id(piece) + k, "token": f"{piece}~{k}",
                         "bytes": list(f"{piece}~{k}".encode()), "logprob": logprob - k}
                        for k in range(1, top)]
        return {**one, "top_logprobs": tops}

    def error(self, refusal: Refusal) -> dict[str, Any]:
        return {"error": {"code": refusal.status, "message": refusal.message,
                          "type": refusal.kind, **refusal.extra}}

    def not_found(self, model: str) -> Refusal:
        return Refusal(404, "File Not Found", "not_found_error")

    def models(self, served: str, root: str, n_ctx: int,
               adapters: dict[str, str]) -> dict[str, Any]:
        """As measured (tests/data/servers/llamacpp/models.json): the alias, and the context
        size in `meta.n_ctx`."""
        return {"models": [{"name": served, "model": served, "type": "model"}],
                "object": "list",
                "data": [{"id": served, "aliases": [served], "tags": [], "object": "model",
                          "created": int(time.time()), "owned_by": self.owned_by,
                          "meta": {"vocab_type": 2, "n_vocab": 32_100, "n_ctx": n_ctx,
                                   "n_ctx_train": max(n_ctx, 4096)}}]}


class LlamaCppPython(LlamaServer):
    """llama-cpp-python 0.3.36's server (`llama_cpp/server/`, `llama_chat_format.py`), and as
    measured (tests/data/servers/llama_cpp_python)."""

    name = "llama-cpp-python"
    title = "llama-cpp-python 0.3.36"
    owned_by = "me"

    def refuse(self, body: dict[str, Any]) -> Refusal | None:
        return None  # top_logprobs alone: 200 and no logprobs (measured)

    def fit(self, prompt_n: int, max_tokens: int | None, n_ctx: int) -> Refusal | int:
        if prompt_n >= n_ctx:  # llama.py:1343-1346, turned into a 400 by server/errors.py:47-83
            return Refusal(400, f"This model's maximum context length is {n_ctx} tokens. "
                                f"However, you requested {prompt_n + (max_tokens or 0)} tokens "
                                f"({prompt_n} in the messages, {max_tokens} in the completion). "
                                "Please reduce the length of the messages or completion.",
                           "invalid_request_error", "messages",
                           extra={"code": "context_length_exceeded"})
        # measured: a turn that runs to the end of the context answers 500 "llama_decode
        # returned 1", every time, while /v1/models answers (an unset max_tokens runs there)
        if max_tokens is None or prompt_n + max_tokens >= n_ctx:
            return Refusal(500, "llama_decode returned 1", "internal_server_error")
        return max_tokens

    def answer(self, body: dict[str, Any], model: str, reply: Reply) -> dict[str, Any]:
        n, m = len(reply.prompt), len(reply.pieces)
        return {"id": f"chatcmpl-{uuid.uuid4()}", "object": "chat.completion",
                "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": {"content": reply.text,
                                                     "role": "assistant"},
                             "logprobs": self.logprobs(body, reply),
                             "finish_reason": reply.finish}],
                "usage": {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}}

    def logprobs(self, body: dict[str, Any], reply: Reply) -> dict[str, Any] | None:
        # llama_chat_format.py:731: logprobs=top_logprobs if logprobs else None, so a null
        # top_logprobs gives none; 0 gives one top entry (measured)
        top = body.get("top_logprobs")
        if not body.get("logprobs") or top is None:
            return None
        return {"content": [self.entry(piece, lp, max(top, 1)) for piece, lp
                            in zip(reply.pieces, reply.logprobs, strict=True)],
                "refusal": None}  # as measured (chat_logprobs_top2.json)

    def entry(self, piece: str, logprob: float, top: int) -> dict[str, Any]:
        one = {"token": piece, "logprob": logprob, "bytes": None}
        tops = [one] + [{"token": f"{piece}~{k}", "logprob": logprob - k, "bytes": None}
                        for k in range(1, top)]
        return {**one, "top_logprobs": tops}

    def error(self, refusal: Refusal) -> dict[str, Any]:
        """`ErrorResponse` (server/errors.py:26-31)."""
        return {"error": {"message": refusal.message, "type": refusal.kind,
                          "param": refusal.param, "code": refusal.extra.get("code")}}

    def models(self, served: str, root: str, n_ctx: int,
               adapters: dict[str, str]) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served, "object": "model", "owned_by": "me",
                                            "permissions": []}]}  # server/app.py:529-549


class Strict(Flavor):
    """transformers serve 5.24.0 (`transformers/cli/serving/`): every chat request is checked
    against OpenAI's fields (422 for any other), no logprobs, no ids, no context check."""

    name = "strict"
    title = "transformers serve 5.24.0"
    lora = False
    weights = "none"
    pause_modes = ()
    abort_finish = False

    def refuse(self, body: dict[str, Any]) -> Refusal | None:
        unexpected = set(body) - OPENAI_CHAT_FIELDS  # utils.py:1180-1190
        if unexpected:
            return Refusal(422, f"Unexpected fields in the request: {unexpected}")
        return None

    def fit(self, prompt_n: int, max_tokens: int | None, n_ctx: int) -> Refusal | int:
        return 256 if max_tokens is None else max_tokens  # no check in the serving code

    def answer(self, body: dict[str, Any], model: str, reply: Reply) -> dict[str, Any]:
        """openai's `ChatCompletion` as transformers builds it (chat_completion.py:375-410)."""
        n, m = len(reply.prompt), len(reply.pieces)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": model, "system_fingerprint": None,
                "choices": [{"index": 0, "finish_reason": reply.finish, "logprobs": None,
                             "message": {"role": "assistant", "content": reply.text}}],
                "usage": {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}}

    def error(self, refusal: Refusal) -> dict[str, Any]:
        return {"detail": refusal.message}  # FastAPI's HTTPException

    def not_found(self, model: str) -> Refusal:
        return Refusal(404, f"Model {model} not found")

    def models(self, served: str, root: str, n_ctx: int,
               adapters: dict[str, str]) -> dict[str, Any]:
        """The served model as a card (model_manager.py:536-543): owned by the organisation
        part of its hub name, none without one (utils.py:123)."""
        owner = served.split("/")[0] if "/" in served else ""
        return {"object": "list", "data": [{"id": served, "object": "model", "created": 0,
                                            "owned_by": owner}]}


FLAVORS: dict[str, Flavor] = {flavor.name: flavor for flavor in (
    Flavor(), VLLM010(), SGLang(), SGLang04(), LlamaServer(), LlamaCppPython(), Strict())}


def _ids(pieces: list[str]) -> list[int]:
    return [token_id(p) for p in pieces]


__all__ = ["FLAVORS", "Flavor", "Refusal", "Reply", "SPECIAL_IDS"]
