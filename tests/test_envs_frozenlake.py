"""FrozenLake: API conformance, ROLL's maps (start and goal anywhere, with a path), gymnasium's
dynamics, ROLL's flags and defaults, all read from the text."""

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
    "empty": "_",
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
        "empty": "F",
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


def find(rows: list[str], tile: str) -> tuple[int, int]:
    return next((r, c) for r, row in enumerate(rows) for c, cell in enumerate(row) if cell == tile)


def distances(rows: list[str], start: tuple[int, int]) -> dict[tuple[int, int], int]:
    """Steps from `start` to every cell reachable without stepping into a hole (the goal
    ends a walk), breadth-first."""
    size = len(rows)
    seen = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if rows[r][c] == "G" and (r, c) != start:
            continue
        for dr, dc in MOVES.values():
            cell = (r + dr, c + dc)
            if 0 <= cell[0] < size and 0 <= cell[1] < size and cell not in seen:
                if rows[cell[0]][cell[1]] != "H":
                    seen[cell] = seen[(r, c)] + 1
                    queue.append(cell)
    return seen


def shortest_path(text: str) -> tuple[int | None, tuple[int, int], tuple[int, int]]:
    """(steps from the start to the goal or None, start, goal) of a fresh map."""
    rows, start = parse_lake(text)
    goal = find(rows, "G")
    return distances(rows, start).get(goal), start, goal


def expected_cell(cell: tuple[int, int], action: int, size: int) -> tuple[int, int]:
    dr, dc = MOVES[action]
    return min(max(cell[0] + dr, 0), size - 1), min(max(cell[1] + dc, 0), size - 1)


@pytest.mark.parametrize("slippery", [False, True])
def test_check_env_passes(slippery: bool) -> None:
    env = make_lake(is_slippery=slippery, disable_env_checker=False)
    check_env(env.unwrapped)


def test_maps_have_a_path_from_a_random_start_to_a_random_goal() -> None:
    env = make_lake()
    maps = set()
    for seed in range(500):
        text, _ = env.reset(seed=seed)
        rows, _ = parse_lake(text)
        assert len(rows) == 4 and all(len(row) == 4 for row in rows)  # ROLL's default size
        steps, _, _ = shortest_path(text)
        assert steps is not None and steps >= 1, text  # a path, and the goal is elsewhere
        assert "".join(rows).count("G") == 1
        maps.add(text)
    assert len(maps) > 300, "different seeds should mostly give different maps"


# ROLL's FrozenLake over seeds 0-299 (alibaba/ROLL 8eb27cc2, frozen_lake/utils.py, measured by
# running it): shortest path 2.78 steps on average, 1 to 8; the start in the top-left corner
# 5% of the time. The old generator (top-left to bottom-right) gave 6 steps every time.
LAKE_SEEDS = range(300)


def test_start_goal_and_path_lengths_follow_rolls_distribution() -> None:
    env = make_lake()
    found = [shortest_path(env.reset(seed=seed)[0]) for seed in LAKE_SEEDS]
    steps = np.array([length for length, _, _ in found])
    assert 2.5 <= steps.mean() <= 3.1, steps.mean()  # ours: 2.83
    assert steps.min() == 1 and steps.max() >= 6
    top_left = np.mean([start == (0, 0) for _, start, _ in found])
    bottom_right = np.mean([goal == (3, 3) for _, _, goal in found])
    assert 0.02 <= top_left <= 0.10, top_left  # ours: 0.050 (1/16 before the path check)
    assert 0.02 <= bottom_right <= 0.10, bottom_right  # ours: 0.037
    assert len({start for _, start, _ in found}) == len({goal for _, _, goal in found}) == 16


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
            assert terminated == (tile != "F") and not truncated
            assert info["success"] == (tile == "G")
            assert info["action_is_effective"] == (nxt != cell)
            cell = nxt


