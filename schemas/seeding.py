"""Episode seeds: every member of a group plays episode k with the same seed.

Seeds come from numpy's `SeedSequence` over (config seed, mode, group, episode), so a run is
reproducible from the config seed alone and independent streams never collide.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

MODE_INDEX = {"train": 0, "val": 1}


@lru_cache(maxsize=65536)  # the members of a group ask for the same seed
def episode_seed(seed: int, mode: str, group_id: int, episode_id: int) -> int:
    """The env reset seed of episode `episode_id` of group `group_id` (a 63-bit int)."""
    entropy = [int(seed) & 0xFFFFFFFFFFFFFFFF, MODE_INDEX[mode], int(group_id), int(episode_id)]
    state = np.random.SeedSequence(entropy).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


def member_seed(episode_seed_value: int, member: int) -> list[int]:
    """Entropy for a member's own randomness (e.g. a random policy) within an episode.

    Members share the env seed but act independently, as GRPO needs distinct samples.
    """
    return [episode_seed_value, int(member)]
