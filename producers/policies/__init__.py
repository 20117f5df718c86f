"""Policies: what picks the next action. Built from the config by `make_policy`."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from schemas.config import PolicyConfig


class Policy(Protocol):
    """`act` returns (action, response): the env action and the raw model text, if any."""

    async def act(
        self, observation: Any, env: Any, rng: np.random.Generator, version: int
    ) -> tuple[Any, str | None]: ...


def make_policy(config: PolicyConfig) -> Policy:
    from producers.policies.random import RandomPolicy

    factories = {"random": RandomPolicy}
    return factories[config.type]()
