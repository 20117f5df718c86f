"""The text interface of the grid envs: answer parsing, no-op replies, instructions."""

from __future__ import annotations

import numpy as np
import pytest

from producers.envs import make_env, parse_answer
from schemas.envspec import DEFAULT_CUSTOM_ENVS

SOKOBAN_NAMES = ("Up", "Down", "Left", "Right")


def make_tag(tag: str, **overrides):
    spec = DEFAULT_CUSTOM_ENVS[tag]
    return make_env(spec["env_id"], {**spec["env_config"], **overrides})


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<answer>Up</answer>", 0),
        ("<answer>right</answer>", 3),
        ("<answer>LEFT</answer>", 2),
        ("<answer>  Down \n</answer>", 1),
        ("<answer>\nUp\n</answer>", 0),
        ("I think <answer>Left</answer> then <answer>Right</answer>", 2),
        ("<|im_start|>assistant\nthinking... <answer> up </answer><|im_end|>", 0),
        ("<think>go <b>down</b></think><answer>Down</answer>", 1),
        ("Up", None),
        ("", None),
        ("<answer></answer>", None),
        ("<answer>   </answer>", None),
        ("<answer>Jump</answer>", None),
        ("<answer>Up Left</answer>", None),
        ("<answer>Up", None),
        ("<answer><answer>Up</answer>", None),  # the first tag's text is "<answer>Up"
        ("<ANSWER>Up</ANSWER>", None),  # the tag itself is case-sensitive, as in ROLL
    ],
)
def test_parse_answer(reply: str, expected: int | None) -> None:
    assert parse_answer(reply, SOKOBAN_NAMES) == expected


def test_parse_answer_refuses_non_text() -> None:
    assert parse_answer(None, SOKOBAN_NAMES) is None
    assert parse_answer(b"<answer>Up</answer>", SOKOBAN_NAMES) is None


@pytest.mark.parametrize("tag", list(DEFAULT_CUSTOM_ENVS))
def test_env_parse_action_uses_its_own_names(tag: str) -> None:
    env = make_tag(tag).unwrapped
    for index, name in enumerate(env.action_names):
        assert env.parse_action(f"<answer>{name.lower()}</answer>") == index
    assert env.parse_action("<answer>north</answer>") is None


@pytest.mark.parametrize("tag", list(DEFAULT_CUSTOM_ENVS))
def test_unparsable_reply_is_a_penalised_no_op(tag: str) -> None:
    env = make_tag(tag, max_steps=3)
    text, _ = env.reset(seed=7)
    penalty = env.unwrapped.format_penalty
    expected_penalty = -0.01 if "FrozenLake" in tag else -0.15
    assert penalty == expected_penalty
    for step, reply in enumerate(["no tag here", "<answer>fly</answer>", "<answer></answer>"]):
        obs, reward, terminated, truncated, info = env.unwrapped.step_text(reply)
        assert obs == text and env.render() == text
        assert reward == penalty
        assert terminated is False and truncated == (step == 2)
        assert info["action_is_valid"] is False and info["action_is_effective"] is False
        assert info["success"] is False


@pytest.mark.parametrize("action", [None, 4, -1, 1.0, "Up", np.array([1])])
def test_step_outside_the_action_space_is_a_penalised_no_op(action: object) -> None:
    env = make_tag("SimpleSokoban")
    text, _ = env.reset(seed=3)
    obs, reward, terminated, _, info = env.step(action)
    assert (obs, reward, terminated) == (text, -0.15, False)
    assert info["action_is_valid"] is False


@pytest.mark.parametrize("action", [1, np.int64(1), np.array(1)])
def test_step_takes_python_and_numpy_ints(action: object) -> None:
    env = make_tag("FrozenLake")
    env.reset(seed=0)
    assert env.step(action)[4]["action_is_valid"] is True


@pytest.mark.parametrize("tag", list(DEFAULT_CUSTOM_ENVS))
def test_valid_reply_steps_like_the_action(tag: str) -> None:
    by_text, by_action = make_tag(tag), make_tag(tag)
    by_text.reset(seed=11)
    by_action.reset(seed=11)
    for index, name in enumerate(by_text.unwrapped.action_names * 2):
        got = by_text.unwrapped.step_text(f"Let me think.\n<answer>{name}</answer>")
        want = by_action.step(index % 4)
        assert got[0] == want[0] and got[1] == want[1] and got[4] == want[4]
        assert got[4]["action_is_valid"] is True
        if got[2] or got[3]:
            break


@pytest.mark.parametrize("tag", list(DEFAULT_CUSTOM_ENVS))
def test_instruction_names_symbols_actions_and_format(tag: str) -> None:
    env = make_tag(tag).unwrapped
    text = env.instruction
    for symbol in env.vocab.values():
        assert f"{symbol} = " in text
    for name in env.action_names:
        assert name in text
    assert "<answer>Left</answer>" in text
    assert f"{env.max_steps} steps" in text


def test_observation_space_charset_is_the_vocab() -> None:
    env = make_tag("SokobanDifferentGridVocab")
    text, _ = env.reset(seed=0)
    assert text in env.observation_space
    assert "#" not in env.observation_space.character_set
    assert text.replace("W", "#") not in env.observation_space
