"""reasoning-gym tasks as rollstream envs: ROLL's `rg:` env types."""

from __future__ import annotations

import importlib.util
import re

import pytest
from gymnasium.utils.env_checker import check_env

from producers.envs import make_env
from producers.envs.roll_tasks import GEM_ID
from producers.envs.task import TERMINAL_STATE
from schemas.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None,
                                reason="the reasoning extra (reasoning-gym) is not installed")

LETTERS = {"task": "rg:letter_counting", "size": 500, "seed": 42}  # ROLL's example config


def task(**overrides):
    return make_env(GEM_ID, {**LETTERS, **overrides})


def boxed(answer: object) -> str:
    return f"Counting carefully... \\boxed{{{answer}}}"


@pytest.mark.parametrize("name", ["rg:letter_counting", "rg:basic_arithmetic", "rg:leg_counting"])
def test_check_env_passes(name: str) -> None:
    check_env(task(task=name, disable_env_checker=False).unwrapped)


def test_the_question_is_an_item_of_reasoning_gyms_own_dataset() -> None:
    import reasoning_gym

    dataset = reasoning_gym.create_dataset("letter_counting", size=500, seed=42)
    questions = {dataset[i]["question"] for i in range(500)}
    env = task()
    seen = set()
    for seed in range(40):
        text, info = env.reset(seed=seed)
        assert text in questions and info == {}
        assert text == env.unwrapped.entry["question"]
        seen.add(text)
    assert len(seen) > 30  # items drawn across the pool, not one


def test_reproducible_by_seed() -> None:
    seeds = [3, 2**62 + 9, 77]
    first = [task().reset(seed=s)[0] for s in seeds]
    env = task()
    assert [env.reset(seed=s)[0] for s in seeds] == first
    assert task(seed=43).reset(seed=3)[0] != first[0] or task(seed=44).reset(seed=3)[0] != first[0]


def test_a_right_answer_scores_one_and_ends_the_episode() -> None:
    env = task(max_steps=10)
    env.reset(seed=5)
    answer = env.unwrapped.entry["answer"]
    obs, reward, terminated, truncated, info = env.unwrapped.step_text(boxed(answer))
    assert (obs, reward, terminated, truncated) == (TERMINAL_STATE, 1.0, True, False)
    assert info == {"success": True, "action_is_valid": True}
    assert env.unwrapped.parse_action(boxed(answer)) == str(answer)


def test_a_wrong_answer_gets_the_datasets_score() -> None:
    env = task()
    env.reset(seed=5)
    entry = env.unwrapped.entry
    wrong = str(int(entry["answer"]) + 1)
    expected = env.unwrapped.dataset.score_answer(answer=wrong, entry=entry)
    obs, reward, terminated, truncated, info = env.step(boxed(wrong))
    assert expected < 1.0 and reward == expected
    assert terminated is True and truncated is False
    assert info == {"success": False, "action_is_valid": True}


@pytest.mark.parametrize("reply", ["the answer is 3", "\\boxed{3", "", None])
def test_an_unparsable_reply_scores_what_reasoning_gym_gives_no_answer(reply) -> None:
    env = task()
    env.reset(seed=5)
    expected = env.unwrapped.dataset.score_answer(answer=None, entry=env.unwrapped.entry)
    _, reward, terminated, _, info = env.step(reply)
    assert reward == expected == 0.0 and terminated is True
    assert info == {"success": False, "action_is_valid": False}


def test_dataset_settings_reach_reasoning_gym() -> None:
    env = task(task="rg:basic_arithmetic", min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    for seed in range(10):
        text, _ = env.reset(seed=seed)
        expression = env.unwrapped.entry["metadata"]["expression"]
        numbers = re.findall(r"\d+", expression)
        assert expression in text and len(numbers) == 2 and all(len(n) == 1 for n in numbers)


def test_an_unknown_task_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as excinfo:
        task(task="rg:leter_counting")
    message = str(excinfo.value)
    assert "\n" not in message and "rg:leter_counting is not a reasoning-gym task" in message
    assert "did you mean rg:letter_counting" in message


@pytest.mark.parametrize(("overrides", "words"), [
    ({"no_such_key": 1}, "no_such_key"),
    ({"size": 0}, "size must be an integer >= 1"),
    ({"seed": "x"}, "seed must be an integer"),
])
def test_bad_settings_are_refused_in_one_line(overrides, words) -> None:
    with pytest.raises(ConfigError) as excinfo:
        task(**overrides)
    assert "\n" not in str(excinfo.value) and words in str(excinfo.value)
