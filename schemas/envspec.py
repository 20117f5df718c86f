"""Env specs: what a config tag means (which gymnasium env, with which settings).

`custom_envs` in a config maps a tag to an `EnvSpec`. The four tags of the design document
have defaults here (ROLL's settings), so a config that names them needs no `custom_envs`.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from schemas.tools import ToolsSpec

SOKOBAN_ID = "rollstream/Sokoban-v0"
FROZENLAKE_ID = "rollstream/FrozenLake-v0"
SOKOBAN_NATIVE_ID = "rollstream/SokobanNative-v0"
OPENENV_ID = "rollstream/OpenEnv-v0"  # an env on OpenEnv servers (producers/envs/openenv.py)

# ROLL's `env_type` names for our own envs; any other env is given by its gymnasium id.
ENV_TYPE_IDS: dict[str, str] = {
    "sokoban": SOKOBAN_ID,
    "frozen_lake": FROZENLAKE_ID,
    "frozenlake": FROZENLAKE_ID,
    "sokoban_native_env": SOKOBAN_NATIVE_ID,
    "openenv": OPENENV_ID,
}


# An LLM agent's prompt per tag (ROLL's keys), placed as ROLL's TrajEnvManager places it:
# the system message is the system template alone; the first user message is the env's
# instruction, a newline and the agent template filled with these fields; later user
# messages are the filled template. Envs that build their own chat (sokoban_native_env, as
# ROLL's native envs) leave both templates unused.
AGENT_TEMPLATE_FIELDS = ("turn_idx", "observation", "actions_left", "max_response_length")
# The templates of ROLL's examples/config/traj_envs.yaml (at 8eb27cc2), word for word: what
# the seed tags use there.
DEFAULT_AGENT_SYSTEM_TEMPLATE = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high "
    "reward in the game.")
DEFAULT_AGENT_TEMPLATE = (
    "Turn {turn_idx}:\n"
    "Observation:\n"
    "{observation}\n"
    "Strictly follow this format:\n"
    "1. output format is '<answer> [your answer] </answer>' with no extra text. \n"
    "2. You have {actions_left} actions left. \n"
    "3. Max response length: {max_response_length} words (tokens).\n"
    "Decide the next action:\n"
)


@dataclass(frozen=True)
class AgentPrompt:
    """What an LLM policy needs of a tag: its templates, its per-turn token budget, and how
    ROLL's env manager of the tag builds each turn's prompt (`manager`: traj, step,
    step_concat or agent_native; `history_length`: the step managers' window)."""

    system_template: str | None  # None: no system message
    template: str
    max_tokens_per_step: int | None = None
    manager: str = "traj"
    history_length: int | None = None


class EnvSpec(BaseModel):
    """One env tag: a registered gymnasium id and the kwargs that `gymnasium.make` gets, and
    for LLM agents the prompt templates and the per-turn token budget."""

    model_config = ConfigDict(extra="ignore")

    env_id: str = Field(default="", description="registered gymnasium id, e.g. CartPole-v1")
    env_type: str | None = Field(
        default=None, description="ROLL alias: sokoban, frozen_lake, sokoban_native_env")
    env_config: dict[str, Any] = Field(default_factory=dict, description="kwargs for make()")
    max_steps: PositiveInt | None = Field(
        default=None, description="the tag's step budget (ROLL's custom_envs.TAG.max_steps): "
        "our envs' max_steps (the smaller one when env_config has one too), any other env's "
        "gymnasium time limit")
    threaded: bool = Field(
        default=False,
        description="run reset/step in a worker thread, for envs that block (I/O, "
        "subprocesses, long compute) and would otherwise stall the producer's other envs",
    )
    agent_system_template: str = Field(
        default=DEFAULT_AGENT_SYSTEM_TEMPLATE,
        description="system message of an LLM agent (the env's instruction opens the first "
        "user message)")
    agent_template: str = Field(
        default=DEFAULT_AGENT_TEMPLATE,
        description="each turn's user message; placeholders: " + ", ".join(
            "{" + name + "}" for name in AGENT_TEMPLATE_FIELDS))
    max_tokens_per_step: PositiveInt | None = Field(
        default=None, description="tokens per reply for this tag (default: the policy's "
        "max_tokens)")
    tools: ToolsSpec | None = Field(
        default=None, description="the tools an LLM agent may call (docs/tools.md)")

    @field_validator("agent_template")
    @classmethod
    def _known_placeholders(cls, template: str) -> str:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(template) if name}
        except ValueError as exc:
            raise ValueError(f"agent_template is not a format string: {exc}") from None
        unknown = sorted(names - set(AGENT_TEMPLATE_FIELDS))
        if unknown:
            raise ValueError(f"agent_template has unknown placeholders {unknown} (known: "
                             f"{', '.join(AGENT_TEMPLATE_FIELDS)}; write {{{{ and }}}} for "
                             "literal braces)")
        return template

    @property
    def agent_prompt(self) -> AgentPrompt:
        return AgentPrompt(self.agent_system_template, self.agent_template,
                           self.max_tokens_per_step)

    @model_validator(mode="after")
    def _resolve_id(self) -> EnvSpec:
        if not self.env_id:
            if self.env_type is None:
                raise ValueError("needs env_id (a gymnasium id) or env_type (sokoban, "
                                 "frozen_lake, sokoban_native_env)")
            key = self.env_type.lower()
            if key not in ENV_TYPE_IDS:
                known = ", ".join(sorted(ENV_TYPE_IDS))
                raise ValueError(f"env_type {self.env_type!r} is unknown (known: {known})")
            self.env_id = ENV_TYPE_IDS[key]
        return self


