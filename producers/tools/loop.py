"""The tool loop of one env turn: the model's calls run, their results go back as `tool`
messages, and the model is asked again, until it answers without a call (that reply goes to
the env), a call is malformed, or `max_rounds` rounds are used.

A tag has tools when its config says so (`custom_envs.TAG.tools`, `schemas.tools.ToolsSpec`)
or its env lists its own (`env.tools`: OpenAI function schemas, run by `env.call_tool(name,
arguments)`, plain or async). Each reply's calls are read by the tag's parser
(`producers.tools.parsers`; `ToolsSpec.reader`: unset, `server` with chat requests and
`hermes` with token-in/token-out): `server` sends `tools` and `tool_choice` and reads the
server's `tool_calls`; a text parser (`hermes`) sends `tools` with `tool_choice: none` (vLLM
0.33 renders the tools into the prompt and parses nothing: `chat_completion/serving.py`,
`exclude_tools_when_tool_choice_none` off by default) and reads the text itself; under
token-in/token-out (`policy.tokenizer`) the producer renders the tools into the prompt itself
and a text parser reads the sampled text (`producers.llm.tito`). At most
`max_calls_per_turn` calls of a reply run (concurrently); the others are answered "not run"
(every call id gets its `tool` message).

A malformed call (see `parsers`) ends the loop: the env gets the reply as the model wrote it
and judges it (an unparsable answer: the env's format penalty). Each is counted on the step
(`tool_malformed`, summed per batch as `tools/malformed`), and the first of each kind in the
process is logged with the raw text, so a parser that never matches is seen at the first
batch. The step records its rounds (`tool_rounds`: each reply's text, calls and results),
each round's reply as a model call (`model_calls[k]` is round k's: prompt and response ids,
logprobs, version, as an agent's calls are recorded, so `trajectory_tokens` trains on every
round's sampled tokens and on no tool result) and `tool_calls` (calls run).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from producers.policies.protocol import StepContext, Turn
from producers.tools import parsers
from producers.tools.sandbox import run_python
from schemas.tools import ToolsSpec

logger = logging.getLogger(__name__)

RESULT_CHARS = 2000  # of each tool result kept in the step's record (the model gets it all)
Generate = Callable[[], Awaitable[tuple[Turn, dict[str, Any]]]]  # one more reply
Tools = tuple[ToolsSpec, list[dict[str, Any]]]  # a tag's spec (its reader set) and schemas


def tools_of(env: Any, token_exact: bool = False) -> Tools | None:
    """The tag's tools (spec, OpenAI schemas), or None when it has none; the spec's parser
    is the one its turns read with (`ToolsSpec.reader`: `token_exact` for token-in/
    token-out turns)."""
    spec = getattr(env, "tool_spec", None)
    env_tools = getattr(env, "tools", None)
    if spec is None and not env_tools:
        return None
    spec = spec or ToolsSpec()
    reader = spec.reader(token_exact)
    if spec.parser != reader:
        spec = spec.model_copy(update={"parser": reader})
    return spec, spec.schemas(list(env_tools or []))


def request_fields(spec: ToolsSpec, schemas: list[dict[str, Any]]) -> dict[str, Any]:
    """What a chat request adds for the tag's tools (see the module docstring)."""
    return {"tools": schemas,
            "tool_choice": spec.tool_choice if spec.parser == "server" else "none"}


