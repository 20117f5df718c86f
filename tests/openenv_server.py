"""A real OpenEnv env server for the tests and benchmarks, built with openenv-core's server API
(openenv-core 0.3.0: `openenv.core.env_server.http_server.create_app`, the `Environment`,
`Action` and `Observation` bases of openenv/core/env_server/interfaces.py and types.py).

The game: guess a digit. `reset(seed)` picks the digit `seed % 10`; each step's `guess` earns
1.0 and ends the episode when right, else 0.0; the episode ends after `TURNS` guesses. Each
reset and step prints one line (`reset SEED`, `step SEED N`) to stdout, flushed, so a test
can act on what really happened (a session open mid-episode) rather than on a timer.

    python tests/openenv_server.py --port 8000 [--max-sessions 4]
"""

from __future__ import annotations

import argparse
import sys
import threading
import uuid
from typing import Any

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

TURNS = 3
_SAYING = threading.Lock()


def say(line: str) -> None:
    """One whole line on stdout, flushed. openenv-core runs each session's env in a thread
    of its own: unlocked, two sessions' prints could interleave into one line."""
    with _SAYING:
        print(line, flush=True)


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    prompt: str
    turn: int = 0


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # no state shared between sessions

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self.seed = 0
        self.target = "0"

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> GuessObservation:
        self.seed = int(seed or 0)
        self.target = str(self.seed % 10)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        say(f"reset {self.seed}")
        return GuessObservation(prompt="Guess a digit (0-9).", turn=0)

    def step(self, action: GuessAction, timeout_s: float | None = None,
             **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        turn = self._state.step_count
        say(f"step {self.seed} {turn}")
        right = action.guess.strip() == self.target
        return GuessObservation(prompt="Right." if right else f"Wrong, guess again ({turn}).",
                                turn=turn, reward=1.0 if right else 0.0,
                                done=right or turn >= TURNS)

    @property
    def state(self) -> State:
        return self._state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=1)
    args = parser.parse_args(argv)
    app = create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess",
                     max_concurrent_envs=args.max_sessions)
    print(f"serving on {args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", ws_max_size=1 << 20)


if __name__ == "__main__":
    sys.exit(main())
