"""What a model server's error answer means: worth another try (`Transient`), a request
longer than the model's context window (`is_context_overflow`), and the message to show
(`error_text`). `ServerPool` reads every answer with these; `ServerSet` keeps a
`Transient`'s reason when it sets a server aside.
"""

from __future__ import annotations

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


def error_text(raw: bytes) -> str:
    """What an error body says went wrong (see `error_message`), else its first 200
    characters."""
    try:
        message = error_message(orjson.loads(raw))
    except ValueError:
        message = None
    return raw[:200].decode(errors="replace") if message is None else message
