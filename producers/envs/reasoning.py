r"""reasoning-gym tasks, ROLL's `rg:NAME` env types: one question, one reply, scored.

As GEM's `ReasoningGymEnv` (gem-llm 0.0.4, `gem/envs/reasoning_gym.py`), which ROLL builds for
`rg:` tags: the tasks are reasoning-gym's dataset NAME made with `size` items (500) from
`seed` (42), plus any other keys of the dataset's own config; a reset picks one item; the
observation is its question; the answer is the last `\boxed{}` of the reply, and the reward is
the dataset's own `score_answer` for it (0 when there is none: an unparsable reply earns what
a wrong one does); the episode ends after that one step with GEM's terminal observation.

Where ours differs (decision): the item is drawn from the reset seed by the env's own
generator (GEM draws with the process-wide `random` seeded by the reset seed), so a seed gives
the same question whatever else runs in the process. ROLL also replaces the config's `seed`
with the env group's seed, so each group draws from its own pool of `size` items; here the
pool is the config's. `success` is a full score (1.0).
"""

from __future__ import annotations

import importlib
import json
from difflib import get_close_matches
from functools import lru_cache
from typing import Any

import numpy as np

from producers.envs.answers import last_boxed
from producers.envs.task import TERMINAL_STATE, TextTaskEnv
from schemas.errors import ConfigError

PREFIX = "rg:"
INSTALL_HINT = "pip install 'rollstream[reasoning]'"


def reasoning_gym() -> Any:
    """The `reasoning_gym` module, imported on first use (it takes seconds: sympy,
    matplotlib); a `ConfigError` saying what to install when it is missing."""
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError as exc:
        raise ConfigError(f"rg: tasks need reasoning-gym ({INSTALL_HINT}): {exc}") from None


@lru_cache(maxsize=64)
def _dataset(name: str, config_json: str) -> Any:
    """One dataset object per process and config: items are made on demand from (seed,
    index) and never changed, so every env of the config shares it."""
    rg = reasoning_gym()
    names = sorted(rg.factory.DATASETS)
    if name not in rg.factory.DATASETS:
        close = get_close_matches(name, names, n=3)
        hint = f"did you mean {', '.join(PREFIX + c for c in close)}?" if close else \
            f"{len(names)} tasks, e.g. {', '.join(PREFIX + n for n in names[:4])}"
        raise ConfigError(f"{PREFIX}{name} is not a reasoning-gym task ({hint})")
    config = json.loads(config_json)
    try:
        return rg.create_dataset(name, **config)
    except Exception as exc:  # the dataset's config class and its validate() raise anything
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{PREFIX}{name}: bad env_config {config}: {message}") from None


class ReasoningGymEnv(TextTaskEnv):
    """A reasoning-gym dataset as a single-turn text env (`task`: the dataset name, with or
    without `rg:`)."""

    def __init__(self, task: str, size: int = 500, seed: int = 42, max_steps: int | None = None,
                 render_mode: str | None = None, **dataset_config: Any) -> None:
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        name = task[len(PREFIX):] if task.startswith(PREFIX) else task
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"{PREFIX}{name}: size must be an integer >= 1, got {size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"{PREFIX}{name}: seed must be an integer, got {seed!r}")
        try:
            config_json = json.dumps({"size": size, "seed": seed, **dataset_config},
                                     sort_keys=True)
        except TypeError as exc:
            raise ConfigError(f"{PREFIX}{name}: env_config must be plain values: {exc}") from None
        self.task = PREFIX + name
        self.size = size
        self.dataset = _dataset(name, config_json)
        self.entry: dict[str, Any] = {}

    def _start(self, seed: int) -> tuple[str, dict[str, Any]]:
        index = int(np.random.default_rng(seed).integers(self.size))
        self.entry = self.dataset[index]
        return str(self.entry["question"]), {}

    def _act(self, reply: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = last_boxed(reply)
        reward = float(self.dataset.score_answer(answer=answer, entry=self.entry))
        info = {"success": reward >= 1.0, "action_is_valid": answer is not None}
        return TERMINAL_STATE, reward, True, False, info

    def _answer(self, reply: str) -> str | None:
        return last_boxed(reply)
