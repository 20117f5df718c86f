"""The `rollstream` command line.

    rollstream config check FILE [--json] [--redis-url URL --run NAME]
                                               the env layout of a config (and where the
                                               run lives on that Redis)
    rollstream config show FILE                the resolved config as YAML
    rollstream up --config FILE [...]          Redis + producers + a trainer loop, locally
    rollstream up --trainer "SCRIPT [ARGS]"    the same with your own trainer script
    rollstream train --config FILE --redis-url URL [...]   only the trainer loop
    rollstream produce --redis-url URL --run NAME [--max-shards K]
    rollstream pause | resume                  the operator's pause of a run's train rollouts
    rollstream status [--json] [--watch]       version, pause, producers, streams, warnings
    rollstream stop                            end a run: its producers exit
    rollstream reset [--yes]                   delete every key of a run
    rollstream ui [--port P] [--host H]        a live web page of a run (read-only)
    rollstream export DIR [--out FILE]         a --record folder's trajectories as JSON lines
    rollstream replay FILE_OR_DIR              re-step recorded trajectories' local envs;
                                               exit 1 if a reward or observation differs

Exit status: 0 ok, 1 a runtime failure (one line on stderr), 2 a bad command line or config.

The parts, each found by name:
    parser.py     every command's arguments (argparse), and the argument types
    errors.py     the CLI's exceptions and which exceptions exit 1
    connect.py    the Redis client of a command (checked by a PING), the run a command names
    config.py     `config check`, `config show`, and the checked loading `up` shares
    running.py    `up`, `up --trainer`, `train`, `produce` (the launcher is rollstream/launcher.py)
    operating.py  `pause`, `resume`, `stop`, `reset`, `status` (the view is rollstream/status/)
    ui.py         `ui` (the server and the page are rollstream/ui/)
    store.py      `export`, `replay` (the store is consumer/store.py, the replay
                  rollstream/replay.py)
A new command: its arguments in parser.py, its function in the module of its group (or a new
module for a new group), and one line in `COMMANDS` below.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from rollstream.cli import config, operating, running, store, ui
from rollstream.cli.errors import RUNTIME_FAILURES, UsageError
from rollstream.cli.parser import build_parser, env_port
from schemas.errors import ConfigError


def _fake_llm(args: argparse.Namespace) -> int:
    from rollstream.fake_llm import run as run_fake_llm
    return run_fake_llm(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {  # the parser's command -> its run
    "config": config.command,
    "up": running.up,
    "train": running.up,
    "produce": running.produce,
    "fake-llm": _fake_llm,
    "pause": operating.pause,
    "resume": operating.resume,
    "stop": operating.stop,
    "status": operating.status,
    "reset": operating.reset,
    "ui": ui.ui,
    "export": store.export,
    "replay": store.replay,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with a usage message on a bad command line
    level = args.log_level or ("INFO" if args.command == "produce" else "WARNING")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.log_level = level
    try:
        code = _dispatch(args)
        sys.stdout.flush()  # here, where a reader that left early is still caught
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `rollstream config show | head`: the reader left early
        _silence_stdout()
        return 1
    except (UsageError, ConfigError) as exc:
        print(f"rollstream: error: {exc}", file=sys.stderr)
        return 2
    except RUNTIME_FAILURES as exc:
        print(f"rollstream: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not raise again
    (Python's documented way to end quietly on EPIPE)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _dispatch(args: argparse.Namespace) -> int:
    if getattr(args, "metrics_port", None) is None and hasattr(args, "metrics_port"):
        args.metrics_port = env_port()
    return COMMANDS[args.command](args)
