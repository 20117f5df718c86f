"""Which of ROLL's env types, env managers and tools a config may use: the one list.

Each entry is `supported` (producers run it; its `what` says what it needs beyond rollstream,
checked in one line when the env is built), `pending` (the config is accepted; the producer
side still has to build it: the `what` says what) or `refused` (the config is refused with one
line naming what it would need). A used tag's env type, env manager and
tools are checked here; unused `custom_envs` entries are never looked at (ROLL builds only the
tags its env managers use).

Facts from alibaba/ROLL 8eb27cc2: the env types are what roll/pipeline/agentic/env/__init__.py
registers with `gem.register` plus GEM's own ids (`game:`, `math:`, `code:`, `qa:`, `logic:`,
and `rg:` for reasoning-gym tasks); the env managers are the classes under
roll/pipeline/agentic/env_manager/; the tools are GEM's tool ids that ROLL's `tool_wrapper`
configs use (examples/config/traj_envs_gem_*.yaml).

An env type also resolved by `schemas.envspec.ENV_TYPE_IDS` (the env factory's own names) is
supported whatever this table says: when the factory learns a name, it moves here by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.envspec import ENV_TYPE_IDS

Status = Literal["supported", "pending", "refused"]


@dataclass(frozen=True)
class Support:
    """What rollstream does with one env type, env manager or tool."""

    status: Status
    kind: str  # what it is, for messages: "GEM game", "ROLL's Sokoban"
    what: str = ""  # supported: what it needs beyond rollstream (checked when built);
    # pending: the producer work left; refused: what it would need

    @property
    def accepted(self) -> bool:
        return self.status != "refused"


# ROLL's `gem` env types (made with `gem.make(env_type, ...)` in ROLL): GEM's registered ids,
# by family prefix, and ROLL's own names. The env factory builds each by its env type; what
# one needs beyond rollstream (a package, a dataset on disk, a word corpus) is checked when
# it is built (`rollstream config check` builds one env of every tag), in one line.
GEM_PREFIXES = ("game:", "rg:", "math:", "qa:", "logic:", "eval:", "code:")
ROLL_GEM_TYPES = ("roll_math", "roll_qa", "roll_code")


def is_gem_type(env_type: str) -> bool:
    """Whether `env_type` is one of ROLL's `gem` env types (`game:GuessTheNumber-v0`,
    `rg:letter_counting`, `roll_math`, ...)."""
    return env_type in ROLL_GEM_TYPES or (env_type.startswith(GEM_PREFIXES)
                                          and not env_type.endswith(":"))


def _gem(kind: str, what: str) -> Support:
    return Support("supported", kind, what)


_NO_DATA = "its dataset on disk (env_config.dataset_name)"

# env_type -> support (ROLL's names; `frozenlake` is rollstream's spelling of frozen_lake)
ENV_TYPES: dict[str, Support] = {
    "sokoban": Support("supported", "ROLL's Sokoban"),
    "frozen_lake": Support("supported", "ROLL's FrozenLake"),
    "frozenlake": Support("supported", "ROLL's FrozenLake"),
    "sokoban_native_env": Support("supported", "ROLL's native-format Sokoban"),
    "roll_math": _gem("GEM math", "math-verify (the reasoning extra) and " + _NO_DATA),
    "roll_qa": _gem("GEM QA", _NO_DATA),
    "roll_code": _gem("GEM code", _NO_DATA),
    "openenv": Support("supported", "OpenEnv env server",
                       "OpenEnv env servers answering on env_config.base_urls"),
    "webshop": Support("refused", "WebShop",
                       "the WebShop server and its product data (webshop-minimal)"),
    "deepeyes": Support("refused", "DeepEyes",
                        "a vision-language model, image observations and DeepEyes' data"),
    "rock_tb_native_env": Support("refused", "ROCK terminal-bench/SWE sandbox",
                                  "ROCK sandboxes (the rock SDK and its sandbox service)"),
    "sokoban_sandbox": Support("refused", "Sokoban in a ROCK sandbox",
                               "a ROCK sandbox service (the rock SDK, base_url)"),
    "openreward_env": Support("refused", "OpenReward",
                              "the OpenReward SDK and its hosted environments (an API key)"),
    "atropos_env": Support("refused", "Atropos", "an Atropos environment server"),
    "sokoban_mcp": Support("refused", "Sokoban over MCP", "an MCP game server"),
    "sokoban_tool_call": Support("refused", "Sokoban with tool calls",
                                 "tool calls on top of sokoban_native_env"),
}

# GEM ids by prefix (`game:GuessTheNumber-v0`, `rg:letter_counting`)
ENV_TYPE_PREFIXES: dict[str, Support] = {
    "game:": _gem("GEM game", "gem-llm 0.0.4 (the gem extra; Wordle and Hangman also need "
                  "NLTK's words corpus on disk)"),
    "rg:": _gem("reasoning-gym task", "reasoning-gym (the reasoning extra)"),
    "math:": _gem("GEM math", "math-verify (the reasoning extra) and " + _NO_DATA),
    "qa:": _gem("GEM QA", _NO_DATA),
    "logic:": _gem("GEM logic", _NO_DATA),
    "eval:": _gem("GEM eval set", _NO_DATA),
    "code:": _gem("GEM code", _NO_DATA),
}

_ROLL_MANAGERS = "roll.pipeline.agentic.env_manager."
TRAJ_ENV_MANAGER = _ROLL_MANAGERS + "traj_env_manager.TrajEnvManager"
STEP_ENV_MANAGER = _ROLL_MANAGERS + "step_env_manager.StepEnvManager"
STEP_CONCAT_ENV_MANAGER = _ROLL_MANAGERS + "step_concat_env_manager.StepConcatEnvManager"
AGENT_NATIVE_ENV_MANAGER = _ROLL_MANAGERS + "agent_native_env_manager.AgentNativeStepEnvManager"


@dataclass(frozen=True)
class Manager:
    """One of ROLL's env managers: how a turn's prompt is built, and the placeholders its
    `agent_template` may use (None: the templates are not used, the env gives the messages)."""

    name: str  # the short name rollstream uses for it
    support: Support
    placeholders: tuple[str, ...] | None


ENV_MANAGERS: dict[str, Manager] = {
    TRAJ_ENV_MANAGER: Manager(
        "traj", Support("supported", "TrajEnvManager"),
        ("observation", "turn_idx", "suffix", "actions_left", "max_response_length")),
    STEP_ENV_MANAGER: Manager(
        "step", Support("supported", "StepEnvManager"),
        ("env_instruction", "history", "step_count", "history_length", "current_step",
         "current_observation", "max_response_length")),
    STEP_CONCAT_ENV_MANAGER: Manager(
        "step_concat", Support("supported", "StepConcatEnvManager"),
        ("history", "current_observation")),
    AGENT_NATIVE_ENV_MANAGER: Manager(
        "agent_native", Support("supported", "AgentNativeStepEnvManager",
                                "an env that gives its own chat messages (sokoban_native_env)"),
        None),
    _ROLL_MANAGERS + "vl_traj_env_manager.VLTrajEnvManager": Manager(
        "vl_traj", Support("refused", "VLTrajEnvManager",
                           "a vision-language model and image observations"), None),
    _ROLL_MANAGERS + "proxy_env_manager.ProxyEnvManager": Manager(
        "proxy", Support("refused", "ProxyEnvManager",
                         "an agent runner (agent_runner_cls) driving the env through ROLL's "
                         "OpenAI-compatible LLM proxy"), None),
}

# GEM tool ids in a tag's tool_wrapper.tool_configs
TOOLS: dict[str, Support] = {
    "python_code": Support("pending", "python tool", "the sandboxed python tool"),
    "search": Support("refused", "search tool",
                      "a retrieval server (tool_args.search_url: a dense index of Wikipedia, "
                      "ROLL's examples/qwen3_agentic_gem/start_retrieval_server.sh)"),
    "mcp": Support("refused", "MCP tool", "an MCP server (tool_args.server_url)"),
}


def env_type_support(env_type: str) -> Support:
    """The support of an env type; an unknown one is refused, naming the known ones."""
    key = env_type.lower()
    if key in ENV_TYPE_IDS:
        entry = ENV_TYPES.get(key)
        return Support("supported", entry.kind if entry else env_type)
    if key in ENV_TYPES:
        return ENV_TYPES[key]
    for prefix, support in ENV_TYPE_PREFIXES.items():
        if key.startswith(prefix) and len(key) > len(prefix):
            return support
    known = sorted({*ENV_TYPES, *ENV_TYPE_IDS} - {"frozenlake"})
    prefixes = ", ".join(f"{p}NAME" for p in ENV_TYPE_PREFIXES)
    return Support("refused", "unknown",
                   f"one of ROLL's env types ({', '.join(known)}, {prefixes}), or env_id: a "
                   "registered gymnasium id")


def manager_of(path: str) -> Manager:
    """The env manager of an `env_manager_cls` path; a class of one's own is refused."""
    if path in ENV_MANAGERS:
        return ENV_MANAGERS[path]
    short = {m.name: m for m in ENV_MANAGERS.values()}
    if path in short:
        return short[path]
    usable = ", ".join(p.rsplit(".", 1)[1] for p, m in ENV_MANAGERS.items()
                       if m.support.accepted)
    return Manager(path, Support("refused", "a custom env manager",
                                 f"one of ROLL's env managers rollstream renders ({usable})"),
                   None)


def tool_support(tool_id: str) -> Support:
    return TOOLS.get(tool_id, Support("refused", "unknown tool",
                                      f"one of GEM's tools ({', '.join(TOOLS)})"))


def refusal(what: str, name: str, tag: str, support: Support) -> str:
    """The one line that refuses a tag's env type, env manager or tool."""
    return f"{what} {name!r} (tag {tag}): not supported: needs {support.what}"


def pending_note(what: str, name: str, tags: list[str], support: Support) -> str:
    """The warning for an accepted entry the producers cannot run yet."""
    return (f"{what} {name!r} ({support.kind}; {'tag' if len(tags) == 1 else 'tags'} "
            f"{', '.join(tags)}): accepted by the config, not run by producers yet: needs "
            f"{support.what}")
