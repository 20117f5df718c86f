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
        ("<answer>Up<|im_end|></answer>", 0),  # ROLL removes its special tokens first
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


@pytest.mark.parametrize(("pattern", "reply", "expected"), [
    (r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", "<think>Up</think><answer>Left</answer>",
     2),
    # more than two groups: the second is the action, as ROLL reads it
    (r"(<think>)(.*?)</think>(.*)", "<think>Down</think> whatever", 1),
    (r"<answer>(.*?)</answer>", "<answer><|im_start|>Right</answer>", 3),
])
def test_parse_answer_takes_the_group_roll_takes(pattern: str, reply: str,
                                                  expected: int) -> None:
    import re

    assert parse_answer(reply, SOKOBAN_NAMES, re.compile(pattern, re.DOTALL)) == expected


def test_special_token_list_from_env_config() -> None:
    env = make_tag("SimpleSokoban", special_token_list=["<eos>"]).unwrapped
    assert env.parse_action("<answer>Up<eos></answer>") == 0
    assert env.parse_action("<answer>Up<|im_end|></answer>") is None  # only the ones given
    with pytest.raises(ValueError, match="special_token_list must be a list of non-empty"):
        make_tag("SimpleSokoban", special_token_list=[""])  # "" would do nothing, silently


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
    """ROLL's no-op: FrozenLake pays the format penalty; Sokoban steps its no-op action
    (-0.1) and adds the penalty (-0.15). At max_steps ROLL's Sokoban says terminated only,
    its FrozenLake episode ends terminated and truncated (its env manager ends it)."""
    env = make_tag(tag, max_steps=3)
    text, _ = env.reset(seed=7)
    lake = "FrozenLake" in tag
    assert env.unwrapped.format_penalty == (-0.01 if lake else -0.15)
    for step, reply in enumerate(["no tag here", "<answer>fly</answer>", "<answer></answer>"]):
        obs, reward, terminated, truncated, info = env.unwrapped.step_text(reply)
        assert obs == text and env.render() == text
        assert reward == pytest.approx(-0.01 if lake else -0.25)
        assert terminated == (step == 2) and truncated == (lake and step == 2)
        assert info["action_is_valid"] is False and info["action_is_effective"] is False
        assert info["success"] is False


@pytest.mark.parametrize("action", [None, 4, -1, 1.0, "Up", np.array([1])])
def test_step_outside_the_action_space_is_a_penalised_no_op(action: object) -> None:
    env = make_tag("SimpleSokoban")
    text, _ = env.reset(seed=3)
    obs, reward, terminated, _, info = env.step(action)
    assert (obs, terminated) == (text, False) and reward == pytest.approx(-0.25)
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
    """ROLL's layout: the rules (with the answer format), then each symbol and each action
    under its heading line."""
    env = make_tag(tag).unwrapped
    rules, symbols_head, symbols, actions_head, actions = env.instruction.split("\n")
    assert rules.endswith(("format is <answer>Right</answer>",
                           "format is <answer>Right</answer>."))
    assert symbols_head == "The meaning of each symbol in the state is:"
    assert [item.split(": ")[0] for item in symbols.split(", ")] == list(env.vocab.values())
    assert actions_head == "Your available actions are:"
    assert actions.split(", ") == list(env.action_names)


def test_env_instruction_replaces_rolls_rules_only() -> None:
    env = make_tag("SimpleSokoban", env_instruction="Push the box.").unwrapped
    assert env.instruction.startswith("Push the box.\nThe meaning of each symbol")
    assert env.instruction.endswith("Your available actions are:\nUp, Down, Left, Right")


def test_grid_vocab_is_the_whole_list_the_agent_is_told() -> None:
    """As in ROLL, `grid_vocab` replaces the symbol list: only its entries, in its order."""
    env = make_tag("SimpleSokoban", grid_vocab={"P": "you", "X": "a crate"}).unwrapped
    assert "\nP: you, X: a crate\n" in env.instruction
    assert "#: wall" not in env.instruction


def test_observation_space_charset_is_the_vocab() -> None:
    env = make_tag("SokobanDifferentGridVocab")
    text, _ = env.reset(seed=0)
    assert text in env.observation_space
    assert "#" not in env.observation_space.character_set
    assert text.replace("W", "#") not in env.observation_space
