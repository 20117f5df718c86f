"""The base of the envs whose actions are a model's whole reply: ROLL's `gem` env types.

ROLL hands these envs the model's reply as the action and lets the env read the answer out of
it (`TrajEnvManager.step`, ROLL 8eb27cc2). So here the action space is free text, `step` takes
the reply, `step_text` is `step`, and `parse_action` only tells what answer the env would read
(for the trajectory record). The first observation carries the task itself (a game's rules, a
question): ROLL gives these envs no separate instruction, so `instruction` is empty.

The step budget is ROLL's env manager's: after `max_steps` steps the episode ends with
`terminated` true, and `truncated` true unless the env itself terminated on that step.
A single-turn task (a question: reasoning-gym, math, QA) ends terminated, not truncated: GEM
sets both, but the task ended by its own rule, not a time limit; gymnasium's `check_env`
refuses an env that truncates after one step, and ROLL's `TrajEnvManager` never reads the flag.
"""

from __future__ import annotations

import string
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from schemas.errors import ConfigError

# The longest text the spaces claim: replies and questions are far shorter, and nothing
# samples an observation; an action sample (a random policy, `check_env`) is at most this.
MAX_OBSERVATION_CHARS = 1 << 20
MAX_ACTION_CHARS = 1 << 10
SEED_LIMIT = 1 << 32  # numpy's legacy `np.random.seed` takes seeds below this
# GEM's observation once a single-turn task is over (gem-llm 0.0.4 `gem/utils/constants.py`)
TERMINAL_STATE = "<\uff5cTERMINAL_STATE\uff5c>"


class FreeText(spaces.Text):
    """Any string up to `max_length` characters; samples are printable ASCII."""

    def __init__(self, max_length: int, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(max_length=max_length, min_length=0,
                         charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText({self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FreeText) and other.max_length == self.max_length

    __hash__ = None  # type: ignore[assignment]


def task_seed(seed: int) -> int:
    """A reset seed that numpy's legacy seeding and Python's `random` both take: the seed
    itself below 2**32 (so a seed gives the task GEM gives it), else one derived from it."""
    if 0 <= seed < SEED_LIMIT:
        return seed
    return int(np.random.SeedSequence(seed & ((1 << 128) - 1)).generate_state(1)[0])


def budget_flags(terminated: bool, truncated: bool, num_steps: int,
                 max_steps: int | None) -> tuple[bool, bool]:
    """ROLL's end of episode: at the step budget it is terminated, and truncated too unless
    the env itself terminated (`traj_env_manager.py`)."""
    if max_steps is not None and num_steps >= max_steps:
        return True, truncated or not terminated
    return terminated, truncated


def check_max_steps(max_steps: object) -> int | None:
    """`max_steps` as an int >= 1, or None (no budget but the task's own)."""
    if max_steps is None:
        return None
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) \
            or int(max_steps) < 1:
        raise ConfigError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    return int(max_steps)


class TextTaskEnv(gym.Env[str, str]):
    """A text task: the observation and the action are text. Subclasses implement `_start`
    (a new task from the reset's generator: the first observation and info), `_act` (the
    env's own step on a reply) and `_answer` (the answer it reads from a reply)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    instruction = ""  # ROLL's gem envs give none: the first observation carries the task

    def __init__(self, *, max_steps: int | None = None, render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.max_steps = check_max_steps(max_steps)
        self.observation_space = FreeText(MAX_OBSERVATION_CHARS)
        self.action_space = FreeText(MAX_ACTION_CHARS)
        self._observation = ""
        self._num_steps = 0

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """A new task: from `seed` when given, else from the env's own generator."""
        super().reset(seed=seed)
        chosen = task_seed(seed) if seed is not None else int(self.np_random.integers(SEED_LIMIT))
        self._num_steps = 0
        self._observation, info = self._start(chosen)
        return self._observation, info

    def step(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """The env's step on a reply; anything but a text counts as an empty reply."""
        reply = action if isinstance(action, str) else ""
        self._num_steps += 1
        observation, reward, terminated, truncated, info = self._act(reply)
        terminated, truncated = budget_flags(bool(terminated), bool(truncated),
                                             self._num_steps, self.max_steps)
        self._observation = observation
        return observation, reward, terminated, truncated, info

    def step_text(self, reply: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """`step`: the env reads the answer out of the reply itself, as in ROLL."""
        return self.step(reply)

    def parse_action(self, reply: str) -> str | None:
        """The answer the env would read from `reply`, or None when it finds none."""
        return self._answer(reply)

    def render(self) -> str | None:
        """The current observation in "ansi" mode, else None."""
        return self._observation if self.render_mode == "ansi" else None

    def _start(self, seed: int) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def _act(self, reply: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError

    def _answer(self, reply: str) -> str | None:
        raise NotImplementedError
