r"""The text interface an LLM agent sees, shared by the grid envs.

An agent answers in free text; the action comes from the first match of the env's
`action_pattern` in its reply, as ROLL's `parse_action_utils.py` reads it (alibaba/ROLL at
8eb27cc2): ROLL's special tokens (`<|im_start|>`, `<|im_end|>`) are removed first, then
the pattern's only group, or its second group when it has more (e.g.
`<think>(.*?)</think>\s*<answer>(.*?)</answer>` to require the thinking), is the action
name, matched ignoring case and surrounding whitespace.
`TextGridEnv` holds what both grid envs have in common: the answer parsing, the step budget,
the no-op for an unparsable reply, the vocabulary of cell symbols, the instruction in ROLL's
layout and the `Text` observation space (the observation is the rendered grid).

ROLL's env_config keys work as ROLL writes them: `grid_lookup` by cell kind or by ROLL's
integer code, `grid_vocab` (symbol -> the meaning the agent is told), `action_lookup` (ROLL's
action id -> the name the agent writes), `env_instruction` (the rules, replacing ROLL's) and
`special_token_list`.
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
# Removed from a reply before it is parsed (ROLL's default `special_token_list`).
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")


def compile_action_pattern(pattern: str | re.Pattern[str] | None) -> re.Pattern[str]:
    """`action_pattern` compiled (dot matches newlines); it must have a group (its only group,
    or its second one, captures the action). `ValueError` naming the problem otherwise."""
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
        raise ValueError(f"action_pattern {compiled.pattern!r} has no group: a group must "
                         "capture the action (the second one when there are more)")
    return compiled


def parse_answer(reply: object, action_names: Sequence[str],
                 pattern: re.Pattern[str] = ANSWER_PATTERN,
                 special_tokens: Sequence[str] = SPECIAL_TOKENS) -> int | None:
    """Index in `action_names` of the action `reply` names, read as ROLL reads it: the
    `special_tokens` removed, then `pattern`'s first match; its only group, or its second
    group when it has more, is the action (by default the first `<answer>` tag's text).

    The name is matched after stripping whitespace, ignoring case. None when the reply does
    not match, the action is empty, or it names no action: the caller decides what that costs.
    """
    word = captured_answer(reply, pattern, special_tokens)
    if word is None:
        return None
    word = word.lower()
    for index, name in enumerate(action_names):
        if name.lower() == word:
            return index
    return None


def captured_answer(reply: object, pattern: re.Pattern[str] = ANSWER_PATTERN,
                    special_tokens: Sequence[str] = SPECIAL_TOKENS) -> str | None:
    """What `pattern` captures of `reply` as ROLL reads it (the `special_tokens` removed, the
    first match, its only group or its second), stripped; None when it does not match."""
    if not isinstance(reply, str):
        return None
    for token in special_tokens:
        reply = reply.replace(token, "").strip()
    match = pattern.search(reply)
    if match is None:
        return None
    return (match.group(1 if pattern.groups == 1 else 2) or "").strip()


def roll_index(key: object) -> int | None:
    """A lookup key as ROLL writes it, an integer code, as an int; None for any other key.

    Digit strings count too: a config that went through JSON (the published config) has its
    integer keys turned into strings."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    return None


def resolve_vocab(
    defaults: Mapping[str, str], overrides: Mapping[Any, str] | None
) -> dict[str, str]:
    """The defaults with `overrides` applied, checked: one distinct character per cell kind.

    A key is a cell kind (`wall`) or ROLL's integer code for it, the kind's position in
    `defaults` (Sokoban: 0 wall ... 6 player on target). A partial `overrides` changes only the
    symbols it names. Unknown keys, a kind named twice, multi-character symbols, the newline
    (it separates rows) and duplicates raise `ValueError`, since any of them would make the
    rendered grid ambiguous.
    """
    kinds = list(defaults)
    vocab = dict(defaults)
    named: dict[str, object] = {}
    for key, symbol in (overrides or {}).items():
        index = roll_index(key)
        if index is not None and 0 <= index < len(kinds):
            kind = kinds[index]
        elif index is None and key in defaults:
            kind = str(key)
        else:
            known = f"0-{len(kinds) - 1} or " + ", ".join(kinds)
            raise ValueError(f"grid_lookup has unknown key {key!r} (known: {known})")
        if kind in named:
            raise ValueError(f"grid_lookup names {kind} twice ({named[kind]!r} and {key!r})")
        named[kind] = key
        if not isinstance(symbol, str) or len(symbol) != 1 or symbol == "\n":
            raise ValueError(f"grid_lookup[{key!r}] must be one character other than newline")
        vocab[kind] = symbol
    if len(set(vocab.values())) != len(vocab):
        raise ValueError(f"grid_lookup symbols must be distinct, got {vocab}")
    return vocab


def resolve_meanings(
    vocab: Mapping[str, str], grid_vocab: Mapping[Any, Any] | None
) -> dict[str, str]:
    """Symbol -> the text the agent is told it means, in the order it is told.

    `grid_vocab` (ROLL's key: symbol -> meaning) is the whole list when given, as in ROLL,
    whose instruction lists exactly its entries; else every symbol of the grid with its cell
    kind in words (for ROLL's default symbols that is ROLL's default list). A `grid_vocab`
    symbol the grid does not use raises `ValueError` (the agent would be told about a symbol
    it never sees)."""
    if not grid_vocab:
        return {symbol: kind.replace("_", " ") for kind, symbol in vocab.items()}
    used = set(vocab.values())
    meanings = {}
    for symbol, text in grid_vocab.items():
        if symbol not in used:
            raise ValueError(f"grid_vocab has symbol {symbol!r}, which the grid does not use "
                             f"(its symbols: {' '.join(vocab.values())})")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"grid_vocab[{symbol!r}] must be a non-empty text")
        meanings[symbol] = text.strip()
    return meanings


