"""One turn of an agent's chat: its messages, the request body, and the reply read back into
a `Turn` (text, token ids, logprobs, weight version).

The messages are rendered as ROLL's env manager of the tag renders them
(`producers.llm.prompts`: TrajEnvManager's conversation, the step managers' fresh prompts, an
env's own chat); a turn's sampling fields come from `producers.llm.sampling` (the mode's
settings and ROLL's token cap).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import orjson

from producers.llm import prompts
from producers.policies.protocol import StepContext, Turn
from schemas.envspec import AgentPrompt
from schemas.policy import reported_weight_version

CHAT_KEY = prompts.CHAT_KEY  # the scratch entry holding the episode's conversation


def messages_for_turn(ctx: StepContext, observation: Any, prompt: AgentPrompt,
                      max_response_length: int) -> list[dict[str, str]]:
    """This turn's messages (a conversation: the episode's, with this turn's user message
    appended); `max_response_length` is what the template's placeholder says."""
    return prompts.render(ctx, observation, prompt, max_response_length)


def request_body(model: str, messages: list[dict[str, str]], *, sampling: dict[str, Any],
                 seed: int, extra_body: dict[str, Any]) -> bytes:
    """A chat completion request asking for logprobs and (vLLM >= 0.10.2) token ids, with the
    turn's sampling fields (`producers.llm.sampling.TurnSampling.fields`).

    `seed` makes sampling reproducible on servers that honour it, and tells apart the
    members of a group, which send identical prompts."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        **sampling,
        "seed": seed,
        "logprobs": True,
        "return_token_ids": True,
    }
    if extra_body:
        body.update(extra_body)
    return orjson.dumps(body)


def turn_from_answer(data: dict[str, Any]) -> Turn:
    """The first choice of a completion as a `Turn` (server and latency are the caller's).

    Token ids come from vLLM's `prompt_token_ids` and `choices[0].token_ids`, logprobs from
    `choices[0].logprobs.content[j].logprob`; missing ones are None (a server that does not
    return them). The weight version is SGLang's `metadata.weight_version` (or
    `meta_info.weight_version`) when it is a number (digits; "default" is none)."""
    choice = data["choices"][0]
    message = choice.get("message") or {}
    logprobs: np.ndarray | None = None
    content = (choice.get("logprobs") or {}).get("content")
    if content:
        logprobs = np.fromiter((item["logprob"] for item in content), dtype=np.float32,
                               count=len(content))
    turn = Turn(  # numpy arrays where Turn takes sequences: the wire wants arrays anyway
        text=message.get("content") or "",
        prompt_ids=cast(Any, _int32(data.get("prompt_token_ids"))),
        response_ids=cast(Any, _int32(choice.get("token_ids"))),
        logprobs=cast(Any, logprobs),
        finish_reason=choice.get("finish_reason"),
    )
    reported = reported_weight_version(data)
    if reported is not None and reported.isdigit():
        turn.version, turn.version_source = int(reported), "server"
    return turn


def _int32(ids: list[int] | None) -> np.ndarray | None:
    """Token ids as the int32 array the step carries (fromiter: twice as fast as asarray)."""
    if ids is None:
        return None
    return np.fromiter(ids, dtype=np.int32, count=len(ids))


def turn_seed(ctx: StepContext) -> int:
    """A request seed from the episode seed, the member and the turn (31 bits)."""
    return (ctx.seed * 1_000_003 + ctx.member * 7_919 + ctx.turn) & 0x7FFF_FFFF
