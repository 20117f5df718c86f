"""Group filters: which complete groups are not trained on.

Two filters per env manager, under ROLL's names:

- `group_filter_config: {type: std_filter, filter_args: {std_threshold: T}}`, built in: a
  group whose episode scores have a sample standard deviation (n - 1) at most T is dropped.
  T = 0 drops the groups whose rewards all agree: every GRPO advantage in them is 0, so they
  teach nothing (DAPO's dynamic sampling). A group of one is kept.
- `group_filter_cls`, a class by import path with ROLL's interface (`GroupFilter` in
  roll/pipeline/agentic/agentic_pipeline.py, alibaba/ROLL 8eb27cc2, and its caller
  `GroupQueue.put` in roll/distributed/scheduler/rollout_scheduler.py): built once per mode
  as `Class(config, env_manager_config, mode)`; `.filter(group_id=, episode_id=, group=)`
  is asked about each complete group (`group`: its trajectories, by member) and returns
  True to drop it. None keeps it, as ROLL's truthy test reads the example in its docs
  (which returns nothing for a group it keeps); anything else is a `GroupFilterError`.

A group both would drop is counted under the built-in one (the class is not asked). The
Assembly judges groups as they come to the front of the ready queue at hand-out
(`Assembly.judge`); this module only says which filter drops a group.
"""

from __future__ import annotations

import importlib
import logging
import math
from typing import Any

import numpy as np

from schemas.config import RolloutConfig
from schemas.errors import ConfigError, GroupFilterError
from schemas.manager import EnvManagerConfig

logger = logging.getLogger(__name__)

FILTERED = "scheduler/group_filter_count"  # ROLL's name: groups filtered since the last batch
STD_FILTER = "std_filter"
FILTER_CLASS = "group_filter_cls"
# a filter's reason -> its own counter, beside FILTERED
REASON_COUNTERS = {STD_FILTER: "scheduler/group_filter/std_filter",
                   FILTER_CLASS: "scheduler/group_filter/group_filter_cls"}


class GroupFilter:
    """The filters of one mode: the built-in `std_filter` (when configured), then the
    user's class (when configured)."""

    def __init__(self, mode: str, manager: EnvManagerConfig, user: Any = None):
        config = manager.group_filter_config
        self.mode = mode
        self.threshold: float | None = (config.filter_args.std_threshold if config.active
                                        else None)
        self.user = user
        self.path = manager.group_filter_cls

    @property
    def active(self) -> bool:
        return self.threshold is not None or self.user is not None

    def reason(self, group_id: int, episode_id: int, group: list[dict[str, Any]]) -> str | None:
        """Which filter drops this complete group (`STD_FILTER`, `FILTER_CLASS`), or None to
        keep it. A user class that raises or answers something else: `GroupFilterError`."""
        if self.threshold is not None and scores_agree(group, self.threshold):
            return STD_FILTER
        if self.user is not None and self._user_drops(group_id, episode_id, group):
            return FILTER_CLASS
        return None

    def _user_drops(self, group_id: int, episode_id: int, group: list[dict[str, Any]]) -> bool:
        where = f"{self.mode} group {group_id} episode {episode_id}"
        try:
            verdict = self.user.filter(group_id=group_id, episode_id=episode_id, group=group)
        except Exception as exc:
            raise GroupFilterError(
                f"group_filter_cls {self.path}: filter() raised {_one_line(exc)} on {where}; "
                "the group stays pending for a trainer started again with the filter "
                "fixed") from exc
        if verdict is None:
            return False
        if isinstance(verdict, bool | np.bool_):
            return bool(verdict)
        shown = repr(verdict)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise GroupFilterError(
            f"group_filter_cls {self.path}: filter() returned {type(verdict).__name__} "
            f"{shown} on {where}, not True (drop), False or None (keep)")


def scores_agree(group: list[dict[str, Any]], threshold: float) -> bool:
    """`std_filter`: whether the episode scores' sample standard deviation (n - 1, as
    torch.std) is at most `threshold`. Equal scores count as 0 exactly (numpy's std gives
    1.5e-17 for seven scores of 0.1). A group of one has no spread to judge: kept."""
    if len(group) < 2:
        return False
    scores = [float(traj["episode_score"]) for traj in group]
    if min(scores) == max(scores):
        return True
    if threshold <= 0:
        return False  # plain Python below: numpy took 17x as long for a group of 8
    mean = sum(scores) / len(scores)
    variance = sum((score - mean) ** 2 for score in scores) / (len(scores) - 1)
    return math.sqrt(variance) <= threshold


def build_group_filters(config: RolloutConfig) -> dict[str, GroupFilter]:
    """Each mode's filters, the user's class imported and built (`ConfigError` naming the
    field when it cannot be: the Batcher's constructor and `rollstream config check`)."""
    return {mode: _build(config, mode) for mode in config.modes()}


def _build(config: RolloutConfig, mode: str) -> GroupFilter:
    manager = config.manager(mode)
    path = manager.group_filter_cls
    if path is None:
        return GroupFilter(mode, manager)
    field = f"{mode}_env_manager.group_filter_cls {path}"
    cls = _import(path, field)
    try:
        user = cls(config, manager, mode)
    except Exception as exc:
        raise ConfigError(f"{field}: building it as Class(config, env_manager_config, mode) "
                          f"raised {_one_line(exc)}") from None
    if not callable(getattr(user, "filter", None)):
        raise ConfigError(f"{field}: a {type(user).__name__} has no filter(group_id, "
                          "episode_id, group) method")
    return GroupFilter(mode, manager, user)


def _import(path: str, field: str) -> Any:
    """`pkg.module.Class` or `pkg.module:Class`, imported from sys.path (the working folder
    of `python -m`, and PYTHONPATH)."""
    module_name, _, attr = path.rpartition(":") if ":" in path else path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name
                                     or module_name.startswith(exc.name + ".")):
            raise ConfigError(f"{field}: no module named {exc.name!r} (the trainer imports "
                              "it: is its folder on PYTHONPATH?)") from None
        raise ConfigError(f"{field}: importing {module_name} failed: "
                          f"{_one_line(exc)}") from None
    except Exception as exc:
        raise ConfigError(f"{field}: importing {module_name} failed: "
                          f"{_one_line(exc)}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(f"{field}: module {module_name} has no attribute {attr!r}")
    if not callable(cls):
        raise ConfigError(f"{field}: {attr} is a {type(cls).__name__}, not a class")
    return cls


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