def resolve_actions(
    names: Sequence[str], roll_ids: Sequence[int], lookup: Mapping[Any, Any] | None
) -> tuple[str, ...]:
    """The action names with ROLL's `action_lookup` (action id -> the name the agent writes)
    applied: `roll_ids[i]` is ROLL's id of action `i`. A partial lookup renames only the
    actions it names; unknown ids, empty names and names equal but for case raise
    `ValueError` (replies are matched ignoring case)."""
    out = list(names)
    for key, name in (lookup or {}).items():
        index = roll_index(key)
        if index not in roll_ids:
            known = ", ".join(f"{i} {n}" for i, n in zip(roll_ids, names, strict=True))
            raise ValueError(f"action_lookup has unknown action id {key!r} (ids: {known})")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"action_lookup[{key!r}] must be a non-empty name")
        out[roll_ids.index(index)] = name.strip()
    if len({name.lower() for name in out}) != len(out):
        raise ValueError(f"action_lookup names must be distinct ignoring case, got {out}")
    return tuple(out)


def roll_instruction(rules: str, meanings: Mapping[str, str], actions: Sequence[str]) -> str:
    """An env's instruction in the layout of ROLL's `get_instructions` (sokoban/env.py and
    frozen_lake/env.py at 8eb27cc2): the rules, then the symbols and the actions, each under
    its heading line."""
    symbols = ", ".join(f"{symbol}: {meaning}" for symbol, meaning in meanings.items())
    return (f"{rules}\nThe meaning of each symbol in the state is:\n{symbols}"
            f"\nYour available actions are:\n{', '.join(actions)}")


