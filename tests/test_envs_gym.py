"""The env factory: registration, our ids, any gymnasium id, errors, thread safety."""

from __future__ import annotations

import importlib
import warnings
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import numpy as np
import pytest

import producers.envs
from producers.envs import is_text_env, make_env, register_envs
from schemas.envspec import DEFAULT_CUSTOM_ENVS, FROZENLAKE_ID, SOKOBAN_ID, SOKOBAN_NATIVE_ID


def test_registration_is_idempotent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register_envs()
        register_envs()
        importlib.reload(producers.envs)
    assert gym.spec(SOKOBAN_ID).entry_point == "producers.envs.sokoban:SokobanEnv"
    assert gym.spec(FROZENLAKE_ID).entry_point == "producers.envs.frozenlake:FrozenLakeEnv"
    assert gym.spec(SOKOBAN_NATIVE_ID).entry_point == (
        "producers.envs.sokoban_native:SokobanNativeEnv")


@pytest.mark.parametrize("env_id", [SOKOBAN_ID, FROZENLAKE_ID, SOKOBAN_NATIVE_ID])
def test_gymnasium_make_builds_our_envs(env_id: str) -> None:
    env = gym.make(env_id, render_mode="ansi")
    text, _ = env.reset(seed=3)  # a seed whose room comes quickly with Sokoban's defaults
    assert isinstance(text, str) and text == env.render()
    assert env.action_space == gym.spaces.Discrete(4)


@pytest.mark.parametrize("tag", list(DEFAULT_CUSTOM_ENVS))
def test_make_env_for_each_tag(tag: str) -> None:
    spec = DEFAULT_CUSTOM_ENVS[tag]
    env = make_env(spec["env_id"], spec["env_config"])
    assert is_text_env(env)
    assert env.unwrapped.render_mode == "ansi"
    assert env.unwrapped.max_steps == spec["env_config"]["max_steps"]
    # No passive checker wrapper: it costs time on every step.
    assert "PassiveEnvChecker" not in str(env)
    text, _ = env.reset(seed=1)
    assert text in env.observation_space


def test_make_env_does_not_modify_the_config() -> None:
    config = {"size": 5}
    env = make_env(FROZENLAKE_ID, config)
    assert config == {"size": 5}
    assert env.reset(seed=0)[0].count("\n") == 4


def test_make_env_cartpole_has_array_observations() -> None:
    env = make_env("CartPole-v1")
    assert not is_text_env(env)
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.shape == (4,)
    obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
    assert obs in env.observation_space and reward == 1.0
    assert np.array_equal(make_env("CartPole-v1").reset(seed=0)[0], env.reset(seed=0)[0])


@pytest.mark.parametrize("env_id", ["NoSuchEnv-v0", "rollstream/NoSuchEnv-v0", "CartPole-v99"])
def test_make_env_bad_id_names_it(env_id: str) -> None:
    with pytest.raises(ValueError, match=env_id.split("-")[0]) as excinfo:
        make_env(env_id)
    assert repr(env_id) in str(excinfo.value)


def test_resets_in_threads_match_sequential() -> None:
    """Generation uses only the env's own generator, so envs in threads do not interfere."""
    spec = DEFAULT_CUSTOM_ENVS["LargerSokoban"]

    def rooms(offset: int) -> list[str]:
        env = make_env(spec["env_id"], spec["env_config"])
        return [env.reset(seed=offset + i)[0] for i in range(40)]

    expected = [rooms(offset) for offset in range(0, 400, 100)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(rooms, range(0, 400, 100))) == expected
