"""A python policy's own agent loop: `policy.llm` gives its `start(context)` a model client,
`context.llm` (`LLM`), whose `await llm.chat(messages, ctx)` is ONE model call through the
producer's server pool, and every call made during an `act` is recorded on the step, token
for token.

- **The pool.** `policy.llm` holds the `openai` policy's server fields
  (`schemas.policy.AgentLLMConfig`); the producer starts one `openai` policy for it
  (`AgentPolicy.start`: the API key, the HTTP session, the start check, the versions the
  servers hold) and the client sends through it: retries, health, `require_version`, the
  episode's sticky session (`mode:group:episode`, the key the `openai` policy uses, so an
  agent's calls share the server's prefix cache), the same version labels
  (`producers.llm.labels`).
- **A call.** `llm.chat(messages, ctx, **sampling)` asks for one reply to `messages` with
  the mode's sampling (`policy.llm.sampling`, the `openai` policy's), the keyword
  arguments overriding it (`temperature`, `top_p`, `top_k`, `stop`, `repetition_penalty`,
  `include_stop_str_in_output`; `max_tokens` caps it, as a tag's `max_tokens_per_step`
  does), appends the reply to `messages` as an assistant message and returns its `Turn`.
  With chat requests `tools` (OpenAI function schemas) and `tool_choice` go in the body;
  with token-in/token-out the chat template renders `tools` into a list's first prompt (as
  a server renders a chat request's) and `tool_choice` has no use: the reply is the text,
  its calls read by the agent (`producers.tools.parsers.parse_hermes`), their results
  appended as `tool` messages, whose tokens the next call's prompt adds.
  Call k of a step sends the seed `turn_seed(ctx) + k * CALL_SEED_STRIDE`: call 0 is the
  `openai` policy's seed, and two calls of a turn on one prompt sample apart.
- **Token-in/token-out** (`policy.llm.tokenizer`): the producer applies the chat template
  and sends ids (`producers.llm.tito`). Each message list (the same Python object) is a
  conversation of its own: its next call extends the previous call's prompt ids and sampled
  ids exactly; a new list is rendered afresh. A sub-call on a fresh list never disturbs the
  main conversation.
- **Recording.** The calls of one `act` are kept in call order (the order they were
  started). The step's own `prompt_ids`, `response_ids`, `logprobs`, `version` and the rest
  are the last call's (or those of a `Turn` the policy built itself and returned), and the
  calls before it go in `model_calls` (a list of maps with `response`, `prompt_ids`,
  `response_ids`, `logprobs`, `finish_reason`, `version`, `version_source`, `server`,
  `latency_s`). The step's `response` is what `act` returned (its `Turn`'s text, its
  string); `act` returning None steps the env with its action, as always. The batch's
  `turn_tokens()` gives one row per call, `trajectory_tokens()` joins a step's calls in
  order.
- **No half turn.** An `act` cut short (a pause, an abort) or failed records nothing, and the
  conversations' ids go back to where they were; a call the server aborted raises
  `TurnAborted` (let it through: the producer calls `act` again), except with
  `policy.partial_rollout.in_flight: resume` and token-in/token-out, where it is continued
  from its ids as the openai policy's turns are (`OpenAIPolicy.sample`, one path for both).
  `llm.chat` outside an `act` raises `RuntimeError`: the step would not record it.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from producers.llm.labels import label_version
from producers.llm.routing import session_key
from producers.llm.sampling import for_turn
from producers.policies.protocol import PolicyContext, StepContext, Turn, start_policy
from schemas.policy import AgentLLMConfig

CALLS_KEY = "llm_calls"  # scratch: the calls of the `act` in flight, in call order
CONVERSATIONS_KEY = "llm_conversations"  # scratch: id(messages) -> that list's tito state
CALL_SEED_STRIDE = 1_000_033  # call k of a turn: the turn's seed + k * this (31 bits)
OVERRIDES = frozenset(("temperature", "top_p", "top_k", "max_tokens", "stop",
                       "repetition_penalty", "include_stop_str_in_output"))


class LLM:
    """The model client a python policy gets as `context.llm` (see the module docstring)."""

    def __init__(self, host: Any):
        self._host = host  # the openai policy that owns the pool (producers/policies/openai)

    @property
    def model(self) -> str:
        return str(self._host.config.model)

    async def chat(self, messages: list[dict[str, Any]], ctx: StepContext, *,
                   tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
                   **sampling: Any) -> Turn:
        """One reply to `messages` (see the module docstring)."""
        calls: list[Turn | None] | None = ctx.scratch.get(CALLS_KEY)
        if calls is None:
            raise RuntimeError("llm.chat is called inside act (the step records its calls)")
        unknown = sorted(set(sampling) - OVERRIDES)
        if unknown:
            raise ValueError(f"llm.chat: {unknown[0]!r} is not a sampling setting it takes "
                             f"(one of {', '.join(sorted(OVERRIDES))})")
        host, config = self._host, self._host.config
        tito = host._tito
        if ctx.version > host._view_version and host._context is not None:
            await host._read_servers_at(ctx.version)  # what the servers hold after a publish
        sampled = for_turn(config.sampling, ctx.mode, sampling.pop("max_tokens", None))
        extra_body = dict(config.extra_body)
        if tools is not None and tito is None:  # token-in/token-out: in the prompt (below)
            extra_body["tools"] = tools
        if tool_choice is not None and tito is None:
            extra_body["tool_choice"] = tool_choice
        min_version = host._min_version(ctx) if config.require_version else None
        session = session_key(ctx.mode, ctx.group_id, ctx.episode_id)  # the group's episode
        index = len(calls)
        calls.append(None)  # its place in call order, filled when it answers
        seed = (host._chat.turn_seed(ctx) + index * CALL_SEED_STRIDE) & 0x7FFF_FFFF
        conversations: dict[int, dict[str, Any]] = ctx.scratch.setdefault(CONVERSATIONS_KEY,
                                                                            {})
        state: dict[str, Any] = {}
        ids = None
        if tito is not None:  # this list's own ids so far (a fresh list: none)
            state = dict(conversations.get(id(messages), {}))
            ids = tito.prompt_ids(host._template, state, messages, tools)

        def request(prompt: Any, cap: int | None) -> dict[str, Any]:
            fields = {**sampled.fields(cap), **sampling}
            if prompt is not None:
                return tito.request_body(config.model, prompt, sampling=fields, seed=seed,
                                         extra_body=extra_body)
            return host._chat.request_body(config.model, messages, sampling=fields,
                                           seed=seed, extra_body=extra_body)

        turn, answer = await host.sample(request, ids, sampled, ctx, min_version, session)
        label_version(turn, answer, ctx.version, host._context is not None)
        messages.append({"role": "assistant", "content": turn.text})
        if ids is not None:  # the next call on this list extends these ids
            tito.remember(state, messages, ids, turn.response_ids)
            conversations[id(messages)] = state
        calls[index] = turn
        return turn


class AgentPolicy:
    """A python policy with `policy.llm`: the user's policy, given `context.llm` at start,
    and each step's calls recorded (see the module docstring). `set_weights`,
    `decode_weights` and `act_now` are the user's own."""

    def __init__(self, policy: Any, config: AgentLLMConfig):
        from producers.policies.openai import OpenAIPolicy

        self.policy = policy
        self.host = OpenAIPolicy(config)
        self.llm = LLM(self.host)
        for name in ("set_weights", "decode_weights", "act_now"):
            method = getattr(policy, name, None)
            if callable(method):
                setattr(self, name, method)

    async def start(self, context: PolicyContext | None = None) -> None:
        """Start the server pool, then the user's policy with `context.llm`."""
        await self.host.start(context)
        try:
            if context is None:  # used directly, not by a producer
                context = PolicyContext(redis=None, keys=None, config=None,  # type: ignore[arg-type]
                                        producer_id="")
            await start_policy(self.policy, dataclasses.replace(context, llm=self.llm))
        except BaseException:
            await self.host.close()
            raise

    async def close(self) -> None:
        try:
            close = getattr(self.policy, "close", None)
            if close is not None:
                result = close()
                if inspect.isawaitable(result):
                    await result
        finally:
            await self.host.close()

    def servers_down(self) -> dict[str, str]:
        return self.host.servers_down()  # type: ignore[no-any-return]

    async def act(self, observation: Any, ctx: StepContext) -> Any:
        scratch = ctx.scratch
        calls: list[Turn | None] = []
        scratch[CALLS_KEY] = calls
        conversations = scratch.get(CONVERSATIONS_KEY)
        saved = None if conversations is None else dict(conversations)
        try:
            chosen = await self.policy.act(observation, ctx)
        except BaseException:  # cut short, aborted or failed: the ids as they were
            if saved is None:
                scratch.pop(CONVERSATIONS_KEY, None)
            else:
                scratch[CONVERSATIONS_KEY] = saved
            raise
        finally:
            del scratch[CALLS_KEY]
        made = [turn for turn in calls if turn is not None]
        if not made or not (isinstance(chosen, tuple | list) and len(chosen) == 2):
            return chosen  # no call (or not a pair: the producer names what came back)
        return chosen[0], recorded(chosen[1], made)


def recorded(response: Any, made: list[Turn]) -> Turn:
    """The step's `Turn`: the last call's (or the policy's own `Turn`) with the calls before
    it as `model_calls`, and the text `act` returned (None: the env takes the action)."""
    if isinstance(response, Turn) and not any(response is turn for turn in made):
        own, earlier = response, made
    else:
        own, earlier = made[-1], made[:-1]
    text = response.text if isinstance(response, Turn) else response
    extra = dict(own.extra)
    if earlier:
        extra["model_calls"] = [call_record(turn) for turn in earlier]
    return dataclasses.replace(own, text=text, extra=extra)


def call_record(turn: Turn) -> dict[str, Any]:
    """One earlier call as the step's `model_calls` holds it."""
    return turn.call_record()
