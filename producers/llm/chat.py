"""One turn of an agent's chat: the user message in ROLL's agentic format, the request body,
and the reply read back into a `Turn` (text, token ids, logprobs, weight version).

The conversation of an episode lives in its `StepContext.scratch`, placed as ROLL's
TrajEnvManager places it (roll/pipeline/agentic/env_manager/traj_env_manager.py at
8eb27cc2): the system message is the tag's `agent_system_template` alone; each turn adds the
user message (`agent_template` filled with `turn_idx`, `observation`, `actions_left`,
`max_response_length`; the first one opens with the env's instruction and a newline) and the
assistant's reply as the server sent it. An env that builds its own chat, as ROLL's native
envs do (`system_prompt()`, `user_prompt(observation, turn)`), gives both messages itself.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import orjson

from producers.policies.protocol import StepContext, Turn
from schemas.envspec import AgentPrompt
from schemas.policy import reported_weight_version

CHAT_KEY = "chat"  # the scratch entry holding the episode's messages


def messages_for_turn(ctx: StepContext, observation: Any, prompt: AgentPrompt,
                      max_tokens: int) -> list[dict[str, str]]:
    """The episode's conversation with this turn's user message appended."""
    env = ctx.env.unwrapped
    native = callable(getattr(env, "user_prompt", None))
    messages: list[dict[str, str]] | None = ctx.scratch.get(CHAT_KEY)
    if messages is None:
        system = env.system_prompt() if native else prompt.system_template
        messages = ctx.scratch[CHAT_KEY] = [{"role": "system", "content": system}]
    if native:
        content = env.user_prompt(observation, ctx.turn)
    else:
        max_steps = getattr(env, "max_steps", None)
        if max_steps is None and ctx.env.spec is not None:
            max_steps = ctx.env.spec.max_episode_steps
        actions_left = max(int(max_steps) - ctx.turn, 0) if max_steps else "unknown"
        content = prompt.template.format(
            turn_idx=ctx.turn + 1, observation=observation, actions_left=actions_left,
            max_response_length=max_tokens)
        instruction = getattr(env, "instruction", "") if ctx.turn == 0 else ""
        if instruction:
            content = f"{instruction}\n{content}"
    messages.append({"role": "user", "content": content})
    return messages


def request_body(model: str, messages: list[dict[str, str]], *, temperature: float,
                 top_p: float, top_k: int, max_tokens: int, seed: int,
                 extra_body: dict[str, Any]) -> bytes:
    """A chat completion request asking for logprobs and (vLLM >= 0.10.2) token ids.

    `seed` makes sampling reproducible on servers that honour it, and tells apart the
    members of a group, which send identical prompts."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "seed": seed,
        "logprobs": True,
        "return_token_ids": True,
    }
    if top_k > 0:
        body["top_k"] = top_k
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
