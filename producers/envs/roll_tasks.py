"""ROLL's `gem` env types: which of them rollstream runs, and the factory that makes them.

ROLL makes every env with `gem.make(env_type, **env_config)` (`traj_env_manager.py`), so its
env types are GEM's registered ids (`game:GuessTheNumber-v0`, `rg:letter_counting`,
`math:GSM8K`, `qa:HotpotQA`, `logic:RuleTaker-d1`, `eval:AIME24`, `code:CodeContest`) plus
ROLL's own (`roll_math`, `roll_qa`, `roll_code`). Here they are one gymnasium id,
`rollstream/Gem-v0`, whose `task` kwarg is the env type as ROLL writes it; the other kwargs
are the tag's env_config.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from schemas.errors import ConfigError

GEM_ID = "rollstream/Gem-v0"
# The families of env types, by prefix; ROLL's own types by name.
GEM_PREFIXES = ("game:", "rg:", "math:", "qa:", "logic:", "eval:", "code:")
ROLL_TYPES = ("roll_math", "roll_qa", "roll_code")
CODE_TASKS = ("roll_code", "eval:CodeContest")


def is_gem_type(env_type: str) -> bool:
    """Whether `env_type` is one of ROLL's `gem` env types (made through `GEM_ID`)."""
    return env_type in ROLL_TYPES or env_type.startswith(GEM_PREFIXES)


def make_gem_env(task: str, **kwargs: Any) -> gym.Env:
    """The env of a ROLL `gem` env type; a one-line `ConfigError` naming what is missing for
    one that cannot run here (a package, a dataset on disk, a word corpus)."""
    if not isinstance(task, str) or not is_gem_type(task):
        raise ConfigError(f"task {task!r} is not a ROLL gem env type (game:, rg:, math:, qa:, "
                          f"logic:, eval:, code: or {', '.join(ROLL_TYPES)})")
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
