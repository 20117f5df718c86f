"""The env factory builds every env type rollstream has by ROLL's `env_type` (the config
keeps `env_id` empty for ROLL's types); what one cannot build is one line naming the tag."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers import small_config

from producers.envs import SokobanNativeEnv, build_env, check_envs, env_kwargs, type_target
from producers.envs.frozenlake import FrozenLakeEnv
from producers.envs.roll_tasks import GEM_ID
from producers.envs.sokoban import SokobanEnv
from schemas.envspec import FROZENLAKE_ID, OPENENV_ID, SOKOBAN_ID, SOKOBAN_NATIVE_ID
from schemas.errors import ConfigError

QA = Path(__file__).parent / "data" / "gem" / "qa.jsonl"
needs_gem = pytest.mark.skipif(importlib.util.find_spec("gem") is None,
                               reason="the gem extra (gem-llm) is not installed")
needs_rg = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None,
                              reason="the reasoning extra (reasoning-gym) is not installed")


def tagged(entry: dict, **manager) -> object:
    return small_config(custom_envs={"T": entry},
                        train_env_manager={"tags": ["T"], **manager}, val_env_manager=None)


@pytest.mark.parametrize(("env_type", "target"), [
    ("sokoban", (SOKOBAN_ID, {})), ("frozen_lake", (FROZENLAKE_ID, {})),
    ("sokoban_native_env", (SOKOBAN_NATIVE_ID, {})),
    ("game:GuessTheNumber-v0", (GEM_ID, {"task": "game:GuessTheNumber-v0"})),
    ("rg:letter_counting", (GEM_ID, {"task": "rg:letter_counting"})),
    ("roll_math", (GEM_ID, {"task": "roll_math"})),
    ("eval:AIME24", (GEM_ID, {"task": "eval:AIME24"})),
    ("openenv", (OPENENV_ID, {})), ("webshop", None),
])
def test_one_map_from_env_type_to_what_builds_it(env_type, target) -> None:
    assert type_target(env_type) == target


@pytest.mark.parametrize(("entry", "kind"), [
    ({"env_type": "sokoban", "env_config": {"dim_room": [5, 5], "num_boxes": 1}}, SokobanEnv),
    ({"env_type": "frozen_lake"}, FrozenLakeEnv),
    ({"env_type": "sokoban_native_env"}, SokobanNativeEnv),
])
def test_rolls_grid_env_types_build_by_env_type(entry, kind) -> None:
    env = build_env(tagged(entry), "T")
    assert isinstance(env.unwrapped, kind)
    env.reset(seed=1)


def test_a_gem_env_type_builds_by_env_type_with_the_tags_step_budget() -> None:
    """The config keeps env_id empty; the factory passes the env type as the task."""
    config = tagged({"env_type": "roll_qa", "max_steps": 3,
                     "env_config": {"dataset_name": str(QA), "question_key": "question"}})
    spec = config.env_spec("T")
    assert spec.env_id == ""
    assert env_kwargs(spec) == {"dataset_name": str(QA), "question_key": "question",
                                "task": "roll_qa", "max_steps": 3}
    env = build_env(config, "T")
    obs, _ = env.reset(seed=0)
    assert "Red Planet" in obs or "Hamlet" in obs or obs  # an item of the dataset
    assert type(env.unwrapped).__name__ == "ProblemEnv"


@needs_gem
def test_a_gem_game_builds_by_env_type() -> None:
    config = tagged({"env_type": "game:GuessTheNumber-v0", "max_steps": 4,
                     "env_config": {"min_number": 1, "max_number": 20, "max_turns": 4}})
    env = build_env(config, "T")
    obs, info = env.reset(seed=3)
    assert "guess" in obs.lower() and "suffix" in info


@needs_rg
def test_a_reasoning_gym_task_builds_by_env_type() -> None:
    env = build_env(tagged({"env_type": "rg:letter_counting", "env_config": {"size": 5}}), "T")
    obs, _ = env.reset(seed=0)
    assert obs.startswith("How many times does the letter")


def test_what_an_env_type_needs_is_one_line_naming_the_tag() -> None:
    config = tagged({"env_type": "roll_math",
                     "env_config": {"dataset_name": "nobody/NoSuchDataset"}})
    with pytest.raises(ConfigError) as info:
        check_envs(config)
    message = str(info.value)
    assert message.startswith("custom_envs.T: env type 'roll_math': roll_math needs the "
                              "dataset 'nobody/NoSuchDataset' on disk")
    assert "\n" not in message


def test_an_openenv_tag_without_servers_is_one_line() -> None:
    config = tagged({"env_type": "openenv"})
    with pytest.raises(ConfigError) as info:
        build_env(config, "T")
    assert str(info.value).startswith("custom_envs.T: cannot make env type 'openenv'")
    assert "env_config.base_urls must list the OpenEnv env servers" in str(info.value)
    assert "\n" not in str(info.value)


def test_agent_native_needs_an_env_with_its_own_chat() -> None:
    """ROLL's AgentNativeStepEnvManager sends the env's messages: a plain Sokoban has none."""
    native = "roll.pipeline.agentic.env_manager.agent_native_env_manager." \
             "AgentNativeStepEnvManager"
    with pytest.raises(ConfigError, match="custom_envs.T: env manager AgentNativeStepEnv"
                                          "Manager needs an env that gives its own chat "
                                          "messages \\(sokoban_native_env\\); env type "
                                          "'sokoban' does not"):
        build_env(tagged({"env_type": "sokoban", "env_manager_cls": native}), "T")
    env = build_env(tagged({"env_type": "sokoban_native_env", "env_manager_cls": native}), "T")
    assert env.unwrapped.agent_prompt.manager == "agent_native"
