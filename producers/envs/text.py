r"""The text interface an LLM agent sees, shared by the grid envs.

An agent answers in free text; the action is the last group of the first match of the env's
`action_pattern` in its reply (ROLL's format and key): by default `<answer>(.*?)</answer>`,
or e.g. `<think>(.*?)</think>\s*<answer>(.*?)</answer>` to require the thinking too.
`TextGridEnv` holds what both grid envs have in common: the answer parsing,
the step budget, the format penalty for an unparsable reply, the vocabulary of cell symbols
and the `Text` observation space (the observation is the rendered grid).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def compile_action_pattern(pattern: str | re.Pattern[str] | None) -> re.Pattern[str]:
    """`action_pattern` compiled (dot matches newlines); it must have a group, and its last
    group captures the action. `ValueError` naming the problem otherwise."""
    if pattern is None:
        return ANSWER_PATTERN
    if isinstance(pattern, re.Pattern):
        compiled = pattern
    else:
        try:
            compiled = re.compile(str(pattern), re.DOTALL)
        except re.error as exc:
            raise ValueError(f"action_pattern {pattern!r} is not a regular expression: "
                             f"{exc}") from None
    if compiled.groups < 1:
        raise ValueError(f"action_pattern {compiled.pattern!r} has no group: its last group "
                         "must capture the action")
    return compiled


def parse_answer(reply: object, action_names: Sequence[str],
                 pattern: re.Pattern[str] = ANSWER_PATTERN) -> int | None:
    """Index in `action_names` of the action in the last group of `pattern`'s first match in
    `reply` (by default the first `<answer>` tag).

    The name is matched after stripping whitespace, ignoring case. None when the reply does
    not match, the action is empty, or it names no action: the caller decides what that costs.
    """
    if not isinstance(reply, str):
        return None
    match = pattern.search(reply)
    if match is None:
        return None
    word = (match.group(pattern.groups) or "").strip().lower()
    for index, name in enumerate(action_names):
        if name.lower() == word:
            return index
    return None


def resolve_vocab(
    defaults: Mapping[str, str], overrides: Mapping[str, str] | None
) -> dict[str, str]:
    """The defaults with `overrides` applied, checked: one distinct character per cell kind.

    A partial `overrides` changes only the symbols it names. Unknown keys, multi-character
    symbols, the newline (it separates rows) and duplicates raise `ValueError`, since any of
    them would make the rendered grid ambiguous.
    """
    vocab = dict(defaults)
    for key, symbol in (overrides or {}).items():
        if key not in defaults:
            known = ", ".join(defaults)
            raise ValueError(f"grid_lookup has unknown key {key!r} (known: {known})")
        if not isinstance(symbol, str) or len(symbol) != 1 or symbol == "\n":
            raise ValueError(f"grid_lookup[{key!r}] must be one character other than newline")
        vocab[key] = symbol
    if len(set(vocab.values())) != len(vocab):
        raise ValueError(f"grid_lookup symbols must be distinct, got {vocab}")
    return vocab


def describe_vocab(vocab: Mapping[str, str]) -> str:
    """One line listing each symbol and what it means, for an instruction."""
    return ", ".join(f"{symbol} = {key.replace('_', ' ')}" for key, symbol in vocab.items())


class TextGridEnv(gym.Env[str, np.int64]):
    """Base of the grid envs: the observation is the grid as text, one symbol per cell.

    Subclasses set `action_names`, build their state in `reset`, and implement `_move` (apply
    a valid action), `_is_over`, `_text` (render the current grid), `_info` and `instruction`.
    Here:
    `step` with the step budget and the no-op for an invalid action, `parse_action`,
    `step_text` and `render`.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    action_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        *,
        rows: int,
        cols: int,
        symbols: str,
        max_steps: int,
        format_penalty: float,
        render_mode: str | None,
        action_pattern: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.render_mode = render_mode
        self.max_steps = int(max_steps)
        self.format_penalty = float(format_penalty)
        self.action_pattern = compile_action_pattern(action_pattern)
        self.action_space = spaces.Discrete(len(self.action_names))
        length = rows * (cols + 1) - 1  # rows joined by "\n"
        self.observation_space = spaces.Text(
            max_length=length, min_length=length, charset=symbols + "\n"
        )
        self._num_steps = 0

    @property
    def instruction(self) -> str:
        """The rules, the symbols, the actions and the answer format, for a system prompt."""
        raise NotImplementedError

    def parse_action(self, reply: str) -> int | None:
        """The action the reply names through `action_pattern`, or None when unparsable."""
        return parse_answer(reply, self.action_names, self.action_pattern)

    def step_text(self, reply: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """`step` with the action parsed from an agent's reply; unparsable is a no-op step."""
        return self.step(self.parse_action(reply))

    def step(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Apply `action`; None or an action outside the space is a no-op step.

        The no-op still counts toward `max_steps` and earns `format_penalty`, so an agent that
        cannot keep to the answer format runs out of steps instead of stalling the episode.
        """
        self._num_steps += 1
        index = self._action_index(action)
        if index is None:
            reward, terminated, effective = self.format_penalty, self._is_over(), False
        else:
            reward, terminated, effective = self._move(index)
        truncated = self._num_steps >= self.max_steps
        info = self._info(valid=index is not None, effective=effective)
        return self._text(), reward, terminated, truncated, info

    def render(self) -> str | None:
        """The grid as text in "ansi" mode (the same string as the observation), else None."""
        return self._text() if self.render_mode == "ansi" else None

    def _action_index(self, action: Any) -> int | None:
        """The action as an int in range (Python, numpy and 0-d array ints), else None."""
        try:
            index = operator.index(action)
        except TypeError:
            return None
        return index if 0 <= index < len(self.action_names) else None

    def _move(self, action: int) -> tuple[float, bool, bool]:
        """Apply a valid action: (reward, terminated, whether the state changed)."""
        raise NotImplementedError

    def _is_over(self) -> bool:
        """Whether the episode has reached a terminal state (kept by a no-op step)."""
        raise NotImplementedError

    def _text(self) -> str:
        raise NotImplementedError

    def _info(self, *, valid: bool, effective: bool) -> dict[str, Any]:
        raise NotImplementedError
