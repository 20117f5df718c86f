"""Sokoban for LLM agents: push every box onto a target, seen as a text grid.

Registered as `rollstream/Sokoban-v0`. A new room is generated at each reset from the reset
seed with ROLL's algorithm (see `sokoban_gen`), so it is solvable, reproducible, and drawn
from the distribution ROLL's Sokoban env gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from producers.envs.sokoban_gen import Room, generate_room
from producers.envs.text import SPECIAL_TOKENS, TextGridEnv

MIN_SEARCH_DEPTH = 3  # a shallower reverse search cannot pull a box off its target

# Cell kind -> symbol; the keys are the `grid_lookup` keys, in the order of ROLL's integer
# codes (0 wall, 1 empty, 2 target, 3 box on target, 4 box, 5 player, 6 player on target).
DEFAULT_VOCAB: Mapping[str, str] = MappingProxyType(
    {
        "wall": "#",
        "empty": "_",
        "target": "O",
        "box_on_target": "√",
        "box": "X",
        "player": "P",
        "player_on_target": "S",
    }
)

# ROLL's rewards (gym-sokoban 0.0.6's, which ROLL's Sokoban env steps): per step, per box
# pushed onto or off a target, and for the last box placed.
STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_REWARD = -1.0
SOLVED_REWARD = 10.0

# ROLL's Sokoban instruction, word for word (roll/pipeline/agentic/env/sokoban/env.py at
# 8eb27cc2); the symbols and the actions follow it.
ROLL_RULES = (
    "You are solving the Sokoban puzzle. "
    "You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box. "
    "The answer must be one of action in a turn, format is <answer>Right</answer>."
)


class SokobanEnv(TextGridEnv):
    """Sokoban with a generated room per reset and a text observation, as ROLL's.

    Actions 0..3 = Up, Down, Left, Right (ROLL's ids 1..4, as its `action_lookup` numbers
    them); moving into a box pushes it if the cell beyond is free. Reward per step: -0.1, +1
    for a box pushed onto a target, -1 for one pushed off, +10 when all boxes are on targets
    (which terminates). A reply that names no action is a no-op step: -0.1 plus
    `format_penalty`. The step that uses up `max_steps` unsolved ends the episode with
    terminated and truncated True, as ROLL's env returns it (its gym-sokoban base ends the
    game there) - except after an unparsable reply, where ROLL's env returns truncated False.
    Defaults for omitted settings are ROLL's: 10x10, 4 boxes, 20 steps, search depth 300, no
    format penalty.
    """

    action_names = ("Up", "Down", "Left", "Right")
    roll_action_ids = (1, 2, 3, 4)
    default_vocab = DEFAULT_VOCAB
    default_rules = ROLL_RULES

    def __init__(
        self,
        dim_room: Sequence[int] = (10, 10),
        num_boxes: int = 4,
        max_steps: int = 20,
        search_depth: int = 300,
        grid_lookup: Mapping[Any, str] | None = None,
        format_penalty: float = 0.0,
        render_mode: str | None = None,
        action_pattern: str | None = None,
        grid_vocab: Mapping[Any, Any] | None = None,
        action_lookup: Mapping[Any, Any] | None = None,
        env_instruction: str | None = None,
        special_token_list: Sequence[str] | None = SPECIAL_TOKENS,
    ) -> None:
        rows, cols = (int(n) for n in dim_room)
        if rows < 3 or cols < 3:
            raise ValueError(f"dim_room must be at least 3x3, got {tuple(dim_room)}")
        if int(num_boxes) < 1:
            raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
        if (rows - 2) * (cols - 2) < int(num_boxes) + 2:
            raise ValueError(f"dim_room {tuple(dim_room)} has no room for {num_boxes} boxes")
        if int(search_depth) < MIN_SEARCH_DEPTH:
            raise ValueError(f"search_depth must be >= {MIN_SEARCH_DEPTH} (the reverse search "
                             f"goes search_depth - 2 moves deep), got {search_depth}")
        self.dim_room = (rows, cols)
        self.num_boxes = int(num_boxes)
        self.search_depth = int(search_depth)
        super().__init__(
            rows=rows,
            cols=cols,
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
        # Cells are indices into the rendered text, `row * (cols + 1) + col`: the "\n" after
        # each row takes one index, so a move is an index offset and rendering is a join.
        stride = cols + 1
        self._deltas = (-stride, stride, -1, 1)
        self._base: list[str] = []  # static tiles: walls, floor, targets, newlines
        self._is_floor: list[bool] = []
        self._is_target: list[bool] = []
        self._boxes: set[int] = set()
        self._player = 0
        self._boxes_on_target = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Generate a new room from the env's generator (seeded by `seed` when given)."""
        super().reset(seed=seed)
        room = generate_room(self.dim_room, self.num_boxes, self.search_depth, self.np_random)
        self._load(room)
        self._num_steps = 0
        return self._text(), {"success": False, "boxes_on_target": self._boxes_on_target}

    def _load(self, room: Room) -> None:
        """Lay the room out on the text indices and precompute the static tiles."""
        rows, cols = self.dim_room
        size = rows * (cols + 1) - 1
        is_floor = [False] * size
        is_target = [False] * size
        base = ["\n"] * size

        def to_text(cell: int) -> int:
            return cell + cell // cols

        for cell in range(rows * cols):
            is_floor[to_text(cell)] = room.floor[cell]
        for cell in room.targets:
            is_target[to_text(cell)] = True
        for row in range(rows):
            for col in range(cols):
                index = row * (cols + 1) + col
                kind = "target" if is_target[index] else "empty" if is_floor[index] else "wall"
                base[index] = self.vocab[kind]
        self._base, self._is_floor, self._is_target = base, is_floor, is_target
        self._boxes = {to_text(cell) for cell in room.boxes}
        self._player = to_text(room.player)
        self._boxes_on_target = sum(is_target[box] for box in self._boxes)

    def _no_op(self) -> float:
        return STEP_REWARD + self.format_penalty  # ROLL steps its no-op action, then adds it

    def _end_flags(self, *, valid: bool) -> tuple[bool, bool]:
        return True, valid

    def _move(self, action: int) -> tuple[float, bool, bool]:
        delta = self._deltas[action]
        to = self._player + delta
        if not self._is_floor[to]:
            return STEP_REWARD, self._is_over(), False
        reward = STEP_REWARD
        if to in self._boxes:
            beyond = to + delta
            if not self._is_floor[beyond] or beyond in self._boxes:
                return STEP_REWARD, self._is_over(), False
            reward += self._push(to, beyond)
        self._player = to
        solved = self._is_over()
        if solved:
            reward += SOLVED_REWARD
        return reward, solved, True

    def _push(self, box: int, to: int) -> float:
        """Move a box and return the reward for targets it left or reached."""
        self._boxes.remove(box)
        self._boxes.add(to)
        reward = 0.0
        if self._is_target[box]:
            self._boxes_on_target -= 1
            reward += BOX_OFF_TARGET_REWARD
        if self._is_target[to]:
            self._boxes_on_target += 1
            reward += BOX_ON_TARGET_REWARD
        return reward

    def _is_over(self) -> bool:
        return self._boxes_on_target == self.num_boxes

    def _success(self) -> bool:
        return self._is_over()  # every box on a target ends the game

    def _text(self) -> str:
        cells = self._base.copy()
        vocab = self.vocab
        for box in self._boxes:
            cells[box] = vocab["box_on_target"] if self._is_target[box] else vocab["box"]
        on_target = self._is_target[self._player]
        cells[self._player] = vocab["player_on_target"] if on_target else vocab["player"]
        return "".join(cells)

    def _info(self, *, valid: bool, effective: bool) -> dict[str, Any]:
        return {
            "success": self._is_over(),
            "action_is_valid": valid,
            "action_is_effective": effective,
            "boxes_on_target": self._boxes_on_target,
        }
