"""Policies: what picks the next action. `make_policy` builds the one a config names.

The protocol a policy follows (`act`, optionally `act_now`, `start`, `close`, `set_weights`)
and what it is given (`StepContext`, `Turn`, `PolicyContext`) live in
`producers.policies.protocol`, which the policies import; they are re-exported here, so
`from producers.policies import StepContext, Turn` keeps working for a user's own policy.
"""

from __future__ import annotations

from producers.policies.protocol import (
    Policy,
    PolicyContext,
    StepContext,
    Turn,
    one_line,
    start_policy,
)
from schemas.policy import PolicyConfig

__all__ = ["Policy", "PolicyContext", "StepContext", "Turn", "make_policy", "one_line",
           "start_policy"]


def make_policy(config: PolicyConfig) -> Policy:
    """The policy a config names; `PolicyError` (one line) when it cannot be built."""
    if config.type == "random":
        from producers.policies.random import RandomPolicy

        return RandomPolicy(latency_s=config.latency_s, latency_sigma=config.latency_sigma)
    if config.type == "openai":
        from producers.policies.openai import OpenAIPolicy

        return OpenAIPolicy(config)
    if config.type == "python":
        from producers.policies.python import load_python_policy

        policy = load_python_policy(config)
        if config.llm is None:
            return policy
        from producers.policies.agent import AgentPolicy  # its own agent loop (policy.llm)

        # the block's partial_rollout rules the agent's calls as the openai policy's turns
        return AgentPolicy(policy, config.llm.model_copy(
            update={"partial_rollout": config.partial_rollout}))
    raise ValueError(f"policy.type {config.type!r} has no implementation")
