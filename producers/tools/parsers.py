"""Tool calls read from a model's reply: pure functions, no I/O.

Two sources, one result (`Parsed`: the reply's text before the calls, the calls, and what was
malformed):

- `from_server(message)`: the server's parsed `tool_calls` in a chat completion's message
  (vLLM with `--enable-auto-tool-choice --tool-call-parser hermes`, SGLang with
  `--tool-call-parser qwen25`). vLLM 0.33 (`vllm/tool_parsers/hermes_tool_parser.py`,
  `extract_tool_calls`) drops every call of a reply when one block is not JSON and returns
  the whole text as `content`: a `<tool_call>` left in the content is a malformed call.
  SGLang 0.5.23 (`sglang/srt/function_call/qwen25_detector.py`, `detect_and_parse`; and
  `base_format_detector.py`, `parse_base_json`) skips a bad block or an unknown function
  with a server-side warning and returns the text before the first call: such a call is
  gone before we see it (use `parser: hermes` with a server started without a tool parser
  to count those).
- a text parser by name (`TEXT_PARSERS`, pluggable with `register`): `hermes` reads
  Hermes/Qwen2.5/Qwen3 `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, as
  vLLM's hermes parser reads them (an unclosed last block runs to the end of the text), but
  per block: a bad block is malformed, the others are still calls. For token-in/token-out
  turns and servers without a tool parser.

Malformed kinds (`Malformed.kind`, counted per batch as `tools/malformed`): `bad_json` (a
block or an `arguments` string that is not a JSON object), `no_name` (no function name),
`unparsed` (a `<tool_call>` the server did not turn into a call), and, checked against the
declared tools (`check`), `unknown_tool` and `bad_arguments` (a required parameter missing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schemas import tools as tool_schemas

TOOL_CALL_START = "<tool_call>"
# vLLM 0.33's hermes_tool_parser.py tool_call_regex: closed blocks, or an unclosed last one
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    id: str  # the server's call id, or ours (`call_<turn>_<n>`) for text-parsed calls
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Malformed:
    kind: str  # bad_json, no_name, unparsed, unknown_tool, bad_arguments
    raw: str  # the text the model wrote for it
    why: str = ""


@dataclass
class Parsed:
    content: str  # the reply's text before its calls (all of it without calls)
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[Malformed] = field(default_factory=list)


def _call_from(obj: Any, raw: str, call_id: str) -> ToolCall | Malformed:
    """A `{"name": ..., "arguments": {...}}` object as a call (SGLang also takes
    `parameters`)."""
    if not isinstance(obj, dict):
        return Malformed("bad_json", raw, "not a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return Malformed("no_name", raw, "no function name")
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            return Malformed("bad_json", raw, f"arguments: {exc}")
    if not isinstance(arguments, dict):
        return Malformed("bad_json", raw, "arguments are not a JSON object")
    return ToolCall(call_id, name, arguments)


def parse_hermes(text: str, id_prefix: str = "call") -> Parsed:
    """Hermes/Qwen `<tool_call>` JSON blocks (see the module docstring)."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return Parsed(text)
    out = Parsed(text[:start])
    for n, (closed, open_end) in enumerate(_HERMES_BLOCK.findall(text)):
        raw = closed or open_end
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            out.malformed.append(Malformed("bad_json", raw, str(exc)))
            continue
        item = _call_from(obj, raw, f"{id_prefix}_{n}")
        (out.calls if isinstance(item, ToolCall) else out.malformed).append(item)  # type: ignore[arg-type]
    return out


def from_server(message: dict[str, Any], id_prefix: str = "call") -> Parsed:
    """The server's parsed calls of a chat completion message (see the module docstring)."""
    content = message.get("content") or ""
    out = Parsed(content)
    for n, item in enumerate(message.get("tool_calls") or []):
        function = (item or {}).get("function") or {}
        raw = json.dumps(function, ensure_ascii=False)
        call_id = item.get("id") or f"{id_prefix}_{n}"  # llama.cpp and strict servers give ids
        parsed = _call_from({"name": function.get("name"),
                             "arguments": function.get("arguments", "{}")}, raw, call_id)
        (out.calls if isinstance(parsed, ToolCall) else out.malformed).append(parsed)  # type: ignore[arg-type]
    if not out.calls and not out.malformed and TOOL_CALL_START in content:
        # vLLM's hermes parser gave up on the reply: the blocks stay in the content
        start = content.find(TOOL_CALL_START)
        out.content = content[:start]
        out.malformed.append(Malformed("unparsed", content[start:], "the server's tool "
                                       "parser did not read it (or none is configured)"))
    return out


def check(parsed: Parsed, schemas: list[dict[str, Any]]) -> Parsed:
    """Move calls to unknown functions, or missing a required parameter, to `malformed`."""
    declared = {s["function"]["name"]: s["function"] for s in schemas}
    kept: list[ToolCall] = []
    for call in parsed.calls:
        raw = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        function = declared.get(call.name)
        if function is None:
            parsed.malformed.append(Malformed("unknown_tool", raw, f"no tool {call.name!r}"))
            continue
        required = (function.get("parameters") or {}).get("required") or []
        missing = [name for name in required if name not in call.arguments]
        if missing:
            parsed.malformed.append(Malformed("bad_arguments", raw, f"missing {missing}"))
            continue
        kept.append(call)
    parsed.calls = kept
    return parsed


TextParser = Callable[[str, str], Parsed]
TEXT_PARSERS: dict[str, TextParser] = {"hermes": parse_hermes}


def register(name: str, parser: TextParser) -> None:
    """Add a text parser `parser(text, id_prefix) -> Parsed`, named by `tools.parser: NAME`
    in a tag (configs accept NAME from then on)."""
    TEXT_PARSERS[name] = parser
    if name not in tool_schemas.TEXT_PARSERS:
        tool_schemas.TEXT_PARSERS.append(name)
