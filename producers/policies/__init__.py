"""Policies: what picks the next action. Built from the config by `make_policy`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from schemas.config import PolicyConfig


@dataclass
class StepContext:
    """What a policy may look at besides the observation."""

    env: Any  # the gymnasium env (its action_space; `unwrapped.instruction` for text envs)
    rng: np.random.Generator  # the member's own generator, seeded per episode
    version: int  # the policy version the producer knows now
    mode: str
    group_id: int
    episode_id: int
    member: int
    tag: str


class Policy(Protocol):
    """`act` returns (action, response): the env action and the raw model text, if any.

    With a response and a text env, the env parses the response itself (`step_text`), so a
    malformed answer gets the env's format penalty.
    """

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, str | None]: ...


def make_policy(config: PolicyConfig) -> Policy:
    from producers.policies.random import RandomPolicy

    factories = {"random": RandomPolicy}
    return factories[config.type]()
