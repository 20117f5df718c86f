"""GEM's games (gem-llm) as rollstream envs: ROLL's `game:` env types."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from producers.envs import make_env
from producers.envs.roll_tasks import GEM_ID
from schemas.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gem") is None,
                                reason="the gem extra (gem-llm) is not installed")

GUESS = {"task": "game:GuessTheNumber-v0", "min_number": 1, "max_number": 20, "max_turns": 10}
FORMAT_ERROR_REWARD = -0.1  # gem-llm 0.0.4 LanguageGameReward.format_error_reward


def game(config: dict[str, Any] | None = None, **overrides: Any):
    return make_env(GEM_ID, {**(config or GUESS), **overrides})


def guess(number: int) -> str:
    return f"Let me think. My guess is \\boxed{{{number}}}."


@pytest.mark.parametrize("task", ["game:GuessTheNumber-v0", "game:Mastermind-v0",
                                  "game:Minesweeper-v0", "game:TowerofHanoi-v0"])
def test_check_env_passes(task: str) -> None:
    env = make_env(GEM_ID, {"task": task, "max_steps": 5, "disable_env_checker": False})
    check_env(env.unwrapped)


def test_first_observation_is_the_games_instructions_and_no_separate_instruction() -> None:
    env = game()
    text, info = env.reset(seed=3)
    assert text.startswith("You are playing Guess The Number.")
    assert "between 1 and 20" in text and "within 10 turns" in text
    assert info == {"suffix": "Enter your next guess."}
    assert env.unwrapped.instruction == ""  # ROLL: the task is in the first observation
    assert env.render() == text


def test_the_same_seed_gives_the_game_gem_gives() -> None:
    """Fidelity: the secret number is the one gem.make's own game draws for the seed."""
    from producers.envs.gem import gem_module

    gem = gem_module()
    env = game()
    for seed in [0, 1, 7, 12345, 2**32 - 1]:
        env.reset(seed=seed)
        own = gem.make("game:GuessTheNumber-v0", min_number=1, max_number=20, max_turns=10)
        own.reset(seed=seed)
        assert env.unwrapped.game.game_number == own.game_number


def test_reproducible_by_seed_and_seeds_differ() -> None:
    def secrets(seeds) -> list[int]:
        env = game()
        out = []
        for seed in seeds:
            env.reset(seed=seed)
            out.append(env.unwrapped.game.game_number)
        return out

    seeds = [2**40 + s for s in range(30)]  # episode seeds are 63-bit
    assert secrets(seeds) == secrets(seeds)
    assert len(set(secrets(seeds))) > 5


def play_minesweeper(env, seed: int, moves: list[str]) -> list[tuple]:
    env.reset(seed=seed)
    return [env.step(move)[:4] for move in moves]


def test_envs_in_one_process_do_not_share_random_state() -> None:
    """Minesweeper lays its mines from the process-wide `random` at the first reveal: two
    games played turn about must play as each alone. Without each env's own random state
    (reset seeds the global one) the first game's mines would follow the second's seed."""
    config = {"task": "game:Minesweeper-v0", "rows": 8, "cols": 8, "num_mines": 10}
    moves = ["\\boxed{reveal 0 0}", "\\boxed{reveal 7 7}", "\\boxed{reveal 3 4}"]
    alone = [play_minesweeper(game(config), seed, moves) for seed in (1, 2)]
    first, second = game(config), game(config)
    first.reset(seed=1)
    second.reset(seed=2)
    turns: list[list[tuple]] = [[], []]
    for move in moves:
        turns[0].append(first.step(move)[:4])
        turns[1].append(second.step(move)[:4])
    assert turns == alone
    boards = [first.unwrapped.game.grid, second.unwrapped.game.grid]
    assert boards[0] != boards[1]


def test_a_game_leaves_the_process_random_state_alone() -> None:
    random.seed(99)
    np.random.seed(99)
    expected = (random.random(), np.random.random())
    random.seed(99)
    np.random.seed(99)
    env = game({"task": "game:Minesweeper-v0"})
    env.reset(seed=5)
    env.step("\\boxed{reveal 2 2}")
    assert (random.random(), np.random.random()) == expected


def test_the_right_guess_wins_with_gems_reward_and_ends_the_episode() -> None:
    env = game(max_steps=10)
    env.reset(seed=11)
    secret = env.unwrapped.game.game_number
    text, reward, terminated, truncated, info = env.unwrapped.step_text(guess(secret))
    assert reward == 1.0 and terminated is True and truncated is False
    assert text.startswith("Congratulations!") and info["success"] is True
    assert env.unwrapped.parse_action(guess(secret)) == str(secret)


def test_a_wrong_guess_gets_a_hint_and_goes_on() -> None:
    env = game()
    env.reset(seed=11)
    secret = env.unwrapped.game.game_number
    wrong = 1 if secret != 1 else 2
    text, reward, terminated, truncated, info = env.step(guess(wrong))
    assert reward == 0.0 and not terminated and not truncated and info["success"] is False
    assert re.search(r"target number is (higher|lower) than", text)


@pytest.mark.parametrize("reply", ["I guess 7", "\\boxed{seven}", "", 7, None])
def test_an_unparsable_reply_ends_the_game_with_gems_format_penalty(reply: object) -> None:
    env = game()
    env.reset(seed=4)
    text, reward, terminated, truncated, info = env.step(reply)
    assert reward == FORMAT_ERROR_REWARD and terminated is True and truncated is False
    assert "did not provide a valid guess" in text and info["success"] is False
    if isinstance(reply, str):
        assert env.unwrapped.parse_action(reply) in (None, "seven")