# The seed's tags, as ROLL's examples/config/traj_envs.yaml (at 8eb27cc2) defines them: 10
# actions, answers in <answer> tags, format penalties -0.15 (Sokoban) and -0.01 (FrozenLake);
# every other setting is the env's default, which is ROLL's
# (SimpleSokoban's search_depth 300, FrozenLake's 4x4 map with p=0.8). The vocab variant's
# grid_lookup is keyed by cell kind, in the order of ROLL's integer codes 0-6 that its YAML
# uses (both work; kinds survive the published config's JSON unchanged).
# ROLL's tags also set max_tokens_per_step 128, which ROLL applies as a cap (the smaller of it
# and generating_args.max_new_tokens); a tag's max_tokens_per_step here replaces the policy's
# max_tokens, so the seed tags leave it to the policy.
ANSWER_PATTERN = "<answer>(.*?)</answer>"
SEED_MAX_STEPS = 10


def _seed_tag(env_id: str, env_config: dict[str, Any]) -> dict[str, Any]:
    return {"env_id": env_id, "max_steps": SEED_MAX_STEPS,
            "env_config": {"action_pattern": ANSWER_PATTERN, "max_steps": SEED_MAX_STEPS,
                           **env_config}}


DEFAULT_CUSTOM_ENVS: dict[str, dict[str, Any]] = {
    "SimpleSokoban": _seed_tag(SOKOBAN_ID, {
        "format_penalty": -0.15, "dim_room": [6, 6], "num_boxes": 1}),
    "LargerSokoban": _seed_tag(SOKOBAN_ID, {
        "format_penalty": -0.15, "dim_room": [10, 10], "num_boxes": 2, "search_depth": 10}),
    "SokobanDifferentGridVocab": _seed_tag(SOKOBAN_ID, {
        "format_penalty": -0.15, "search_depth": 30, "dim_room": [6, 6], "num_boxes": 1,
        "grid_lookup": {"wall": "W", "empty": ".", "target": "G", "box_on_target": "C",
                        "box": "B", "player": "A", "player_on_target": "@"},
        "grid_vocab": {"W": "wall", ".": "empty", "G": "target", "C": "box on target",
                       "B": "box", "A": "player", "@": "player on target"}}),
    "FrozenLake": _seed_tag(FROZENLAKE_ID, {"format_penalty": -0.01, "is_slippery": False}),
}
