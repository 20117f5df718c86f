r"""GEM's language games (gem-llm), ROLL's `game:NAME` env types, as gymnasium text envs.

The games are gem-llm's own classes, made as `gem.make` makes them (the registered defaults,
then `env_config`), so the rules, observations, rewards and flags are GEM's: the first
observation is the game's instructions (with an info `suffix`, e.g. "Enter your next guess."),
each reply is parsed by the game (`\boxed{...}`), a reply it cannot parse ends the game with
reward -0.1, and the game ends itself at its `max_turns`. ROLL pins gem-llm 0.0.4, whose
registry has the plain `-v0` names ROLL's example configs use (`game:GuessTheNumber-v0`;
0.1.0 dropped them), so that is the version the `gem` extra installs.

Two things are ours:
- GEM's games draw from the process-wide `random` and `numpy.random`, reseeded at every reset
  (`gem/core.py`), so envs stepping in one process would draw from each other's sequences.
  Each env keeps its own copy of both states and swaps it in around every call into the game,
  under one lock (ROLL serialises these games with a thread lock, `use_thread_lock`): a seed
  gives the same game and the same play whatever runs beside it, and the same game GEM gives
  for a seed below 2**32.
- `success` in the info: the game announced a win. Every gem-llm 0.0.4 game does so with an
  observation starting "Congratulations!" on a step that terminates without truncation.

Wordle and Hangman load NLTK's `words` corpus at construction, downloading it first: offline
they are refused with one line unless the corpus is on disk (`nltk.data.path`), and then it is
read from there without a download attempt.
"""

from __future__ import annotations

import importlib
import logging
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from difflib import get_close_matches
from typing import Any

import numpy as np

from producers.envs.answers import last_boxed
from producers.envs.task import TextTaskEnv
from schemas.errors import ConfigError

PREFIX = "game:"
INSTALL_HINT = "pip install 'rollstream[gem]', on Python 3.10 or 3.11 (gem-llm 0.0.4's limit)"
WIN_PREFIX = "Congratulations!"
WORD_GAMES = ("Wordle", "Hangman")  # the games that need NLTK's `words` corpus
# One lock for every call into a game: the process-wide random states are swapped under it.
_GAME_LOCK = threading.RLock()


def gem_module() -> Any:
    """The `gem` package, imported on first use; its import calls `logging.basicConfig`
    (gem-llm 0.0.4 `gem/__init__.py`), which is undone: logging is the CLI's to configure."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return importlib.import_module("gem")
    except ImportError as exc:
        raise ConfigError(f"game: envs need gem-llm ({INSTALL_HINT}): {exc}") from None
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


class RandomStates:
    """A private copy of the process-wide `random` and `numpy.random` states."""

    def __init__(self) -> None:
        self.python = random.Random(0).getstate()
        self.numpy = np.random.RandomState(0).get_state()

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the block with these states as the process-wide ones, keep what it leaves."""
        with _GAME_LOCK:
            outer_python, outer_numpy = random.getstate(), np.random.get_state()
            random.setstate(self.python)
            np.random.set_state(self.numpy)
            try:
                yield
            finally:
                self.python, self.numpy = random.getstate(), np.random.get_state()
                random.setstate(outer_python)
                np.random.set_state(outer_numpy)


def game_id(task: str) -> str:
    """GEM's id of a game: `game:` in front of the name when it is missing."""
    return task if task.startswith(PREFIX) else PREFIX + task


def _check_word_corpus(task: str) -> None:
    """A `ConfigError` unless NLTK's `words` corpus is on disk (Wordle, Hangman)."""
    import nltk  # a dependency of gem-llm

    try:
        nltk.data.find("corpora/words")
    except LookupError:
        raise ConfigError(
            f"{task} needs NLTK's 'words' corpus, which it downloads at start: none on disk "
            f"(searched {', '.join(nltk.data.path)}); fetch it where there is a network with "
            "`python -m nltk.downloader words` and set NLTK_DATA to its folder") from None


@contextmanager
def _no_download() -> Iterator[None]:
    """`nltk.download` as a no-op for the block: the corpus is on disk already."""
    import nltk

    download = nltk.download
    nltk.download = lambda *args, **kwargs: True
    try:
        yield
    finally:
        nltk.download = download


def make_game(task: str, config: dict[str, Any], states: RandomStates) -> Any:
    """The gem-llm game `task` made with `config` (its constructor resets the game, so it runs
    under `states`); a `ConfigError` naming the problem."""
    gem = gem_module()
    registry = gem.envs.registration.ENV_REGISTRY
    task = game_id(task)
    if task not in registry:
        games = sorted(name for name in registry if name.startswith(PREFIX))
        close = get_close_matches(task, games, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"games: {', '.join(games)}"
        raise ConfigError(f"{task} is not a game of gem-llm ({hint})")
    word_game = any(task.startswith(PREFIX + name) for name in WORD_GAMES)
    if word_game:
        _check_word_corpus(task)
    try:
        with _GAME_LOCK, states.active():
            if word_game:
                with _no_download():
                    return gem.make(task, **config)
            return gem.make(task, **config)
    except Exception as exc:  # a game's constructor may raise anything on bad settings
        raise ConfigError(f"{task}: cannot make it with env_config {config}: "
                          f"{type(exc).__name__}: {exc}") from None


class GemGameEnv(TextTaskEnv):
    """A gem-llm game (`task`: `game:NAME`, or `NAME`) with a text observation and replies as
    actions; `env_config` keys other than `max_steps` and `render_mode` go to the game."""

    def __init__(self, task: str, max_steps: int | None = None, render_mode: str | None = None,
                 **game_config: Any) -> None:
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        self.task = game_id(task)
        self._states = RandomStates()
        self.game = make_game(self.task, game_config, self._states)

    def _start(self, seed: int) -> tuple[str, dict[str, Any]]:
        with self._states.active():
            observation, info = self.game.reset(seed=seed)
        return observation, dict(info or {})

    def _act(self, reply: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        with self._states.active():
            observation, reward, terminated, truncated, info = self.game.step(reply)
        info = dict(info or {})
        info["success"] = bool(terminated and not truncated
                               and str(observation).startswith(WIN_PREFIX))
        return observation, float(reward), bool(terminated), bool(truncated), info

    def _answer(self, reply: str) -> str | None:
        return last_boxed(reply)
