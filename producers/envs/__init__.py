"""Environments: our text grid envs, registered with gymnasium, and the env factory.

Importing this package registers `rollstream/Sokoban-v0`, `rollstream/FrozenLake-v0` and
`rollstream/SokobanNative-v0` (ROLL's env types `sokoban`, `frozen_lake` and
`sokoban_native_env`; idempotent). `make_env` builds any registered gymnasium env from a
tag's spec; our own envs get a text observation, `instruction`, `parse_action` and
`step_text` for LLM agents.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from producers.envs.frozenlake import FrozenLakeEnv
from producers.envs.roll_tasks import GEM_ID
from producers.envs.sokoban import SokobanEnv
from producers.envs.sokoban_native import SokobanNativeEnv
from producers.envs.text import TextGridEnv, parse_answer
from schemas.config import RolloutConfig
from schemas.envspec import FROZENLAKE_ID, SOKOBAN_ID, SOKOBAN_NATIVE_ID, EnvSpec
from schemas.errors import ConfigError

__all__ = [
    "FROZENLAKE_ID",
    "SOKOBAN_ID",
    "SOKOBAN_NATIVE_ID",
    "FrozenLakeEnv",
    "SokobanEnv",
    "SokobanNativeEnv",
    "TextGridEnv",
    "build_env",
    "check_envs",
    "env_kwargs",
    "is_text_env",
    "make_env",
    "parse_answer",
    "register_envs",
]

_ENTRY_POINTS = {
    SOKOBAN_ID: "producers.envs.sokoban:SokobanEnv",
    FROZENLAKE_ID: "producers.envs.frozenlake:FrozenLakeEnv",
    SOKOBAN_NATIVE_ID: "producers.envs.sokoban_native:SokobanNativeEnv",
    GEM_ID: "producers.envs.roll_tasks:make_gem_env",  # ROLL's gem env types (`task` kwarg)
}


def register_envs() -> None:
    """Register our env ids with gymnasium; ids already registered are left alone."""
    for env_id, entry_point in _ENTRY_POINTS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)


def make_env(env_id: str, env_config: dict[str, Any] | None = None) -> gym.Env:
    """Build `gymnasium.make(env_id, **env_config)`; a bad id raises `ValueError` naming it.

    Our text envs default to `render_mode="ansi"` and no passive env checker: the producer
    steps them thousands of times a second, and `check_env` in the tests covers the API.
    """
    register_envs()
    kwargs = dict(env_config or {})
    if env_id in _ENTRY_POINTS:
        kwargs.setdefault("render_mode", "ansi")
        kwargs.setdefault("disable_env_checker", True)
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as exc:
        raise ValueError(f"cannot make env {env_id!r}: {exc}") from exc


def env_kwargs(spec: EnvSpec) -> dict[str, Any]:
    """The kwargs `make_env` gets for a tag: its `env_config`, with the tag's `max_steps` as
    the step budget (our envs' `max_steps`, any other env's `max_episode_steps` time limit;
    the smaller one when `env_config` sets it too, as ROLL stops an episode at either)."""
    kwargs = dict(spec.env_config)
    if spec.max_steps is not None:
        key = "max_steps" if spec.env_id in _ENTRY_POINTS else "max_episode_steps"
        given = kwargs.get(key)
        kwargs[key] = spec.max_steps if given is None else min(int(given), spec.max_steps)
    return kwargs


def build_env(config: RolloutConfig, tag: str) -> gym.Env:
    """The env of a config tag; a failure is a `ConfigError` naming the tag and the cause."""
    spec = config.env_spec(tag)
    try:
        env = make_env(spec.env_id, env_kwargs(spec))
    except Exception as exc:  # an env's own constructor may raise anything
        raise ConfigError(f"custom_envs.{tag}: cannot make {spec.env_id!r} with env_config "
                          f"{spec.env_config}: {type(exc).__name__}: {exc}") from exc
    # the tag's templates and token budget, for LLM policies (StepContext.env carries them)
    env.unwrapped.agent_prompt = spec.agent_prompt  # type: ignore[attr-defined]
    return env


def check_envs(config: RolloutConfig) -> None:
    """Build and reset one env of every tag the config uses: bad env settings fail here,
    with the tag named, rather than in every producer."""
    for mode in config.modes():
        for tag in dict.fromkeys(config.manager(mode).tags):
            env = build_env(config, tag)
            try:
                env.reset(seed=config.seed)
            except Exception as exc:
                raise ConfigError(f"custom_envs.{tag}: reset failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
            finally:
                env.close()


def is_text_env(env: gym.Env) -> bool:
    """Whether the env takes text replies (its unwrapped env has `parse_action`)."""
    return callable(getattr(env.unwrapped, "parse_action", None))


register_envs()