class ToolLoop:
    """One per policy: runs the tool loop of a turn (`play`) and logs the first malformed
    call of each kind."""

    def __init__(self) -> None:
        self.seen_kinds: set[str] = set()
        self._slots: dict[str, asyncio.Semaphore] = {}  # tag -> its sandboxes running

    def parse(self, spec: ToolsSpec, schemas: list[dict[str, Any]], turn: Turn,
              data: dict[str, Any], prefix: str) -> parsers.Parsed:
        if spec.parser == "server":
            message = (data.get("choices") or [{}])[0].get("message") or {}
            parsed = parsers.from_server(message, prefix)
        else:
            parsed = parsers.TEXT_PARSERS[spec.reader(token_exact=True)](turn.text, prefix)
        return parsers.check(parsed, schemas)

    async def play(self, env: Any, ctx: StepContext, messages: list[dict[str, Any]],
                   turn: Turn, data: dict[str, Any], generate: Generate, *,
                   tools: Tools | None = None,
                   replied: Callable[[Turn], None] | None = None) -> Turn:
        """Run the calls of `turn` (the first reply) and ask again until the reply goes to
        the env; returns that reply, with the rounds recorded on it. `messages` grows by
        each round's assistant and tool messages (the caller appends the last reply).
        `tools`: the tag's, as `tools_of` gave them (default: read from the env, chat
        requests); `replied(turn)`: called once a round's assistant message is appended,
        before its tool messages (token-in/token-out: the next prompt extends its ids)."""
        found = tools or tools_of(env)
        assert found is not None
        spec, schemas = found
        rounds: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []  # each round's reply as a model call
        calls_run = malformed = 0
        for n in range(spec.max_rounds + 1):
            parsed = self.parse(spec, schemas, turn, data, f"call_{ctx.turn}_{n}")
            if parsed.malformed:
                malformed += len(parsed.malformed)
                self._log_malformed(ctx.tag, parsed.malformed)
                break
            if not parsed.calls or n == spec.max_rounds:
                break
            cap = spec.max_calls_per_turn
            run, over = parsed.calls[:cap], parsed.calls[cap:]
            results = await asyncio.gather(*(self._call(env, spec, call, ctx.tag)
                                             for call in run))
            messages.append(self._assistant(spec, turn.text, parsed))
            if replied is not None:
                replied(turn)
            for call, result in zip(run, results, strict=True):
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            for call in over:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": f"not run: at most {spec.max_calls_per_turn} "
                                            "tool calls per turn"})
            calls_run += len(run)
            rounds.append(_record(turn, parsed, results, len(over)))
            calls.append(turn.call_record())
            turn, data = await generate()
        if rounds:
            turn.extra["tool_rounds"] = rounds
            turn.extra["model_calls"] = calls
        turn.extra["tool_calls"] = calls_run
        turn.extra["tool_malformed"] = malformed
        return turn

    @staticmethod
    def _assistant(spec: ToolsSpec, text: str, parsed: parsers.Parsed) -> dict[str, Any]:
        """The reply as the next request shows it: with the server's parser, its content and
        `tool_calls` (the chat template renders them again); with a text parser, the text as
        the model wrote it (the server parses nothing)."""
        if spec.parser != "server":
            return {"role": "assistant", "content": text}
        return {"role": "assistant", "content": parsed.content or None, "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in parsed.calls]}

    async def _call(self, env: Any, spec: ToolsSpec, call: parsers.ToolCall, tag: str) -> str:
        """One call's result text: the sandbox for `python` (when the tag declares it; at
        most `python.max_parallel` of the tag's at once), else the env's `call_tool`; an
        error is the result (the model reads it)."""
        if call.name == "python" and "python" in spec.functions:
            code = call.arguments.get("code")
            if not isinstance(code, str):
                return "error: python takes {\"code\": \"...\"}"
            slots = self._slots.get(tag)
            if slots is None:
                slots = self._slots[tag] = asyncio.Semaphore(spec.python.max_parallel)
            async with slots:
                return (await run_python(code, spec.python)).for_model()
        call_tool = getattr(env, "call_tool", None)
        if call_tool is None:
            return f"error: no tool {call.name!r} here"
        try:
            result = call_tool(call.name, call.arguments)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # the env's tool failed: the model is told, the run goes on
            logger.debug("tool %s failed: %r", call.name, exc)
            return f"error: {type(exc).__name__}: {exc}"
        return result if isinstance(result, str) else json.dumps(result, default=str)

    def _log_malformed(self, tag: str, items: list[parsers.Malformed]) -> None:
        for item in items:
            if item.kind in self.seen_kinds:
                continue
            self.seen_kinds.add(item.kind)
            logger.warning("tag %s: malformed tool call (%s: %s), the first of its kind; "
                           "the env judges the reply as written. Raw: %r", tag, item.kind,
                           item.why, item.raw[:500])


def _record(turn: Turn, parsed: parsers.Parsed, results: list[str],
            not_run: int) -> dict[str, Any]:
    """One round as the step records it."""
    out: dict[str, Any] = {
        "response": turn.text,
        "calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                  for c in parsed.calls],
        "results": [r[:RESULT_CHARS] for r in results],
        "not_run": not_run,
    }
    return out
