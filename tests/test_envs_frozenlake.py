"""FrozenLake: API conformance, maps with a path, and gymnasium's dynamics, read from the text."""

from __future__ import annotations

from collections import Counter, deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from producers.envs import FrozenLakeEnv, make_env
from schemas.envspec import DEFAULT_CUSTOM_ENVS, FROZENLAKE_ID

CONFIG = DEFAULT_CUSTOM_ENVS["FrozenLake"]["env_config"]
VOCAB = {  # the documented vocabulary, written out here as the test's oracle
    "player": "P",
    "frozen": "_",
    "hole": "O",
    "goal": "G",
    "player_in_hole": "X",
    "player_on_goal": "√",
}
MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}  # Left, Down, Right, Up


def make_lake(**overrides) -> gym.Env:
    return make_env(FROZENLAKE_ID, {**CONFIG, **overrides})


def parse_lake(text: str, vocab: dict[str, str] = VOCAB) -> tuple[list[str], tuple[int, int]]:
    """Tile rows ("F", "H", "G") and the player's cell, read from the rendered text."""
    kind_of = {symbol: kind for kind, symbol in vocab.items()}
    tile_of = {
        "player": "F",
        "frozen": "F",
        "hole": "H",
        "goal": "G",
        "player_in_hole": "H",
        "player_on_goal": "G",
    }
    rows, players = [], []
    for r, line in enumerate(text.split("\n")):
        kinds = [kind_of[symbol] for symbol in line]
        rows.append("".join(tile_of[kind] for kind in kinds))
        players += [(r, c) for c, kind in enumerate(kinds) if kind.startswith("player")]
    assert len(players) == 1, text
    return rows, players[0]


def reachable(rows: list[str]) -> set[tuple[int, int]]:
    """Cells reachable from the top-left without stepping into a hole (breadth-first)."""
    size = len(rows)
    seen = {(0, 0)}
    queue = deque([(0, 0)])
    while queue:
        r, c = queue.popleft()
        if rows[r][c] != "F":
            continue  # the goal ends the walk
        for dr, dc in MOVES.values():
            cell = (r + dr, c + dc)
            if 0 <= cell[0] < size and 0 <= cell[1] < size and cell not in seen:
                if rows[cell[0]][cell[1]] != "H":
                    seen.add(cell)
                    queue.append(cell)
    return seen


def expected_cell(cell: tuple[int, int], action: int, size: int) -> tuple[int, int]:
    dr, dc = MOVES[action]
    return min(max(cell[0] + dr, 0), size - 1), min(max(cell[1] + dc, 0), size - 1)


@pytest.mark.parametrize("slippery", [False, True])
def test_check_env_passes(slippery: bool) -> None:
    env = make_lake(is_slippery=slippery, disable_env_checker=False)
    check_env(env.unwrapped)


def test_maps_always_have_a_path() -> None:
    env = make_lake()
    maps = set()
    for seed in range(500):
        text, _ = env.reset(seed=seed)
        rows, player = parse_lake(text)
        assert len(rows) == CONFIG["size"] and all(len(row) == CONFIG["size"] for row in rows)
        assert player == (0, 0) and rows[-1][-1] == "G"
        assert (CONFIG["size"] - 1, CONFIG["size"] - 1) in reachable(rows), text
        maps.add(text)
    assert len(maps) > 300, "different seeds should mostly give different maps"


def test_holes_follow_p() -> None:
    env = make_lake(size=8, p=0.7)
    counts: Counter[str] = Counter()
    for seed in range(100):
        counts.update("".join(parse_lake(env.reset(seed=seed)[0])[0]))
    # Maps without a path are redrawn, which favours frozen cells a little.
    assert 0.68 < counts["F"] / (counts["F"] + counts["H"]) < 0.8


def test_same_seed_same_map() -> None:
    env_a, env_b = make_lake(), make_lake()
    for seed in range(20):
        text = env_a.reset(seed=seed)[0]
        env_b.reset(seed=seed + 1)
        assert env_b.reset(seed=seed)[0] == text == env_a.render()


