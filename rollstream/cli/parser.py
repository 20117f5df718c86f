"""The `rollstream` command line's arguments: one subparser per command, and the argument
types that refuse a bad value with a one-line usage error (exit 2).

A new command adds its subparser in `build_parser`; its function goes into the module of its
group (`rollstream/cli/`), and one line into `rollstream.cli.COMMANDS`.
"""

from __future__ import annotations

import argparse

from rollstream.cli.errors import UsageError
from schemas.redisconn import SENTINEL_FORM

DESCRIPTION = "The `rollstream` command line."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollstream", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"rollstream {_version()}")
    parser.add_argument("--log-level", default=None,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="default: INFO for produce (a service), WARNING otherwise")
    sub = parser.add_subparsers(dest="command", required=True)

    config = sub.add_parser("config", help="inspect a config file")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config and print its layout")
    check.add_argument("file")
    check.add_argument("--json", action="store_true", help="print the layout as JSON")
    check.add_argument("--redis-url", default=None,
                       help="also say which Redis node would hold the run (and its replicas)")
    check.add_argument("--run", default=None, help="run name (env ROLLSTREAM_RUN, else the "
                                                   "config's `run`)")
    show = config_sub.add_parser("show", help="print the resolved config as YAML (what a ROLL "
                                              "file's keys became)")
    show.add_argument("file")

    up = sub.add_parser("up", help="run Redis, producers and a trainer loop here")
    train = sub.add_parser("train", help="only the stand-in trainer loop; producers elsewhere")
    for parser_ in (up, train):
        parser_.add_argument("--config", required=parser_ is train, help="rollout config YAML")
        _redis_args(parser_, config=False)
        parser_.add_argument("--steps", type=_positive_int, default=None,
                             help="stop after N steps")
        parser_.add_argument("--seconds", type=_positive_float, default=None,
                             help="stop after S seconds")
        parser_.add_argument("--train-step-s", type=_nonneg_float, default=0.0,
                             help="seconds the stand-in train step takes")
        parser_.add_argument("--timeout-s", type=_positive_float, default=120.0,
                             help="give up when a batch takes longer than this")
        parser_.add_argument("--val-every", type=_nonneg_int, default=0,
                             help="run a val round every N train steps (0: never)")
        parser_.add_argument("--plot", default=None, metavar="PNG",
                             help="at the end, write throughput, batch wait and success "
                                  "curves to this PNG (needs the plot extra)")
        parser_.add_argument("--record", default=None, metavar="DIR",
                             help="keep every batch the trainer is handed in DIR as Parquet "
                                  "(needs the store extra; read with export, replay)")
        _metrics_args(parser_, "the trainer's /metrics port" + (
            "; the producers up starts get P+1 .. P+N" if parser_ is up else ""))
    up.add_argument("--producers", type=_positive_int, default=None,
                    help="producer processes (default: enough for the shards, at most cores)")
    up.add_argument("--trainer", default=None, metavar='"SCRIPT [ARGS]"',
                    help="run this Python script as the trainer (it publishes its own config; "
                         "ROLLSTREAM_REDIS_URL, ROLLSTREAM_RUN and, with --config, "
                         "ROLLSTREAM_CONFIG in its environment); its exit status is up's")

    produce = sub.add_parser("produce", help="run a producer process")
    _redis_args(produce)
    produce.add_argument("--max-shards", type=_positive_int, default=None,
                         help="hold at most K shards")
    produce.add_argument("--seconds", type=_positive_float, default=None,
                         help="exit after S seconds")
    produce.add_argument("--check", action="store_true",
                         help="exit 0 if a producer of this host has a fresh heartbeat, else 1 "
                              "(a healthcheck)")
    _metrics_args(produce, "serve Prometheus metrics on this port (0: any free port)")

    from rollstream.fake_llm import add_arguments as fake_llm_arguments
    fake_llm_arguments(sub.add_parser("fake-llm", help="a stand-in OpenAI-compatible LLM "
                                      "server (scripted replies, latency, faults)"))

    for name, text in (("pause", "pause train rollouts (reason: operator)"),
                       ("resume", "lift the operator's pause"),
                       ("stop", "end the run: its producers exit (a trainer that starts "
                                "again resumes it)")):
        _redis_args(sub.add_parser(name, help=text))
    status = sub.add_parser("status", help="print the run's state (--watch: a live view)")
    _redis_args(status)
    status.add_argument("--json", action="store_true",
                        help="one JSON document (with --watch: one per refresh, a line each)")
    status.add_argument("--watch", action="store_true",
                        help="refresh every --interval-s until Ctrl+C (a terminal: redrawn "
                             "in place)")
    status.add_argument("--interval-s", type=_positive_float, default=2.0,
                        help="seconds between refreshes (default 2)")
    status.add_argument("--count", type=_positive_int, default=None,
                        help="with --watch: stop after N refreshes")
    status.add_argument("--wait-warn-s", type=_positive_float, default=30.0,
                        help="warn when get_batch has waited longer than this (default 30)")
    status.add_argument("--redis-limit-mb", type=_positive_float, default=None,
                        help="warn when Redis uses more memory than this (default: 80%% of "
                             "its maxmemory, else 1024)")
    ui = sub.add_parser("ui", help="a live web page of a run: producers, servers, batchers, "
                                   "figures over time, sampled trajectories turn by turn")
    _redis_args(ui)
    ui.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1: this machine only)")
    ui.add_argument("--port", type=_port, default=UI_PORT,
                    help=f"port to listen on (default {UI_PORT}; 0: any free port, printed)")
    ui.add_argument("--interval-s", type=_positive_float, default=1.0,
                    help="seconds between reads of the run (default 1)")
    export = sub.add_parser("export", help="print the trajectories a --record folder holds")
    export.add_argument("path", metavar="DIR", help="a --record folder or one of its files")
    export.add_argument("--format", choices=["jsonl"], default="jsonl",
                        help="jsonl: one trajectory a line, with its batch (default)")
    export.add_argument("--out", default=None, metavar="FILE",
                        help="write here instead of stdout")
    replay = sub.add_parser("replay", help="re-step the local envs of recorded trajectories "
                                           "with their actions and seeds; exit 1 if any "
                                           "reward or observation differs")
    replay.add_argument("path", metavar="FILE_OR_DIR",
                        help="a --record folder or one of its files")
    replay.add_argument("--max-report", type=_positive_int, default=20,
                        help="differences printed at most (all are counted; default 20)")
    reset = sub.add_parser("reset", help="delete every key of a run (stops its producers "
                                          "first)")
    _redis_args(reset)
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    return parser


