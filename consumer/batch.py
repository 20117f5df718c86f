"""What the trainer gets: a `Batch` of complete groups, as arrays and as trajectories."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Entry:
    """Where a trajectory sits in Redis: its stream and entry id."""

    stream: str
    entry_id: str


@dataclass
class Batch:
    """Complete groups of one mode, group members adjacent, oldest episode first.

    Arrays are indexed by trajectory; step arrays are padded to the longest trajectory and
    `mask` marks the real steps. `actions` is None when actions are not integers.
    """

    mode: str
    version: int
    trajectories: list[dict[str, Any]]
    entries: list[Entry] = field(repr=False)
    metrics: dict[str, float]
    round: int = 0

    def __post_init__(self) -> None:
        trajs = self.trajectories
        self.traj_ids: list[str] = [t["traj_id"] for t in trajs]
        self.traj_group_ids: list[str] = [t["traj_group_id"] for t in trajs]
        self.group_ids = np.array([t["group_id"] for t in trajs], dtype=np.int64)
        self.episode_ids = np.array([t["episode_id"] for t in trajs], dtype=np.int64)
        self.scores = np.array([t["episode_score"] for t in trajs], dtype=np.float32)
        self.success = np.array([t["success"] for t in trajs], dtype=bool)
        self.num_actions = np.array([t["num_actions"] for t in trajs], dtype=np.int64)
        self.version_start = np.array([t["version_start"] for t in trajs], dtype=np.int64)
        # group_index: 0..groups-1, the index of each trajectory's group within this batch
        _, self.group_index = np.unique(
            np.array([t["traj_group_id"] for t in trajs]), return_inverse=True
        )
        width = int(self.num_actions.max()) if trajs else 0
        self.mask = np.zeros((len(trajs), width), dtype=bool)
        self.rewards = np.zeros((len(trajs), width), dtype=np.float32)
        actions = np.zeros((len(trajs), width), dtype=np.int64)
        integer_actions = True
        for i, traj in enumerate(trajs):
            steps = traj["steps"]
            self.mask[i, : len(steps)] = True
            self.rewards[i, : len(steps)] = [s["reward"] for s in steps]
            if integer_actions and all(isinstance(s["action"], int) for s in steps):
                actions[i, : len(steps)] = [s["action"] for s in steps]
            else:
                integer_actions = False
        self.actions: np.ndarray | None = actions if integer_actions else None

    def __len__(self) -> int:
        return len(self.trajectories)


def batch_metrics(
    trajs: list[dict[str, Any]], version: int, counters: dict[str, float], wait_s: float
) -> dict[str, float]:
    """ROLL's metric names for one batch."""
    metrics: dict[str, float] = {}
    by_tag: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for traj in trajs:
        by_tag[traj["tag"]].append(traj)
    for tag, items in sorted(by_tag.items()):
        metrics[f"env/{tag}/success"] = float(np.mean([t["success"] for t in items]))
        metrics[f"env/{tag}/num_actions"] = float(np.mean([t["num_actions"] for t in items]))
        metrics[f"env/{tag}/score"] = float(np.mean([t["episode_score"] for t in items]))
    scores = np.array([t["episode_score"] for t in trajs], dtype=np.float64)
    staleness = np.array([version - t["version_start"] for t in trajs], dtype=np.float64)
    if len(trajs):
        metrics["rollout/score/mean"] = float(scores.mean())
        metrics["rollout/score/max"] = float(scores.max())
        metrics["rollout/score/min"] = float(scores.min())
        metrics["scheduler/staleness/mean"] = float(staleness.mean())
        metrics["scheduler/staleness/max"] = float(staleness.max())
    metrics["time/get_batch_cost"] = wait_s
    metrics.update(counters)
    return metrics
