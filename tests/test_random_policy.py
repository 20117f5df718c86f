"""The random policy's simulated model latency: seeded, lognormal, and apart from the actions."""

from __future__ import annotations

import asyncio
import math

import numpy as np

from producers.envs import make_env
from producers.policies import StepContext
from producers.policies.random import RandomPolicy
from schemas.config import RolloutConfig
from schemas.envspec import FROZENLAKE_ID


def ctx(seed: int, member: int = 0) -> StepContext:
    env = make_env(FROZENLAKE_ID, {"size": 4, "p": 0.8, "is_slippery": False, "max_steps": 10})
    return StepContext(env=env, seed=seed, version=0, mode="train", group_id=0, episode_id=0,
                       member=member, tag="FrozenLake")


def test_latency_is_lognormal_with_the_configured_median_and_tail():
    policy = RandomPolicy(latency_s=0.02, latency_sigma=1.0)
    draws = np.array([policy.latency(ctx(seed, member)) for seed in range(2000)
                      for member in range(4) for _ in range(3)])
    assert abs(np.median(draws) / 0.02 - 1) < 0.05
    # z > 1.645 in 5% of draws: latency_s * e^1.645 ~ 5.2x the median
    tail = float(np.mean(draws > 0.02 * math.exp(1.645)))
    assert 0.04 < tail < 0.06
    logs = np.log(draws / 0.02)
    assert abs(logs.std() - 1.0) < 0.03


def test_latency_is_seeded_per_episode_and_member():
    policy = RandomPolicy(latency_s=0.01, latency_sigma=0.5)
    first, again, other = ctx(7), ctx(7), ctx(7, member=1)
    seq = [policy.latency(first) for _ in range(5)]
    assert seq == [policy.latency(again) for _ in range(5)]
    assert seq != [policy.latency(other) for _ in range(5)]
    assert len(set(seq)) == 5


def test_no_sigma_means_a_fixed_latency():
    policy = RandomPolicy(latency_s=0.01)
    assert {policy.latency(ctx(s)) for s in range(20)} == {0.01}


def test_latency_does_not_change_the_actions():
    slow = RandomPolicy(latency_s=1e-4, latency_sigma=1.0)
    fast = RandomPolicy()

    async def actions(policy: RandomPolicy, context: StepContext) -> list[int]:
        return [(await policy.act(None, context))[0] for _ in range(20)]

    for seed in range(5):
        assert asyncio.run(actions(slow, ctx(seed))) == asyncio.run(actions(fast, ctx(seed)))


def test_the_config_takes_latency_sigma():
    config = RolloutConfig.from_dict({
        "policy": {"type": "random", "latency_s": 0.02, "latency_sigma": 1.0},
        "train_env_manager": {"max_env_num_per_worker": 4, "num_env_groups": 1,
                              "group_size": 4, "tags": ["FrozenLake"]}})
    assert config.policy.latency_sigma == 1.0