def _redis_args(parser: argparse.ArgumentParser, *, config: bool = True) -> None:
    parser.add_argument("--redis-url", default=None,
                        help="redis://, rediss:// or unix:// URL of a server or of any Redis "
                             f"Cluster node, or {SENTINEL_FORM} (env ROLLSTREAM_REDIS_URL, "
                             "REDIS_URL; password also from ROLLSTREAM_REDIS_PASSWORD)")
    parser.add_argument("--run", default=None, help="run name (env ROLLSTREAM_RUN)")
    if config:
        parser.add_argument("--config", default=None,
                            help="a rollout config whose `run` and `redis_url` to use "
                                 "(after --run/--redis-url and the environment)")


def _metrics_args(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--metrics-port", type=_port, default=None, metavar="P",
                        help=f"{text} (default: ${METRICS_PORT_ENV}, else no metrics)")
    parser.add_argument("--metrics-addr", default="0.0.0.0",
                        help="address the /metrics pages listen on (default 0.0.0.0)")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rollstream")
    except PackageNotFoundError:  # running from a checkout that is not installed
        return "unknown"


def _number(kind: type, check: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        ok = value > 0 if check == "positive" else value >= 0
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r} must be {check}")
        return value
    return parse


_positive_int = _number(int, "positive")
_nonneg_int = _number(int, "non-negative")
_positive_float = _number(float, "positive")
_nonneg_float = _number(float, "non-negative")


UI_PORT = 8360  # `rollstream ui`'s default port
METRICS_PORT_ENV = "ROLLSTREAM_METRICS_PORT"  # the default of --metrics-port (compose sets it)


def env_port() -> int | None:
    import os

    text = os.environ.get(METRICS_PORT_ENV)
    if not text:
        return None
    try:
        return _port(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{METRICS_PORT_ENV}: {exc}") from None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} must be a port in 0..65535")
    return port
