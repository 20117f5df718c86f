"""FrozenLake for LLM agents: walk from the start to the goal without falling into a hole.

Registered as `rollstream/FrozenLake-v0`. Each reset draws a new `size` x `size` map from the
reset seed as ROLL's `frozen_lake/utils.py` draws it (alibaba/ROLL at 8eb27cc2): every cell
is frozen with probability `p`, else a hole; the start and the goal are two different cells
drawn at random (each row and column uniform, redrawn when they coincide); the map is
redrawn until a path leads from the start to the goal around the holes. The dynamics are
gymnasium's FrozenLake, which ROLL's env steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from producers.envs.text import SPECIAL_TOKENS, TextGridEnv

# Cell kind -> symbol; the keys are the `grid_lookup` keys, in the order of ROLL's integer
# codes (0 player, 1 empty, 2 hole, 3 goal, 4 player in hole, 5 player on goal). The kinds in
# words are the meanings ROLL tells the agent ("_" is "empty": frozen ice).
DEFAULT_VOCAB: Mapping[str, str] = MappingProxyType(
    {
        "player": "P",
        "empty": "_",
        "hole": "O",
        "goal": "G",
        "player_in_hole": "X",
        "player_on_goal": "√",
    }
)

# ROLL's FrozenLake instruction, word for word (frozen_lake/env.py at 8eb27cc2, its wording
# and its slippery-ice sentence whatever `is_slippery` says); symbols and actions follow it.
ROLL_RULES = (
    "You are solving the FrozenLake puzzle. "
    "Forbid the whole and go to the target. "
    "You may move to the unintended direction due to the slippery ice. "
    "The answer must be one of action in a turn, format is <answer>Right</answer>"
)

FROZEN, HOLE, GOAL = "F", "H", "G"  # tile codes of a generated map
MAX_MAP_ATTEMPTS = 10_000  # maps drawn before giving up (only a tiny `p` gets near it)
GOAL_REWARD = 1.0

# (row, col) offsets of Left, Down, Right, Up: gymnasium's action order.
_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))


def generate_lake(
    size: int, p: float, rng: np.random.Generator
) -> tuple[tuple[str, ...], tuple[int, int]]:
    """(map as rows of tile codes, start cell): a map with a path from the start to the goal.

    Maps are drawn until one has a path; all draws come from `rng`, so the map is a function
    of the generator's state.
    """
    cells = size * size
    for _ in range(MAX_MAP_ATTEMPTS):
        # one draw per attempt (a numpy call costs more than the map): a uniform number per
        # cell (frozen below p), then four for the start's and the goal's row and column
        draws = rng.random(cells + 4).tolist()
        start_row, start_col, goal_row, goal_col = (int(u * size) for u in draws[cells:])
        if (start_row, start_col) == (goal_row, goal_col):
            continue
        tiles = [FROZEN if u < p else HOLE for u in draws[:cells]]
        tiles[start_row * size + start_col] = FROZEN
        tiles[goal_row * size + goal_col] = GOAL
        rows = tuple("".join(tiles[row * size:(row + 1) * size]) for row in range(size))
        if has_path(rows, (start_row, start_col)):
            return rows, (start_row, start_col)
    raise RuntimeError(f"no FrozenLake map with a path after {MAX_MAP_ATTEMPTS} draws (p={p})")


def has_path(rows: tuple[str, ...], start: tuple[int, int]) -> bool:
    """Whether the goal can be reached from `start` without entering a hole."""
    size = len(rows)
    seen = {start}
    queue = deque([start])
    while queue:
        row, col = queue.popleft()
        if rows[row][col] == GOAL:
            return True
        for d_row, d_col in _MOVES:
            nxt = (row + d_row, col + d_col)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in seen:
                if rows[nxt[0]][nxt[1]] != HOLE:
                    seen.add(nxt)
                    queue.append(nxt)
    return False


class FrozenLakeEnv(TextGridEnv):
    """FrozenLake with a random map per reset and a text observation, as ROLL's.

    Actions 0..3 = Left, Down, Right, Up (ROLL's ids are the same). On a slippery lake the
    move taken is the intended one or one of the two perpendicular ones, 1/3 each (drawn from
    the env's generator). A move off the edge stays put. Reaching the goal terminates with
    reward 1, a hole terminates with reward 0; other steps earn 0, and a reply that names no
    action `format_penalty`. The step that uses up `max_steps` without reaching the goal ends
    the episode with terminated and truncated True, as a ROLL trajectory records it. Defaults
    for omitted settings are ROLL's: 4x4, p 0.8, slippery, 20 steps, no format penalty.
    """

    action_names = ("Left", "Down", "Right", "Up")
    roll_action_ids = (0, 1, 2, 3)
    default_vocab = DEFAULT_VOCAB
    default_rules = ROLL_RULES

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = True,
        max_steps: int = 20,
        grid_lookup: Mapping[Any, str] | None = None,
        format_penalty: float = 0.0,
        render_mode: str | None = None,
        action_pattern: str | None = None,
        grid_vocab: Mapping[Any, Any] | None = None,
        action_lookup: Mapping[Any, Any] | None = None,
        env_instruction: str | None = None,
        special_token_list: Sequence[str] | None = SPECIAL_TOKENS,
        map_seed: int | None = None,
    ) -> None:
        if int(size) < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if not 0.0 < float(p) <= 1.0:
            raise ValueError(f"p (the probability a cell is frozen) must be in (0, 1], got {p}")
        self.size = int(size)
        self.p = float(p)
        self.is_slippery = bool(is_slippery)
        self.map_seed = map_seed  # ROLL's key: its map before the first reset; every reset
        # draws the map from the reset seed, here as in ROLL
        super().__init__(
            rows=self.size,
            cols=self.size,
            max_steps=max_steps,
            format_penalty=format_penalty,
            render_mode=render_mode,
            action_pattern=action_pattern,
            grid_lookup=grid_lookup,
            grid_vocab=grid_vocab,
            action_lookup=action_lookup,
            env_instruction=env_instruction,
            special_token_list=special_token_list,
        )
        self._tiles: tuple[str, ...] = ()  # the map, rows of tile codes
        self._base: list[str] = []  # the rendered map without the player
        self._row = 0
        self._col = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Draw a new map from the env's generator (seeded by `seed` when given)."""
        super().reset(seed=seed)
        self._tiles, (self._row, self._col) = generate_lake(self.size, self.p, self.np_random)
        symbol = {FROZEN: self.vocab["empty"], HOLE: self.vocab["hole"], GOAL: self.vocab["goal"]}
        self._base = list("\n".join("".join(symbol[t] for t in row) for row in self._tiles))
        self._num_steps = 0
        return self._text(), {"success": False}

    def _move(self, action: int) -> tuple[float, bool, bool]:
        if self._is_over():  # holes and the goal are absorbing, as in gymnasium
            return 0.0, True, False
        if self.is_slippery:
            action = (action + int(self.np_random.integers(3)) - 1) % 4
        d_row, d_col = _MOVES[action]
        last = self.size - 1
        row = min(max(self._row + d_row, 0), last)
        col = min(max(self._col + d_col, 0), last)
        moved = (row, col) != (self._row, self._col)
        self._row, self._col = row, col
        tile = self._tiles[row][col]
        return (GOAL_REWARD if tile == GOAL else 0.0), tile != FROZEN, moved

    def _is_over(self) -> bool:
        return self._tiles[self._row][self._col] != FROZEN

    def _success(self) -> bool:
        return self._tiles[self._row][self._col] == GOAL

    def _text(self) -> str:
        tile = self._tiles[self._row][self._col]
        kind = "player_in_hole" if tile == HOLE else "player_on_goal" if tile == GOAL else "player"
        cells = self._base.copy()
        cells[self._row * (self.size + 1) + self._col] = self.vocab[kind]
        return "".join(cells)

    def _info(self, *, valid: bool, effective: bool) -> dict[str, Any]:
        return {
            "success": self._success(),
            "action_is_valid": valid,
            "action_is_effective": effective,
        }
