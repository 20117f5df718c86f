"""rollstream schemas: the contract between producers and consumer.

Config models, the trajectory wire format, the Redis key layout, episode seeds and the
admission/expiry schedule live here once; producers and consumer both import them.

The names below are imported on first use (PEP 562 `__getattr__`): importing one module of
the package (`schemas.config`) does not import the others, so the command line starts without
numpy and the wire format when a command needs neither (`docs/decisions/testing.md`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "SCHEMA_VERSION": "codec", "decode_trajectory": "codec", "encode_trajectory": "codec",
    "RolloutConfig": "config", "EnvSpec": "envspec", "BatchTimeout": "errors",
    "ConfigError": "errors", "DecodeError": "errors", "RollstreamError": "errors",
    "StepExhausted": "errors", "Keys": "keys", "EnvManagerConfig": "manager",
    "GroupFilterConfig": "manager", "OpenAIPolicyConfig": "policy", "PolicyConfig": "policy",
    "PythonPolicyConfig": "policy", "RandomPolicyConfig": "policy", "Schedule": "protocol",
    "Sampling": "sampling", "SamplingConfig": "sampling", "episode_seed": "seeding",
    "TagSpec": "tagspec",
}

__all__ = [
    "BatchTimeout",
    "ConfigError",
    "DecodeError",
    "EnvManagerConfig",
    "EnvSpec",
    "GroupFilterConfig",
    "Keys",
    "OpenAIPolicyConfig",
    "PolicyConfig",
    "PythonPolicyConfig",
    "RandomPolicyConfig",
    "RolloutConfig",
    "RollstreamError",
    "SCHEMA_VERSION",
    "Sampling",
    "SamplingConfig",
    "Schedule",
    "StepExhausted",
    "TagSpec",
    "decode_trajectory",
    "encode_trajectory",
    "episode_seed",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'schemas' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"schemas.{module}"), name)
    globals()[name] = value  # once: the next lookup is a plain attribute
    return value


if TYPE_CHECKING:  # what type checkers and readers see
    from schemas.codec import SCHEMA_VERSION, decode_trajectory, encode_trajectory
    from schemas.config import RolloutConfig
    from schemas.envspec import EnvSpec
    from schemas.errors import (
        BatchTimeout,
        ConfigError,
        DecodeError,
        RollstreamError,
        StepExhausted,
    )
    from schemas.keys import Keys
    from schemas.manager import EnvManagerConfig, GroupFilterConfig
    from schemas.policy import (
        OpenAIPolicyConfig,
        PolicyConfig,
        PythonPolicyConfig,
        RandomPolicyConfig,
    )
    from schemas.protocol import Schedule
    from schemas.sampling import Sampling, SamplingConfig
    from schemas.seeding import episode_seed
    from schemas.tagspec import TagSpec
