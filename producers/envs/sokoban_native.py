"""`sokoban_native_env`: ROLL's Sokoban that builds its own chat, for its native agent mode.

ROLL's `SokobanNativeEnv` (roll/pipeline/agentic/env/sokoban/native_env.py at 8eb27cc2,
played by its `AgentNativeStepEnvManager`) is its Sokoban env whose observation is the whole
conversation: the tag's `agent_system_template` and `agent_template` go unused (ROLL's
example config sets them to placeholders). Here the env stays a gymnasium env whose
observation is the grid text (what a trainer reads back), and it hands the LLM policy the
messages ROLL's env would send (`system_prompt`, `user_prompt`; see `producers.llm.chat`):

- system: the env's `system_template` (ROLL's default below), a blank line, and the Sokoban
  instruction (rules, symbols, actions);
- first user message: "Here is the current state:", the grid, a blank line and the
  `observation_suffix` (ROLL's default: a system reminder of the answer format and the
  actions, then "Decide the next action:");
- each later user message: "Current state:", the grid, a blank line and the suffix.

ROLL's env means to add a tip after an invalid action, but reads the flag where its Sokoban
env never puts it, so the tip never shows: here it never shows either. Rooms, rewards and
flags are the Sokoban env's; the defaults are ROLL's native env's: 6x6, 1 box, 10 steps,
search depth 300, format penalty -0.1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producers.envs.sokoban import SokobanEnv

# ROLL's native env defaults, word for word (native_env.py at 8eb27cc2).
DEFAULT_SYSTEM_TEMPLATE = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high "
    "reward in the game.")
SUFFIX_FORMAT = (
    "\n\n<system-reminder>\nIMPORTANT: Ensure that your response is the format of "
    "'<answer> [your answer] </answer>',  with no extra text, eg. <answer>Right</answer>."
    "\nYour available actions are:\n{actions}\n. </system-reminder>\n\n"
    "Decide the next action:\n"
)


class SokobanNativeEnv(SokobanEnv):
    """Sokoban with ROLL's native chat (see the module docstring).

    Takes the Sokoban settings, `system_template` and `observation_suffix` (ROLL's keys), and
    accepts ROLL's bookkeeping keys `group_id`, `num_env_groups`, `mode` and `debug`, which
    change nothing here (nor in ROLL's env).
    """

    def __init__(
        self,
        dim_room: Sequence[int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 10,
        search_depth: int = 300,
        format_penalty: float = -0.1,
        system_template: str | None = None,
        observation_suffix: str | None = None,
        group_id: int = 0,
        num_env_groups: int = 1,
        mode: str = "train",
        debug: bool = False,
        **sokoban: Any,
    ) -> None:
        super().__init__(dim_room=dim_room, num_boxes=num_boxes, max_steps=max_steps,
                         search_depth=search_depth, format_penalty=format_penalty, **sokoban)
        for name, text in (("system_template", system_template),
                           ("observation_suffix", observation_suffix)):
            if text is not None and not isinstance(text, str):
                raise ValueError(f"{name} must be a text")
        self.system_template = (DEFAULT_SYSTEM_TEMPLATE if system_template is None
                                else system_template)
        self.observation_suffix = (
            SUFFIX_FORMAT.format(actions=", ".join(self.action_names))
            if observation_suffix is None else observation_suffix)

    def system_prompt(self) -> str:
        """The system message of an episode."""
        return f"{self.system_template}\n\n{self.instruction}"

    def user_prompt(self, observation: str, turn: int) -> str:
        """The user message of turn `turn` (0 first) showing `observation`."""
        lead = "Here is the current state:" if turn == 0 else "Current state:"
        return f"{lead}\n{observation}\n\n{self.observation_suffix}"
