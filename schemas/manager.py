"""ROLL's EnvManagerConfig: how many envs, in which groups, of which tags, and which of a
step's groups are filtered out before a batch.

Layout of one env manager (train or val), with M = group_size + group_size_redundancy:
env ids are contiguous per tag in the order of `tags`, group `g` holds envs `g*M .. g*M+M-1`,
and shard (one ROLL worker) `s` holds envs `s*max_env_num_per_worker ..`.
"""

from __future__ import annotations

import math
import re
from functools import cached_property
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)

# bounds that keep a typo (an extra zero or three) from building millions of streams and env
# slots before anything fails: far above what one run's Redis, batcher and producers serve
MAX_GROUPS = 65_536
MAX_ENVS = 1_048_576

# ROLL's default group_filter_cls (roll/pipeline/agentic/agentic_pipeline.py): keeps every
# group, so it means no filter
ROLL_DEFAULT_GROUP_FILTER = "roll.pipeline.agentic.agentic_pipeline.GroupFilter"
_CLASS_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*([.:][A-Za-z_][\w]*)")


class StdFilterArgs(BaseModel):
    """`std_filter`'s arguments (ROLL's RLVR `query_filter_config.filter_args`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    std_threshold: NonNegativeFloat = Field(
        default=0.0, description="a group whose episode scores have a standard deviation at "
        "most this is dropped; 0: only groups whose scores all agree")


class GroupFilterConfig(BaseModel):
    """The built-in group filter, in the shape of ROLL's `RewardFilterConfig`
    (roll/pipeline/rlvr/rlvr_config.py, used by its RLVR `query_filter`): `no_filter`, or
    `std_filter` to drop a group whose episode scores (sum of rewards) have a sample standard
    deviation (n - 1, as torch.std) at most `filter_args.std_threshold`. With the default 0,
    a group whose rewards all agree is dropped: it has no GRPO signal (DAPO's dynamic sampling).
    A group of one trajectory is never dropped (ROLL's query_filter keeps it too).
    `no_filter` ignores `filter_args`, as ROLL's does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["no_filter", "std_filter"] = "no_filter"
    filter_args: StdFilterArgs = Field(default_factory=StdFilterArgs)

    @property
    def active(self) -> bool:
        return self.type != "no_filter"


class EnvManagerConfig(BaseModel):
    """ROLL's EnvManagerConfig: how many envs, in which groups, of which tags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_env_num_per_worker: NonNegativeInt = Field(
        default=0, description="envs per shard (one ROLL worker); 0: all envs in one shard, as "
        "ROLL's EnvManagerConfig does")
    num_env_groups: PositiveInt
    group_size: PositiveInt
    tags: list[str] = Field(min_length=1)
    num_groups_partition: list[PositiveInt] | None = None
    group_size_redundancy: NonNegativeInt = 0
    group_filter_cls: str | None = Field(
        default=None, description="a group filter class by import path (pkg.module.Class or "
        "pkg.module:Class): Class(config, env_manager_config, mode).filter(group_id, "
        "episode_id, group) returns True to drop a complete group (ROLL's interface; group: "
        "its trajectories)")
    group_filter_config: GroupFilterConfig = Field(
        default_factory=GroupFilterConfig, description="the built-in filter: std_filter drops "
        "groups whose rewards all agree")

    @field_validator("group_filter_cls", mode="before")
    @classmethod
    def _filter_class(cls, value: Any) -> Any:
        if value is None or value == ROLL_DEFAULT_GROUP_FILTER:
            return None
        if not isinstance(value, str) or not _CLASS_PATH.fullmatch(value):
            raise ValueError(f"{value!r} is not an import path (pkg.module.Class or "
                             "pkg.module:Class)")
        if value.startswith("roll."):
            raise ValueError(f"{value!r} is ROLL's own class, written for ROLL's DataProto "
                             "groups: write a filter of rollstream trajectories with the same "
                             "interface, or use group_filter_config")
        return value

    @model_validator(mode="after")
    def _check_partition(self) -> EnvManagerConfig:
        if self.max_env_num_per_worker == 0:  # ROLL: every env in one worker
            object.__setattr__(self, "max_env_num_per_worker", self.num_envs)
        if self.num_env_groups > MAX_GROUPS:
            raise ValueError(f"num_env_groups {self.num_env_groups:,} is more than {MAX_GROUPS:,} "
                             "(each group is a Redis stream, all read by one XREADGROUP)")
        if self.num_envs > MAX_ENVS:
            raise ValueError(f"{self.num_envs:,} envs (num_env_groups x (group_size + "
                             f"group_size_redundancy)) is more than {MAX_ENVS:,}")
        part = self.num_groups_partition
        if part is None:
            return self
        if len(part) != len(self.tags):
            raise ValueError(
                f"num_groups_partition has {len(part)} entries but tags has {len(self.tags)}"
            )
        if sum(part) != self.num_env_groups:
            raise ValueError(
                f"num_groups_partition sums to {sum(part)}, not num_env_groups "
                f"{self.num_env_groups}"
            )
        return self

    # -- layout ---------------------------------------------------------------------------
    @property
    def members(self) -> int:
        """Envs per group: the group size plus the redundant members."""
        return self.group_size + self.group_size_redundancy

    @property
    def num_envs(self) -> int:
        return self.num_env_groups * self.members

    @property
    def num_shards(self) -> int:
        return math.ceil(self.num_envs / self.max_env_num_per_worker)

    @cached_property
    def partition(self) -> list[int]:
        """Groups per tag; missing partition: an even split, the remainder to the first tags."""
        if self.num_groups_partition is not None:
            return list(self.num_groups_partition)
        base, extra = divmod(self.num_env_groups, len(self.tags))
        return [base + (1 if i < extra else 0) for i in range(len(self.tags))]

    @cached_property
    def tag_ranges(self) -> dict[str, tuple[int, int]]:
        """Tag -> [first group, end group). A tag named twice gets its first range."""
        ranges: dict[str, tuple[int, int]] = {}
        start = 0
        for tag, count in zip(self.tags, self.partition, strict=True):
            ranges.setdefault(tag, (start, start + count))
            start += count
        return ranges

    @cached_property
    def _group_tags(self) -> list[str]:
        pairs = zip(self.tags, self.partition, strict=True)
        return [tag for tag, count in pairs for _ in range(count)]

    def tag_of_group(self, group_id: int) -> str:
        return self._group_tags[group_id]

    def group_of_env(self, env_id: int) -> int:
        return env_id // self.members

    def member_of_env(self, env_id: int) -> int:
        return env_id % self.members

    def envs_of_shard(self, shard: int) -> range:
        start = shard * self.max_env_num_per_worker
        return range(start, min(start + self.max_env_num_per_worker, self.num_envs))

    def summary(self) -> dict[str, Any]:
        """The layout as `rollstream config check --json` prints it."""
        return {
            "envs": self.num_envs,
            "groups": self.num_env_groups,
            "shards": self.num_shards,
            "group_size": self.group_size,
            "tags": {tag: list(span) for tag, span in self.tag_ranges.items()},
        }
