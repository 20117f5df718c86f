"""Uniform random actions, seeded per episode and member (reproducible, members differ)."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from typing import Any

from gymnasium import spaces

from producers.policies.protocol import StepContext


class RandomPolicy:
    """Samples the env's action space with the member's own generator; no model, no text.

    `latency_s` > 0 waits per action, as a model server would (without blocking the other
    envs of the producer): `latency_s * exp(latency_sigma * z)` with z standard normal, a
    lognormal tail like LLM decoding lengths. The latency has its own generator per
    (episode, member), so the actions are exactly those drawn without latency.
    """

    def __init__(self, latency_s: float = 0.0, latency_sigma: float = 0.0):
        self.latency_s = latency_s
        self.latency_sigma = latency_sigma
        # the fast path, decided once: no latency to simulate, and `act` not overridden (a
        # subclass that overrides `act` gets `act`: the fast path would skip its override)
        self._now = latency_s <= 0 and type(self).act is RandomPolicy.act

    def act_now(self, observation: Any, ctx: StepContext) -> tuple[Any, str | None] | None:
        """The action without an await (no latency to simulate), else None: use `act`."""
        return self._sample(ctx) if self._now else None

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, str | None]:
        if self.latency_s > 0:
            await asyncio.sleep(self.latency(ctx))
        return self._sample(ctx)

    def latency(self, ctx: StepContext) -> float:
        """The next action's latency, from the (episode, member)'s own latency stream."""
        if self.latency_sigma == 0:
            return self.latency_s
        stream = ctx.scratch.get("latency")
        if stream is None:
            stream = ctx.scratch["latency"] = random.Random(
                (ctx.seed * 1_000_003 + ctx.member) ^ 0x5DEECE66D)
        return self.latency_s * math.exp(self.latency_sigma * stream.gauss(0.0, 1.0))

    def _sample(self, ctx: StepContext) -> tuple[Any, str | None]:
        draw = ctx.scratch.get("draw")
        if draw is None:
            draw = ctx.scratch["draw"] = self._sampler(ctx)
        return draw()

    @staticmethod
    def _sampler(ctx: StepContext) -> Callable[[], tuple[Any, None]]:
        """How this (episode, member) draws its (action, no response) pairs, worked out once
        per episode. A `Discrete` space draws from the member's own `random.Random`, seeded
        by (episode seed, member): reproducible, and ~8x cheaper per draw than a numpy
        generator call; any other space samples itself, reseeded from the member's numpy
        generator."""
        space = ctx.env.action_space
        if isinstance(space, spaces.Discrete):
            start, n = int(space.start), int(space.n)
            randrange = random.Random(ctx.seed * 1_000_003 + ctx.member).randrange
            return lambda: (start + randrange(n), None)
        rng = ctx.rng

        def sample() -> tuple[Any, None]:
            space.seed(int(rng.integers(2**31)))
            return space.sample(), None

        return sample