def test_goal_and_hole_symbols() -> None:
    env = make_lake(max_steps=1000)
    rng = np.random.default_rng(2)
    endings = set()
    for seed in range(100):
        env.reset(seed=seed)
        terminated = False
        while not terminated:
            text, reward, terminated, _, _ = env.step(int(rng.integers(4)))
        endings.add("goal" if reward == 1.0 else "hole")
        assert ("X" in text) == (reward == 0.0) and ("√" in text) == (reward == 1.0)
        assert "P" not in text
    assert endings == {"goal", "hole"}


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
    moves: Counter[tuple[int, int]] = Counter()
    resets = 0
    for _ in range(3000):
        rows, cell = parse_lake(text)
        goal = find(rows, "G")
        near_goal = abs(cell[0] - goal[0]) + abs(cell[1] - goal[1]) <= 1
        if cell[0] in (0, 8) or cell[1] in (0, 8) or near_goal:
            # away from the edges every move shows, and away from the goal none ends the game
            resets += 1
            text, _ = env.reset(seed=resets)
            continue
        text, *_ = env.step(2)  # Right
        _, after = parse_lake(text)
        moves[(after[0] - cell[0], after[1] - cell[1])] += 1
    assert set(moves) <= {(0, 1), (1, 0), (-1, 0)}, "never the opposite of Right"
    total = sum(moves.values())
    assert total > 1000
    assert all(0.25 < moves[move] / total < 0.42 for move in [(0, 1), (1, 0), (-1, 0)])


def walk_to(text: str, tile: str) -> list[int] | None:
    """Actions from the player over frozen cells to the nearest `tile` ("G" or "H")."""
    rows, start = parse_lake(text)
    size = len(rows)
    first: dict[tuple[int, int], list[int]] = {start: []}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for action, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in first:
                here = rows[nxt[0]][nxt[1]]
                if here == tile:
                    return first[cell] + [action]
                if here == "F":
                    first[nxt] = first[cell] + [action]
                    queue.append(nxt)
    return None


def test_flags_at_max_steps_are_rolls() -> None:
    """ROLL's env manager ends an episode at max_steps with terminated and truncated; a goal
    reached on the last step is a success (terminated only), a hole there is both."""
    env = make_lake(max_steps=4)
    env.reset(seed=0)
    flags = [env.step(None)[2:4] for _ in range(4)]  # no-ops: the player stays put
    assert flags == [(False, False)] * 3 + [(True, True)]
    ends = {}
    for seed in range(200):
        for tile in ("G", "H"):
            text, _ = env.reset(seed=seed)
            path = walk_to(text, tile)
            if path is None or tile in ends:
                continue
            env.unwrapped.max_steps = len(path)
            for action in path:
                _, reward, terminated, truncated, info = env.step(action)
            ends[tile] = (terminated, truncated, reward, info["success"])
        if len(ends) == 2:
            break
    assert ends == {"G": (True, False, 1.0, True), "H": (True, True, 0.0, False)}


def test_rolls_defaults_and_instruction() -> None:
    env = FrozenLakeEnv()
    assert (env.size, env.p, env.is_slippery, env.max_steps, env.format_penalty) == (
        4, 0.8, True, 20, 0.0)
    assert env.instruction == (  # ROLL's text, word for word (frozen_lake/env.py)
        "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You "
        "may move to the unintended direction due to the slippery ice. The answer must be "
        "one of action in a turn, format is <answer>Right</answer>\n"
        "The meaning of each symbol in the state is:\n"
        "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal\n"
        "Your available actions are:\nLeft, Down, Right, Up")
    assert FrozenLakeEnv(map_seed=3).map_seed == 3  # ROLL's key is accepted


def test_vocab_variant() -> None:
    vocab = {**VOCAB, "player": "@", "empty": ".", "hole": "#"}
    env = make_lake(grid_lookup={"player": "@", "empty": ".", "hole": "#"})
    plain = make_lake()
    for seed in range(20):
        text = env.reset(seed=seed)[0]
        assert not set(text) & {"P", "_", "O"}
        assert parse_lake(text, vocab) == parse_lake(plain.reset(seed=seed)[0])
    assert "@: player, .: empty, #: hole, G: goal" in env.unwrapped.instruction


@pytest.mark.parametrize(
    "kwargs", [{"size": 1}, {"p": 0.0}, {"p": 1.5}, {"grid_lookup": {"goal": "_"}}]
)
def test_bad_settings_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        FrozenLakeEnv(**kwargs)


if __name__ == "__main__":  # python tests/test_envs_frozenlake.py [SEEDS [FIRST]]: the figures
    import sys

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    lake = make_lake()
    found = [shortest_path(lake.reset(seed=seed)[0]) for seed in range(first, first + count)]
    steps = np.array([length for length, _, _ in found])
    print(f"FrozenLake: seeds {first}-{first + count - 1}: shortest path {steps.mean():.2f} "
          f"steps on average ({steps.min()} to {steps.max()}), start top-left "
          f"{np.mean([start == (0, 0) for _, start, _ in found]):.1%}, goal bottom-right "
          f"{np.mean([goal == (3, 3) for _, _, goal in found]):.1%}")
