"""rollstream schemas: the contract between producers and consumer.

Config models, the trajectory wire format, the Redis key layout, episode seeds and the
admission/expiry schedule live here once; producers and consumer both import them.
"""

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

__all__ = [
    "SCHEMA_VERSION",
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
    "Sampling",
    "SamplingConfig",
    "Schedule",
    "StepExhausted",
    "TagSpec",
    "decode_trajectory",
    "encode_trajectory",
    "episode_seed",
]
