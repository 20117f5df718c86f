"""Uniform random actions, seeded per episode and member (reproducible, members differ)."""

from __future__ import annotations

from typing import Any

from gymnasium import spaces

from producers.policies import StepContext


class RandomPolicy:
    """Samples the env's action space with the member's own generator; no model, no text."""

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, str | None]:
        space = ctx.env.action_space
        if isinstance(space, spaces.Discrete):
            return int(space.start + ctx.rng.integers(space.n)), None
        space.seed(int(ctx.rng.integers(2**31)))
        return space.sample(), None
