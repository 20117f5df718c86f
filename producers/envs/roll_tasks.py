"""ROLL's `gem` env types: which of them rollstream runs, and the factory that makes them.

ROLL makes every env with `gem.make(env_type, **env_config)` (`traj_env_manager.py`), so its
env types are GEM's registered ids (`game:GuessTheNumber-v0`, `rg:letter_counting`,
`math:GSM8K`, `qa:HotpotQA`, `logic:RuleTaker-d1`, `eval:AIME24`, `code:CodeContest`) plus
ROLL's own (`roll_math`, `roll_qa`, `roll_code`). Here they are one gymnasium id,
`rollstream/Gem-v0`, whose `task` kwarg is the env type as ROLL writes it; the other kwargs
are the tag's env_config. The env factory (`producers.envs`) builds a tag whose `env_type` is
one of them through here too. Which names are gem env types is `schemas.envtypes.is_gem_type`
(the config's list of env types).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from schemas.envtypes import ROLL_GEM_TYPES, is_gem_type
from schemas.errors import ConfigError

__all__ = ["GEM_ID", "is_gem_type", "make_gem_env"]

GEM_ID = "rollstream/Gem-v0"
CODE_TASKS = ("roll_code", "eval:CodeContest")


def make_gem_env(task: str, **kwargs: Any) -> gym.Env:
    """The env of a ROLL `gem` env type; a one-line `ConfigError` naming what is missing for
    one that cannot run here (a package, a dataset on disk, a word corpus)."""
    if not isinstance(task, str) or not is_gem_type(task):
        raise ConfigError(f"task {task!r} is not a ROLL gem env type (game:, rg:, math:, qa:, "
                          f"logic:, eval:, code: or {', '.join(ROLL_GEM_TYPES)})")
    if task.startswith("game:"):
        from producers.envs.gem import GemGameEnv

        return GemGameEnv(task, **kwargs)
    if task.startswith("rg:"):
        from producers.envs.reasoning import ReasoningGymEnv

        return ReasoningGymEnv(task, **kwargs)
    if task.startswith("code:") or task in CODE_TASKS:
        from producers.envs.codetasks import CodeEnv

        return CodeEnv(task, **kwargs)
    from producers.envs.problems import ProblemEnv

    return ProblemEnv(task, **kwargs)
