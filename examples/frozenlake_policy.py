"""A small numpy softmax policy for FrozenLake, read off the text observation.

The producers load it with `policy: {type: python, entrypoint: "frozenlake_policy:make_policy"}`
(this folder on PYTHONPATH); `grpo_frozenlake.py` trains it. For each of the four actions
(Left, Down, Right, Up) the grid text gives a few features of the move: does it leave the
grid, fall into a hole, reach the goal, come closer to the goal, lead into a dead end, ...
The policy is `softmax(features @ w)`; the weights `w` travel through Redis as msgpack of a
numpy array, one copy per version.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.codec import pack, unpack

# FrozenLake's default symbols (producers/envs/frozenlake.py) and its action order. The start
# and the goal are anywhere on the map (ROLL's FrozenLake), so both are read off the grid.
PLAYER, HOLE, GOAL = "P", "O", "G"
PLAYER_IN_HOLE, PLAYER_ON_GOAL = "X", "√"
MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (row, col) offsets of Left, Down, Right, Up
FEATURES = (
    "off_grid",  # the move would leave the grid: the player stays put
    "hole",  # the target cell is a hole
    "goal",  # the target cell is the goal
    "closer",  # the target is closer to the goal (Manhattan distance)
    "farther",  # the target is farther from the goal
    "dead_end",  # the target is frozen and every way on from it is a hole or the edge
    "onward",  # from the target a safe cell closer to the goal can be reached
    "back",  # the target is the cell the player just left
)


def parse_grid(observation: str) -> tuple[list[str], tuple[int, int], tuple[int, int]]:
    """The grid rows, the player's cell and the goal's cell (the player's cell when the
    player stands on the goal)."""
    rows = observation.split("\n")
    player = goal = None
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            if cell in (PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL):
                player = (r, c)
            if cell in (GOAL, PLAYER_ON_GOAL):
                goal = (r, c)
    if player is None or goal is None:
        raise ValueError(f"not a FrozenLake grid with the default symbols:\n{observation}")
    return rows, player, goal


def action_features(observation: str, previous: tuple[int, int] | None = None) -> np.ndarray:
    """Features of each action's move, shape (4, len(FEATURES)), float32."""
    rows, (r, c), (gr, gc) = parse_grid(observation)
    height, width = len(rows), len(rows[0])

    def inside(cell: tuple[int, int]) -> bool:
        return 0 <= cell[0] < height and 0 <= cell[1] < width

    def safe(cell: tuple[int, int]) -> bool:
        return inside(cell) and rows[cell[0]][cell[1]] != HOLE

    def dist(cell: tuple[int, int]) -> int:
        return abs(cell[0] - gr) + abs(cell[1] - gc)

    out = np.zeros((len(MOVES), len(FEATURES)), dtype=np.float32)
    here = dist((r, c))
    for a, (dr, dc) in enumerate(MOVES):
        target = (r + dr, c + dc)
        if not inside(target):
            out[a, 0] = 1.0
            continue
        cell = rows[target[0]][target[1]]
        ways_on = [(target[0] + er, target[1] + ec) for er, ec in MOVES]
        ways_on = [w for w in ways_on if w != (r, c) and safe(w)]
        out[a] = (
            0.0,
            cell == HOLE,
            cell == GOAL,
            dist(target) < here,
            dist(target) > here,
            cell != HOLE and cell != GOAL and not ways_on,
            cell != HOLE and any(dist(w) < dist(target) for w in ways_on),
            target == previous,
        )
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def encode_weights(w: np.ndarray) -> bytes:
    """The weights as they travel through Redis: msgpack of a float32 array."""
    return pack({"w": np.asarray(w, dtype=np.float32)})


class SoftmaxPolicy:
    """`softmax(action_features(obs) @ w)`, sampled with the member's own generator.

    Train episodes sample; val episodes too, or take the most likely action (`greedy_val`)."""

    def __init__(self, greedy_val: bool = False):
        self.w = np.zeros(len(FEATURES), dtype=np.float32)  # version 0: uniform
        self.version = 0
        self.greedy_val = greedy_val

    # -- weights, by version (the producer calls these) ------------------------------------
    def decode_weights(self, data: bytes) -> np.ndarray:
        w = np.array(unpack(data)["w"], dtype=np.float32)
        if w.shape != self.w.shape:
            raise ValueError(f"weights of shape {w.shape}, expected {self.w.shape}")
        return w

    def set_weights(self, version: int, decoded: np.ndarray) -> None:
        self.w, self.version = decoded, version

    # -- acting ----------------------------------------------------------------------------
    def act_now(self, observation: str, ctx: Any) -> tuple[int, None]:
        previous = ctx.scratch.get("previous")
        feats = action_features(observation, previous)
        probs = softmax(feats @ self.w)
        if ctx.mode == "val" and self.greedy_val:
            action = int(np.argmax(probs))
        else:
            action = int(ctx.rng.choice(len(probs), p=probs))
        ctx.scratch["previous"] = parse_grid(observation)[1]
        return action, None

    async def act(self, observation: str, ctx: Any) -> tuple[int, None]:
        return self.act_now(observation, ctx)


def make_policy(greedy_val: bool = False) -> SoftmaxPolicy:
    """The factory the producers call; `greedy_val` comes from the config's policy block."""
    return SoftmaxPolicy(greedy_val=greedy_val)
