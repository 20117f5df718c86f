"""Uniform random actions, seeded per episode and member (reproducible, members differ)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces


class RandomPolicy:
    """Samples the env's action space with the member's own generator; no model, no text."""

    async def act(
        self, observation: Any, env: Any, rng: np.random.Generator, version: int
    ) -> tuple[Any, str | None]:
        space = env.action_space
        if isinstance(space, spaces.Discrete):
            return int(space.start + rng.integers(space.n)), None
        space.seed(int(rng.integers(2**31)))
        return space.sample(), None
