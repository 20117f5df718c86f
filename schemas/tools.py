"""A tag's tools (`custom_envs.TAG.tools`): which functions an LLM agent may call, how its
calls are read, and the limits of the built-in `python` sandbox.

    tools:
      functions: [python]            # a built-in name, or an OpenAI function schema
      tool_choice: auto              # sent as is with chat requests (auto, none, required, ...)
      parser: hermes                 # server (the server's tool_calls) or hermes (the text);
                                     # unset: server with chat requests, hermes with
                                     # token-in/token-out (policy.tokenizer)
      max_calls_per_turn: 4          # more in one reply are answered "not run"
      max_rounds: 4                  # tool rounds before the env gets the reply
      python: {timeout_s: 5, cpu_s: 5, memory_mb: 512, output_bytes: 4096, max_parallel: 4,
               network: false}

A function schema (`{"type": "function", "function": {"name": ..., "parameters": ...}}`)
that is not built in is the env's: the env's `call_tool(name, arguments)` runs it (see
docs/tools.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, field_validator

BUILTIN_TOOLS = ("python",)
# the text parsers a config may name (producers/tools/parsers.py; its `register` adds here)
TEXT_PARSERS: list[str] = ["hermes"]
DEFAULT_TEXT_PARSER = "hermes"  # a tag's reader under token-in/token-out when none is named

PYTHON_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python 3 program and return what it prints (stdout, then "
                       "stderr). No network, no files kept between calls.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program"}},
            "required": ["code"],
        },
    },
}


class PythonLimits(BaseModel):
    """The `python` tool's sandbox (producers/tools/sandbox.py)."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: PositiveFloat = Field(default=5.0, description="wall clock; killed at it")
    cpu_s: PositiveInt = Field(default=5, description="CPU seconds (RLIMIT_CPU)")
    memory_mb: PositiveInt = Field(default=512, description="address space (RLIMIT_AS)")
    output_bytes: PositiveInt = Field(default=4096, description="stdout+stderr kept; the "
                                      "program is killed once it writes more")
    max_parallel: PositiveInt = Field(default=4, description="sandboxes of the tag a "
                                      "producer runs at once; more calls wait their turn")
    network: bool = Field(default=False, description="allow the network (else a new network "
                          "namespace, unshare -rn, where the machine allows it)")


class ToolsSpec(BaseModel):
    """See the module docstring."""

    model_config = ConfigDict(extra="forbid")

    functions: list[str | dict[str, Any]] = Field(
        default_factory=list, description="built-in tool names (python) or OpenAI function "
        "schemas; the env's own `tools` are added")
    tool_choice: str | dict[str, Any] = Field(default="auto", description="the request's "
                                              "tool_choice")
    parser: str | None = Field(default=None, description="server: the server's parsed "
                               "tool_calls (vLLM --enable-auto-tool-choice --tool-call-parser "
                               "hermes; chat requests only); hermes: the producer reads "
                               "<tool_call> JSON from the text; unset: server with chat "
                               "requests, hermes with token-in/token-out (policy.tokenizer)")
    max_calls_per_turn: PositiveInt = Field(default=4, description="calls run per reply")
    max_rounds: PositiveInt = Field(default=4, description="tool rounds per env turn")
    python: PythonLimits = Field(default_factory=PythonLimits)

    @field_validator("parser")
    @classmethod
    def _known_parser(cls, parser: str | None) -> str | None:
        known = ["server", *TEXT_PARSERS]
        if parser is not None and parser not in known:
            raise ValueError(f"tools.parser {parser!r} is unknown (known: {', '.join(known)})")
        return parser

    @field_validator("functions")
    @classmethod
    def _schemas(cls, functions: list[str | dict[str, Any]]) -> list[str | dict[str, Any]]:
        for item in functions:
            if isinstance(item, str):
                if item not in BUILTIN_TOOLS:
                    raise ValueError(f"tools.functions: {item!r} is not a built-in tool "
                                     f"(built in: {', '.join(BUILTIN_TOOLS)}); give an OpenAI "
                                     "function schema instead")
            elif not isinstance((item.get("function") or {}).get("name"), str):
                raise ValueError("tools.functions: a schema needs function.name "
                                 '({"type": "function", "function": {"name": ...}})')
        return functions

    def reader(self, token_exact: bool) -> str:
        """How the calls are read: the parser given, else `server` with chat requests and
        `hermes` with token-in/token-out (whose replies no server parsed)."""
        if self.parser is not None:
            return self.parser
        return DEFAULT_TEXT_PARSER if token_exact else "server"

    def schemas(self, env_tools: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The OpenAI `tools` list: the built-ins' schemas, the config's, then the env's."""
        out = [PYTHON_SCHEMA if isinstance(item, str) else item for item in self.functions]
        return [*out, *(env_tools or [])]
