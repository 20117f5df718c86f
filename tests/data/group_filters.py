"""Group filter classes for tests/test_group_filters.py, with ROLL's interface:
`Class(config, env_manager_config, mode)`, `.filter(group_id=, episode_id=, group=)` returns
True to drop the group (None or False keeps it)."""

from __future__ import annotations

from typing import Any


class DropOddGroups:
    """Drops the groups with an odd id; notes every group it was asked about in `asked`."""

    asked: list[tuple[str, int, int, list[int]]] = []  # (mode, group, episode, members)

    def __init__(self, config: Any, env_manager_config: Any, mode: str):
        self.mode = mode
        self.group_size = env_manager_config.group_size
        self.seed = config.seed

    def filter(self, group_id: int, episode_id: int, group: list[dict[str, Any]]) -> bool:
        DropOddGroups.asked.append((self.mode, group_id, episode_id,
                                    [traj["member"] for traj in group]))
        return group_id % 2 == 1


class DropListed:
    """Drops the group ids in the class's `drop` set, set by the test as it goes; returns
    None for the others, as the example in ROLL's docs does."""

    drop: set[int] = set()

    def __init__(self, config: Any, env_manager_config: Any, mode: str):
        pass

    def filter(self, group_id: int, episode_id: int, group: list[dict[str, Any]]) -> Any:
        if group_id in DropListed.drop:
            return True
        return None


class RaisesOnGroupTwo:
    def __init__(self, config: Any, env_manager_config: Any, mode: str):
        pass

    def filter(self, group_id: int, episode_id: int, group: list[dict[str, Any]]) -> bool:
        if group_id == 2:
            raise KeyError("no such reward key 'acc'")
        return False


class AnswersGarbage:
    def __init__(self, config: Any, env_manager_config: Any, mode: str):
        pass

    def filter(self, group_id: int, episode_id: int, group: list[dict[str, Any]]) -> Any:
        return "drop"


class WithoutFilter:
    def __init__(self, config: Any, env_manager_config: Any, mode: str):
        pass


class TakesNoArguments:
    def filter(self, group_id: int, episode_id: int, group: list[dict[str, Any]]) -> bool:
        return False
