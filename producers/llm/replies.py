"""What a model server's answer means: worth another try (`Transient`), a request longer than
the model's context window (`is_context_overflow`), the message to show (`error_text`), and
the weight versions that generated it (`weight_labels`). `ServerPool` reads every answer
with these; `ServerSet` keeps a `Transient`'s reason when it sets a server aside.
"""

from __future__ import annotations

from typing import Any

import orjson

from schemas.policy import error_message

TRANSIENT_4XX = frozenset((408, 429))  # timeouts and rate limits: worth another try


class Transient(Exception):
    """A failure worth retrying; `timeout` when the server did not answer in time, `lost` when
    it lost the weights it was recorded with (not worth retrying there)."""

    def __init__(self, message: str, *, timeout: bool = False, lost: bool = False,
                 status: int | None = None):
        super().__init__(message)
        self.timeout = timeout
        self.lost = lost
        self.status = status  # the HTTP status of an error answer
        self.refused = False  # counted against the request: the server answers others


# How servers word a request longer than the model's context window (docs/llm-servers.md;
# tests/data/servers/shapes.json holds the wordings read from each release):
# - vLLM 0.33 "This model's maximum context length is M tokens. However, your prompt contains
#   N input tokens, ..." (`renderers/params.py:544`), and "max_tokens must be at least 1, got
#   0." for a prompt of exactly M tokens (`sampling_params.py:693`, after max_tokens was cut
#   to M - N); vLLM 0.10.2 the same opening, and "'max_tokens' or 'max_completion_tokens' is
#   too large: X. This model's maximum context length is ..."; its engine "The decoder
#   prompt (length N) is longer than the maximum model length of M";
# - SGLang (0.4.10, 0.5.23) "The input (N tokens) is longer than the model's context length
#   (M tokens).", "Requested token count exceeds the model's maximum context length of M
#   tokens. ..." (`managers/tokenizer_manager.py`) and the scheduler's "Input length (N
#   tokens) exceeds the maximum allowed length (L tokens). ..." (`managers/utils.py:283`);
# - llama-server "request (N tokens) exceeds the available context size (M tokens), try
#   increasing it", type `exceed_context_size_error` (`server-context.cpp:3185-3192`);
# - llama-cpp-python and OpenAI's API: code `context_length_exceeded`; others "context window".
CONTEXT_OVERFLOW = ("context length", "context_length", "context window", "context size",
                    "maximum model length", "maximum allowed length", "input is too long",
                    "prompt is too long", "max_tokens must be at least 1, got 0")
# llama-cpp-python 0.3.36 answers a turn that runs into the end of its context with HTTP 500
# "llama_decode returned 1" (no free KV slot: `_internals.py:334`), every time, while its
# health check answers (measured, tests/data/servers/llama_cpp_python/chat_fills_context.json)
KV_FULL = "llama_decode returned 1"


def is_context_overflow(status: int, raw: bytes) -> bool:
    """A 400 (or 413/422) whose body (its message or its error code) says the request is
    longer than the context window, or llama-cpp-python's 500 for a full context."""
    if status == 500:
        return KV_FULL.encode() in raw[:4096]
    if status not in (400, 413, 422):
        return False
    text = raw[:4096].decode(errors="replace").lower()
    return any(phrase in text for phrase in CONTEXT_OVERFLOW)


def weight_labels(answer: dict[str, Any]) -> list[tuple[str, int, int]]:
    """The weight versions that generated an answer's first choice, as (label, first token,
    end token) spans: vLLM 0.33's per-choice `weight_versions` (asked with
    `return_weight_versions`, `chat_completion/protocol.py:140`), SGLang's `metadata.
    weight_versions` or `metadata.weight_version` (`weight_versions.py:90-118`; older
    answers `meta_info`). [] when it reports none. Only digits are a rollstream version
    ("default": the server's launch weights)."""
    spans = answer["choices"][0].get("weight_versions")
    if not spans:
        meta = answer.get("metadata") or answer.get("meta_info")
        if not isinstance(meta, dict):
            return []
        spans = meta.get("weight_versions")
        if not spans:
            label = meta.get("weight_version")
            return [] if label is None else [(str(label), 0, 0)]
    out = []
    for span in spans:
        if isinstance(span, dict) and span.get("version") is not None:
            out.append((str(span["version"]), int(span.get("start") or 0),
                        int(span.get("end") or 0)))
    return out


def error_text(raw: bytes) -> str:
    """What an error body says went wrong (see `error_message`), else its first 200
    characters."""
    try:
        message = error_message(orjson.loads(raw))
    except ValueError:
        message = None
    return raw[:200].decode(errors="replace") if message is None else message