class TextGridEnv(gym.Env[str, np.int64]):
    """Base of the grid envs: the observation is the grid as text, one symbol per cell.

    Subclasses set `action_names` (and ROLL's ids for them, `roll_action_ids`),
    `default_vocab`, `default_rules` (ROLL's instruction text), build their state in
    `reset`, and implement `_move` (apply a valid action), `_no_op` (the reward of an
    unparsable reply), `_is_over`, `_success`, `_text` (render the current grid) and
    `_info`. Here: the vocabulary and action names with ROLL's lookups, the instruction,
    `step` with the step budget and ROLL's flags at its end, `parse_action`, `step_text` and
    `render`.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    action_names: tuple[str, ...] = ()
    roll_action_ids: ClassVar[tuple[int, ...]] = ()  # ROLL's action id of each action
    default_vocab: ClassVar[Mapping[str, str]] = {}  # cell kind -> symbol, in ROLL's code order
    default_rules: ClassVar[str] = ""  # ROLL's `env_instruction`, word for word

    def __init__(
        self,
        *,
        rows: int,
        cols: int,
        max_steps: int,
        format_penalty: float,
        render_mode: str | None,
        action_pattern: str | None = None,
        grid_lookup: Mapping[Any, str] | None = None,
        grid_vocab: Mapping[Any, Any] | None = None,
        action_lookup: Mapping[Any, Any] | None = None,
        env_instruction: str | None = None,
        special_token_list: Sequence[str] | None = SPECIAL_TOKENS,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if env_instruction is not None and not isinstance(env_instruction, str):
            raise ValueError("env_instruction must be a text")
        tokens = tuple(special_token_list or ())
        if not all(isinstance(token, str) and token for token in tokens):
            raise ValueError("special_token_list must be a list of non-empty texts")
        self.render_mode = render_mode
        self.max_steps = int(max_steps)
        self.format_penalty = float(format_penalty)
        self.action_pattern = compile_action_pattern(action_pattern)
        self.special_tokens = tokens
        self.vocab = resolve_vocab(self.default_vocab, grid_lookup)
        self.meanings = resolve_meanings(self.vocab, grid_vocab)
        self.action_names = resolve_actions(self.action_names, self.roll_action_ids,
                                            action_lookup)
        self.env_instruction = env_instruction
        self.action_space = spaces.Discrete(len(self.action_names))
        length = rows * (cols + 1) - 1  # rows joined by "\n"
        self.observation_space = spaces.Text(
            max_length=length, min_length=length, charset="".join(self.vocab.values()) + "\n"
        )
        self._num_steps = 0

    @property
    def instruction(self) -> str:
        """The rules, the symbols and the actions, worded and laid out as ROLL's env gives
        them (its `env_instruction` in the reset info); the answer format is in the rules.
        `env_instruction` (ROLL's key) replaces the rules; the symbols and actions stay."""
        rules = self.default_rules if self.env_instruction is None else self.env_instruction
        return roll_instruction(rules, self.meanings, self.action_names)

    def parse_action(self, reply: str) -> int | None:
        """The action the reply names through `action_pattern`, or None when unparsable."""
        return parse_answer(reply, self.action_names, self.action_pattern, self.special_tokens)

    def action_content(self, reply: str) -> str:
        """ROLL's `action_content` of a reply (its envs put it in the step's info): what
        `action_pattern` captured, "" when it did not match. ROLL's step-wise env managers
        show it as the step's action."""
        return captured_answer(reply, self.action_pattern, self.special_tokens) or ""

    def step_text(self, reply: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """`step` with the action parsed from an agent's reply; unparsable is a no-op step."""
        return self.step(self.parse_action(reply))

    def step(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Apply `action`; None or an action outside the space is a no-op step.

        The no-op still counts toward `max_steps` and earns the env's no-op reward (its
        `format_penalty`, plus the step cost in Sokoban), so an agent that cannot keep to the
        answer format runs out of steps instead of stalling the episode. At `max_steps` the
        episode ends with ROLL's flags (`_end_flags`).
        """
        self._num_steps += 1
        index = self._action_index(action)
        if index is None:
            reward, terminated, effective = self._no_op(), self._is_over(), False
        else:
            reward, terminated, effective = self._move(index)
        truncated = False
        if self._num_steps >= self.max_steps and not self._success():
            terminated, truncated = self._end_flags(valid=index is not None)
        info = self._info(valid=index is not None, effective=effective)
        return self._text(), reward, terminated, truncated, info

    def _end_flags(self, *, valid: bool) -> tuple[bool, bool]:
        """(terminated, truncated) of a step that uses up `max_steps` without success: both
        True, as a ROLL trajectory records it (its env manager ends the episode there)."""
        return True, True

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

    def _no_op(self) -> float:
        """The reward of a step whose reply named no action."""
        return self.format_penalty

    def _is_over(self) -> bool:
        """Whether the episode has reached a terminal state (kept by a no-op step)."""
        raise NotImplementedError

    def _success(self) -> bool:
        """Whether the task is done (the goal reached, every box on a target)."""
        raise NotImplementedError

    def _text(self) -> str:
        raise NotImplementedError

    def _info(self, *, valid: bool, effective: bool) -> dict[str, Any]:
        raise NotImplementedError