def test_gems_own_last_turn_pays_by_distance() -> None:
    env = game(max_turns=2)
    env.reset(seed=8)
    secret = env.unwrapped.game.game_number
    wrong = [n for n in range(1, 21) if n != secret][:2]
    env.step(guess(wrong[0]))
    _, reward, terminated, truncated, _ = env.step(guess(wrong[1]))
    assert terminated and truncated  # the game's own max_turns: GEM sets both
    assert reward == pytest.approx(1 - abs(wrong[1] - secret) / 19)


def test_rolls_step_budget_ends_the_episode_terminated_and_truncated() -> None:
    """ROLL's env manager ends an episode at max_steps: terminated, and truncated as the
    game did not end itself."""
    env = game(max_steps=2)
    env.reset(seed=8)
    secret = env.unwrapped.game.game_number
    wrong = [n for n in range(1, 21) if n != secret][:2]
    assert env.step(guess(wrong[0]))[2:4] == (False, False)
    assert env.step(guess(wrong[1]))[2:4] == (True, True)
    env.reset(seed=8)
    env.step(guess(wrong[0]))
    assert env.step(guess(secret))[1:4] == (1.0, True, False)  # a win at the budget


def test_an_unknown_game_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as excinfo:
        game(task="game:GuessTheNumbr-v0")
    message = str(excinfo.value)
    assert "\n" not in message and "game:GuessTheNumbr-v0" in message
    assert "did you mean game:GuessTheNumber-v0" in message


def test_bad_game_settings_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="game:Mastermind-v0") as excinfo:
        game({"task": "game:Mastermind-v0", "code_length": 9, "num_numbers": 3})
    assert "\n" not in str(excinfo.value)


def test_importing_gem_leaves_logging_unconfigured() -> None:
    """gem's import calls logging.basicConfig; a fresh process shows it undone."""
    code = ("import logging\n"
            "from producers.envs import make_env\n"
            f"make_env({GEM_ID!r}, {{'task': 'game:Mastermind-v0'}}).reset(seed=0)\n"
            "root = logging.getLogger()\n"
            "print(len(root.handlers), root.level)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=110, check=True)
    assert done.stdout.split() == ["0", str(30)]  # no handler, WARNING


@pytest.mark.parametrize("task", ["game:Wordle-v0", "game:Hangman-v0"])
def test_word_games_are_refused_without_the_corpus_on_disk(task, tmp_path, monkeypatch) -> None:
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(ConfigError) as excinfo:
        game({"task": task})
    message = str(excinfo.value)
    assert "\n" not in message and task in message and "'words' corpus" in message
    assert str(tmp_path) in message and "nltk.downloader words" in message


def test_wordle_reads_a_corpus_on_disk_without_downloading(tmp_path, monkeypatch) -> None:
    import nltk

    words = tmp_path / "corpora" / "words"
    words.mkdir(parents=True)
    (words / "en-basic").write_text("apple\ngrape\nlemon\n")
    (words / "en").write_text("apple\ngrape\nlemon\n")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    calls = []
    monkeypatch.setattr(nltk, "download", lambda *a, **k: calls.append(a) or False)
    monkeypatch.setattr(nltk.corpus, "words", nltk.corpus.reader.WordListCorpusReader(
        str(words), ["en", "en-basic"]))
    import gem.envs.game_env.wordle as wordle

    monkeypatch.setattr(wordle, "words", nltk.corpus.words)
    env = game({"task": "game:Wordle-v0", "word_length": 5})
    env.reset(seed=1)
    secret = env.unwrapped.game.secret_word
    assert secret in {"APPLE", "GRAPE", "LEMON"} and calls == []
    _, reward, terminated, _, info = env.step(f"\\boxed{{{secret}}}")
    assert terminated and info["success"] is True and reward > 0


class BinarySearch:
    """A scripted player that reads GEM's hints and answers in ROLL's format."""

    def __init__(self) -> None:
        self.low, self.high = 1, 20

    async def act(self, observation: str, ctx) -> tuple[Any, str]:
        hint = re.search(r"guessed (\d+), and the target number is (higher|lower)", observation)
        if hint:
            number, direction = int(hint.group(1)), hint.group(2)
            if direction == "higher":
                self.low = number + 1
            else:
                self.high = number - 1
        reply = guess((self.low + self.high) // 2)
        return ctx.env.unwrapped.parse_action(reply), reply


def test_a_producer_episode_plays_the_game_to_a_win_and_encodes() -> None:
    from producers.control import ControlState
    from producers.rollout import EnvSlot, play_episode
    from schemas.codec import decode_trajectory, encode_trajectory

    async def gate() -> bool:
        return True

    slot = EnvSlot(mode="train", env_id=0, group_id=0, member=0, shard=0, tag="Guess",
                   env=game(max_steps=10))
    traj = asyncio.run(play_episode(slot, seed=5, producer_id="p", policy=BinarySearch(),
                                    control=ControlState(), gate=gate))
    assert traj["success"] is True and traj["terminated"] is True
    assert traj["episode_score"] == 1.0 and 1 <= traj["num_actions"] <= 5
    assert traj["steps"][0]["observation"].startswith("You are playing Guess The Number.")
    assert all(step["response"].startswith("Let me think.") for step in traj["steps"])
    decoded = decode_trajectory(encode_trajectory(traj))
    assert decoded["final_observation"] == traj["final_observation"]