def test_not_slippery_moves_as_told() -> None:
    env = make_lake(max_steps=1000)
    rng = np.random.default_rng(1)
    for seed in range(50):
        text, _ = env.reset(seed=seed)
        rows, cell = parse_lake(text)
        terminated = False
        while not terminated:
            action = int(rng.integers(4))
            nxt = expected_cell(cell, action, len(rows))
            text, reward, terminated, truncated, info = env.step(action)
            assert parse_lake(text) == (rows, nxt)
            tile = rows[nxt[0]][nxt[1]]
            assert reward == (1.0 if tile == "G" else 0.0)
            assert terminated == (tile != "F")
            assert info["success"] == (tile == "G")
            assert info["action_is_effective"] == (nxt != cell)
            cell = nxt


def test_goal_and_hole_symbols() -> None:
    env = make_lake(max_steps=1000)
    endings = set()
    for seed in range(100):
        text, _ = env.reset(seed=seed)
        rows, _ = parse_lake(text)
        for action in [1] * 3 + [2] * 3:  # down the left edge, then right along the bottom
            text, reward, terminated, _, _ = env.step(action)
            if terminated:
                endings.add(text[-1] if reward == 1.0 else "hole")
                assert ("X" in text) == (reward == 0.0) and ("√" in text) == (reward == 1.0)
                break
    assert endings == {"√", "hole"}


def test_terminal_states_are_absorbing() -> None:
    env = make_lake(max_steps=1000)
    for seed in range(30):
        env.reset(seed=seed)
        terminated = False
        while not terminated:
            text, _, terminated, _, _ = env.step(int(env.unwrapped.np_random.integers(4)))
        again = env.step(0)
        assert again[0] == text and again[1] == 0.0 and again[2] is True
        assert again[4]["action_is_effective"] is False


def test_slippery_is_deterministic_by_seed_and_perpendicular() -> None:
    def trajectory(seed: int) -> list[str]:
        env = make_lake(is_slippery=True, p=1.0, max_steps=50)
        env.reset(seed=seed)
        return [env.step(2)[0] for _ in range(50)]

    assert trajectory(3) == trajectory(3)
    assert trajectory(3) != trajectory(4)

    env = make_lake(is_slippery=True, p=1.0, size=9, max_steps=10_000)
    text, _ = env.reset(seed=0)
    moves = Counter()
    for _ in range(3000):
        _, cell = parse_lake(text)
        if cell[0] in (0, 8) or cell[1] in (0, 8):  # away from the edges every move shows
            text, _ = env.reset(seed=int(env.unwrapped.np_random.integers(1 << 30)))
            text, *_ = env.step(1)
            text, *_ = env.step(1)
            continue
        text, *_ = env.step(2)  # Right
        _, after = parse_lake(text)
        moves[(after[0] - cell[0], after[1] - cell[1])] += 1
    assert set(moves) <= {(0, 1), (1, 0), (-1, 0)}, "never the opposite of Right"
    total = sum(moves.values())
    assert all(0.25 < moves[move] / total < 0.42 for move in [(0, 1), (1, 0), (-1, 0)])


def test_truncated_at_max_steps() -> None:
    env = make_lake(p=1.0, max_steps=4)
    env.reset(seed=0)
    flags = [env.step(3)[3] for _ in range(4)]  # Up at the top edge: stays put
    assert flags == [False, False, False, True]


def test_vocab_variant() -> None:
    vocab = {**VOCAB, "player": "@", "frozen": ".", "hole": "#"}
    env = make_lake(grid_lookup={"player": "@", "frozen": ".", "hole": "#"})
    plain = make_lake()
    for seed in range(20):
        text = env.reset(seed=seed)[0]
        assert not set(text) & {"P", "_", "O"}
        assert parse_lake(text, vocab) == parse_lake(plain.reset(seed=seed)[0])
    assert "# = hole" in env.unwrapped.instruction


@pytest.mark.parametrize(
    "kwargs", [{"size": 1}, {"p": 0.0}, {"p": 1.5}, {"grid_lookup": {"goal": "_"}}]
)
def test_bad_settings_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        FrozenLakeEnv(**kwargs)
