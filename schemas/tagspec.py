"""A `custom_envs` entry as ROLL's env managers read it: an `EnvSpec` and the env manager's keys.

`TagSpec` is `schemas.envspec.EnvSpec` (the env: its type or gymnasium id, `env_config`,
`max_steps`, the templates) plus what ROLL keeps beside the env in the same entry:
- `env_manager_cls`: how each turn's prompt is built (ROLL's TrajEnvManager, StepEnvManager,
  StepConcatEnvManager, AgentNativeStepEnvManager; `schemas.envtypes.ENV_MANAGERS`);
- `history_length`: the step managers' history window;
- `agent_system_template: null`: no system message (what ROLL's step managers do with it);
- `max_env_step_concurrent`, `tool_wrapper`: ROLL's cap on concurrent env steps of the tag,
  and its tools.
Its `agent_template` is checked against the placeholders its env manager fills (ROLL formats
the template with `str.format`, so any other placeholder is a KeyError at the first turn).

How ROLL renders each manager's prompt (roll/pipeline/agentic/env_manager/, 8eb27cc2) is told
in docs/configs.md ("Env managers and prompts"); producers/llm/prompts.py renders them.
"""

from __future__ import annotations

import string
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from schemas.envspec import DEFAULT_AGENT_SYSTEM_TEMPLATE, ENV_TYPE_IDS, AgentPrompt, EnvSpec
from schemas.envtypes import (
    TRAJ_ENV_MANAGER,
    Manager,
    Support,
    env_type_support,
    manager_of,
    tool_support,
)

UNSUPPORTED = "roll_unsupported"  # the pydantic error type of a refused env type/manager/tool


def unsupported(what: str, name: str, support: Support) -> PydanticCustomError:
    """A refusal the config's error formatting turns into one line naming the tag."""
    return PydanticCustomError(UNSUPPORTED, "{what} {name!r}: not supported: needs {needs}",
                               {"what": what, "name": name, "needs": support.what})


class ToolConfig(BaseModel):
    """One tool of a tag (ROLL's `tool_wrapper.tool_configs` item: a GEM tool id)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_id: str = Field(min_length=1)
    tool_args: dict[str, Any] = Field(default_factory=dict)


class ToolWrapper(BaseModel):
    """ROLL's `tool_wrapper`: the tools a tag's env is wrapped with, and the wrapper's
    settings (`tool_reward`, `tool_success_reward`, `max_tool_uses`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    wrapper_args: dict[str, Any] = Field(default_factory=dict)
    tool_configs: list[ToolConfig] = Field(min_length=1)


class TagSpec(EnvSpec):
    """One tag: its env (`EnvSpec`) and ROLL's env-manager settings for it."""

    env_manager_cls: str = Field(
        default=TRAJ_ENV_MANAGER, description="ROLL's env manager class path: how each "
        "turn's prompt is built")
    agent_system_template: str | None = Field(  # type: ignore[assignment]
        default=DEFAULT_AGENT_SYSTEM_TEMPLATE,
        description="the system message; null: none (ROLL's step managers send none)")
    history_length: PositiveInt | None = Field(
        default=None, description="step managers: the prompt shows the last history_length - 1 "
        "steps (ROLL's slice history[-history_length:-1]); none: no history")
    max_env_step_concurrent: NonNegativeInt = Field(
        default=0, description="at most this many of the tag's env steps at once per "
        "producer; 0: no cap")
    tool_wrapper: ToolWrapper | None = None

    # EnvSpec checks agent_template against the trajectory format's placeholders; here the
    # env manager decides which placeholders there are (`_check_manager`)
    @field_validator("agent_template")
    @classmethod
    def _known_placeholders(cls, template: str) -> str:
        return template

    # EnvSpec knows the env factory's own env types; ROLL's others are checked here
    @model_validator(mode="after")
    def _resolve_id(self) -> TagSpec:
        if self.env_id:
            return self
        if self.env_type is None:
            raise ValueError("needs env_id (a gymnasium id) or env_type (sokoban, frozen_lake, "
                             "or another of ROLL's env types)")
        support = env_type_support(self.env_type)
        if not support.accepted:
            raise unsupported("env type", self.env_type, support)
        # ROLL's other env types keep env_id empty: the env factory builds them by env_type
        self.env_id = ENV_TYPE_IDS.get(self.env_type.lower(), "")
        return self

    @model_validator(mode="after")
    def _check_manager(self) -> TagSpec:
        manager = self.manager
        if not manager.support.accepted:
            raise unsupported("env manager", _short(self.env_manager_cls), manager.support)
        for tool in self.tool_wrapper.tool_configs if self.tool_wrapper else ():
            support = tool_support(tool.tool_id)
            if not support.accepted:
                raise unsupported("tool", tool.tool_id, support)
        if manager.placeholders is not None:
            _check_placeholders(self.agent_template, manager)
        return self

    @property
    def agent_prompt(self) -> AgentPrompt:
        return AgentPrompt(self.agent_system_template, self.agent_template,
                           self.max_tokens_per_step, self.manager.name, self.history_length)

    @property
    def manager(self) -> Manager:
        """The tag's env manager (`name`: traj, step, step_concat, agent_native)."""
        return manager_of(self.env_manager_cls)

    def pending(self) -> list[tuple[str, str, Support]]:
        """What of this tag the config accepts but producers do not run yet: (what, name,
        support) for its env type, env manager and tools."""
        out = []
        if self.env_type is not None and not self.env_id:
            support = env_type_support(self.env_type)
            if support.status == "pending":
                out.append(("env type", self.env_type, support))
        manager = self.manager
        if manager.support.status == "pending":
            out.append(("env manager", _short(self.env_manager_cls), manager.support))
        for tool in self.tool_wrapper.tool_configs if self.tool_wrapper else ():
            support = tool_support(tool.tool_id)
            if support.status == "pending":
                out.append(("tool", tool.tool_id, support))
        return out


def _short(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _check_placeholders(template: str, manager: Manager) -> None:
    assert manager.placeholders is not None
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template)
                 if name is not None]
    except ValueError as exc:
        raise ValueError(f"agent_template is not a format string: {exc}") from None
    # `{observation.x}` and `{history[0]}` name the field before the dot or bracket; `{}`
    # and `{0}` are positional, which ROLL's format(**fields) never fills
    fields = {name.split(".", 1)[0].split("[", 1)[0] or "{}" for name in names}
    unknown = sorted(fields - set(manager.placeholders))
    if unknown:
        raise ValueError(
            f"agent_template has unknown placeholders {unknown} ({manager.support.kind} fills "
            f"{', '.join(manager.placeholders)}; write {{{{ and }}}} for literal braces)")
