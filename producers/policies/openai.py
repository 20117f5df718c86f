"""The `openai` policy: an LLM behind one or more OpenAI-compatible servers (vLLM, SGLang, a
router) plays the envs through chat completions.

Each episode is one conversation in ROLL's agentic format (see `producers.llm.chat`), built
from the tag's `agent_system_template`, `agent_template` and `max_tokens_per_step`. Each
turn returns a `Turn`: the reply text (the env parses it with its `action_pattern`), the prompt
and response token ids and logprobs as the server produced them (None where the server does
not return them), `finish_reason`, the server that answered, its latency, and the weight
version when the server reports one. Val episodes sample at `val_temperature`.

The API key is read at `start()` from the environment variable `api_key_env` names and sent
as `Authorization: Bearer`; it is never logged and never leaves the process otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any

from producers.policies import StepContext, Turn
from schemas.envspec import DEFAULT_AGENT_SYSTEM_TEMPLATE, DEFAULT_AGENT_TEMPLATE, AgentPrompt
from schemas.errors import PolicyError
from schemas.policy import OpenAIPolicyConfig

logger = logging.getLogger(__name__)

# The cyclic GC's default gen-0 threshold (700) makes it run every few requests with
# thousands of replies in flight; measured with 1,000 in flight: 0.47 ms of client CPU per
# request at 700, 0.34 ms at 50,000 (bench/bench_llm.py --compare-clients).
GC_GEN0_THRESHOLD = 50_000
_DEFAULT_PROMPT = AgentPrompt(DEFAULT_AGENT_SYSTEM_TEMPLATE, DEFAULT_AGENT_TEMPLATE)  # an env
# built without `build_env` (no tag)
_ABORT_RETRY_S = 0.2  # a turn the server aborted (weights being updated) is sent again after


class OpenAIPolicy:
    """See the module docstring. Built by `make_policy` from an `OpenAIPolicyConfig`."""

    def __init__(self, config: OpenAIPolicyConfig):
        try:
            from producers.llm import chat
            from producers.llm.pool import ServerPool
        except ImportError as exc:  # aiohttp and orjson come with the llm extra
            raise PolicyError(f"policy.type openai needs the llm extra (pip install "
                              f"'rollstream[llm]'): {exc}") from None
        self.config = config
        self._chat = chat
        self._pool_class = ServerPool
        self.pool: Any = None
        self._gc_threshold: tuple[int, ...] | None = None  # to restore at close

    async def start(self) -> None:
        """Read the API key, open the HTTP session, check that a server serves the model."""
        config = self.config
        api_key = None
        if config.api_key_env:
            api_key = os.environ.get(config.api_key_env)
            if not api_key:
                raise PolicyError(f"policy.api_key_env: the environment variable "
                                  f"{config.api_key_env} is not set")
        threshold = gc.get_threshold()
        if threshold[0] < GC_GEN0_THRESHOLD:
            self._gc_threshold = threshold
            gc.set_threshold(GC_GEN0_THRESHOLD, *threshold[1:])
        self.pool = self._pool_class(config.base_urls, api_key=api_key,
                                     timeout_s=config.timeout_s, max_retries=config.max_retries,
                                     max_inflight=config.max_inflight)
        await self.pool.start()
        try:
            await self.pool.check_model(config.model)
        except BaseException:
            await self.close()
            raise
        logger.info("openai policy: model %r on %d server(s)", config.model,
                    len(self.pool.servers))

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            self._gc_threshold = None

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, Turn]:
        config, chat = self.config, self._chat
        env = ctx.env.unwrapped
        prompt: AgentPrompt = getattr(env, "agent_prompt", None) or _DEFAULT_PROMPT
        max_tokens = prompt.max_tokens_per_step or config.max_tokens
        messages = chat.messages_for_turn(ctx, observation, prompt, max_tokens)
        temperature = config.val_temperature if ctx.mode == "val" else config.temperature
        body = chat.request_body(config.model, messages, temperature=temperature,
                                 top_p=config.top_p, top_k=config.top_k, max_tokens=max_tokens,
                                 seed=chat.turn_seed(ctx), extra_body=config.extra_body)
        while True:
            answer = await self.pool.chat(body)
            turn = chat.turn_from_answer(answer.data)
            if turn.finish_reason != "abort":
                break
            await asyncio.sleep(_ABORT_RETRY_S)  # the server is updating its weights
        turn.server = answer.server.base_url
        turn.latency_s = answer.latency_s
        messages.append({"role": "assistant", "content": turn.text})
        parse = getattr(env, "parse_action", None)
        action = parse(turn.text) if parse is not None else None
        return (-1 if action is None else action), turn
