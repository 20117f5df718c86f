"""Policies: what picks the next action. Built from the config by `make_policy`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from schemas.config import PolicyConfig
from schemas.seeding import member_seed


@dataclass
class StepContext:
    """What a policy may look at besides the observation."""

    env: Any  # the gymnasium env (its action_space; `unwrapped.instruction` for text envs)
    seed: int  # the episode's env seed (shared by the group)
    version: int  # the policy version the producer knows now
    mode: str
    group_id: int
    episode_id: int
    member: int
    tag: str
    scratch: dict[str, Any] = field(default_factory=dict)  # the policy's per-episode state
    _rng: np.random.Generator | None = field(default=None, repr=False)

    @property
    def rng(self) -> np.random.Generator:
        """The member's own numpy generator for this episode (made on first use)."""
        if self._rng is None:
            self._rng = np.random.default_rng(member_seed(self.seed, self.member))
        return self._rng


class Policy(Protocol):
    """`act` returns (action, response): the env action and the raw model text, if any.

    With a response and a text env, the env parses the response itself (`step_text`), so a
    malformed answer gets the env's format penalty. A policy may also define
    `act_now(observation, ctx)`, returning the same pair without an await (or None to fall
    back to `act`): a random or numpy policy then costs no coroutine per step.
    """

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, str | None]: ...


def make_policy(config: PolicyConfig) -> Policy:
    from producers.policies.random import RandomPolicy

    if config.type == "random":
        return RandomPolicy(latency_s=config.latency_s)
    raise ValueError(f"policy.type {config.type!r} has no implementation")
