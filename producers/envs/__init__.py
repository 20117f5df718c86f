"""Environments: our text envs, registered with gymnasium, and the env factory.

Importing this package registers `rollstream/Sokoban-v0`, `rollstream/FrozenLake-v0`,
`rollstream/SokobanNative-v0` and `rollstream/Gem-v0` (idempotent). A tag's env is built from
its spec: its `env_id` (any registered gymnasium id), or ROLL's `env_type`, which
`type_target` maps to the registered id that builds it (the one map from ROLL's env types to
constructors: `sokoban`, `frozen_lake`, `sokoban_native_env` by name, every gem env type
through `rollstream/Gem-v0`). Our own envs get a text observation, `instruction`,
`parse_action` and `step_text` for LLM agents.
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
from schemas.envspec import (
    ENV_TYPE_IDS,
    FROZENLAKE_ID,
    OPENENV_ID,
    SOKOBAN_ID,
    SOKOBAN_NATIVE_ID,
    EnvSpec,
)
from schemas.envtypes import env_type_support, is_gem_type
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
    "type_target",
]

_ENTRY_POINTS = {
    SOKOBAN_ID: "producers.envs.sokoban:SokobanEnv",
    FROZENLAKE_ID: "producers.envs.frozenlake:FrozenLakeEnv",
    SOKOBAN_NATIVE_ID: "producers.envs.sokoban_native:SokobanNativeEnv",
    GEM_ID: "producers.envs.roll_tasks:make_gem_env",  # ROLL's gem env types (`task` kwarg)
    OPENENV_ID: "producers.envs.openenv:OpenEnvEnv",  # env_type openenv (remote servers)
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


def type_target(env_type: str) -> tuple[str, dict[str, Any]] | None:
    """The registered id that builds ROLL's `env_type`, and the kwargs it adds; None for an
    env type the factory cannot build. Our own names (`schemas.envspec.ENV_TYPE_IDS`) by name;
    every gem env type (`schemas.envtypes.is_gem_type`: `game:`, `rg:`, `math:`, `qa:`,
    `logic:`, `eval:`, `code:`, `roll_math`, `roll_qa`, `roll_code`) through `GEM_ID`, its
    `task` the env type as written (GEM's ids are case-sensitive, as in ROLL's gem.make)."""
    own = ENV_TYPE_IDS.get(env_type.lower())
    if own is not None:
        return own, {}
    if is_gem_type(env_type):
        return GEM_ID, {"task": env_type}
    return None


def _target(spec: EnvSpec) -> tuple[str, dict[str, Any]]:
    """The id a spec's env is built as and the kwargs its env type adds; a `ConfigError` for
    an env type the factory cannot build (one the config accepts as pending)."""
    if spec.env_id:
        return spec.env_id, {}
    env_type = spec.env_type or ""
    target = type_target(env_type)
    if target is None:
        support = env_type_support(env_type)
        raise ConfigError(f"not run by producers yet ({support.kind}): needs "
                          f"{support.what or 'an env factory entry'}")
    return target


def env_kwargs(spec: EnvSpec) -> dict[str, Any]:
    """The kwargs `make_env` gets for a tag: its `env_config` (and, for a gem env type, the
    `task`), with the tag's `max_steps` as the step budget (our envs' `max_steps`, any other
    env's `max_episode_steps` time limit; the smaller one when `env_config` sets it too, as
    ROLL stops an episode at either)."""
    env_id, extra = _target(spec)
    kwargs = {**spec.env_config, **extra}
    if spec.max_steps is not None:
        key = "max_steps" if env_id in _ENTRY_POINTS else "max_episode_steps"
        given = kwargs.get(key)
        kwargs[key] = spec.max_steps if given is None else min(int(given), spec.max_steps)
    return kwargs


def build_env(config: RolloutConfig, tag: str) -> gym.Env:
    """The env of a config tag; a failure is a `ConfigError` naming the tag and the cause
    (one line: a missing package, dataset or corpus says what to install or fetch)."""
    spec = config.env_spec(tag)
    try:
        env_id, _ = _target(spec)
        env = make_env(env_id, env_kwargs(spec))
    except ConfigError as exc:  # our envs' own one-line refusals
        raise ConfigError(f"custom_envs.{tag}: {_what(spec)}: {exc}") from exc
    except Exception as exc:  # an env's own constructor may raise anything
        raise ConfigError(f"custom_envs.{tag}: cannot make {_what(spec)} with env_config "
                          f"{spec.env_config}: {type(exc).__name__}: {exc}") from exc
    prompt = spec.agent_prompt
    if prompt.manager == "agent_native" and not callable(
            getattr(env.unwrapped, "user_prompt", None)):
        env.close()
        raise ConfigError(f"custom_envs.{tag}: env manager AgentNativeStepEnvManager needs an "
                          f"env that gives its own chat messages (sokoban_native_env); "
                          f"{_what(spec)} does not")
    # the tag's templates, env manager and token budget, for LLM policies (StepContext.env
    # carries them)
    env.unwrapped.agent_prompt = prompt  # type: ignore[attr-defined]
    if spec.tools is not None:  # the tag's tools (producers/tools/loop.py)
        env.unwrapped.tool_spec = spec.tools  # type: ignore[attr-defined]
    return env


def _what(spec: EnvSpec) -> str:
    """The env a spec names, for messages: its env type as written, else its id."""
    if spec.env_type:
        return f"env type {spec.env_type!r}"
    return repr(spec.env_id)


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
