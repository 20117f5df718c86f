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

Exit status: 0 ok, 1 a runtime failure (one line on stderr), 2 a bad command line or config.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence

from schemas.config import RolloutConfig, resolve_redis_url, resolve_run
from schemas.errors import ConfigError, RedisSetupError, RollstreamError
from schemas.keys import BATCHER_CLOSED, Keys
from schemas.liveness import live_producers
from schemas.policy import PythonPolicyConfig
from schemas.redisconn import (
    REDIS_ERRORS,
    SENTINEL_FORM,
    Location,
    SyncClient,
    auth_message,
    check_url,
    error_text,
    is_auth_error,
    locate,
    mask_url,
    publish,
    sync_client,
)

logger = logging.getLogger("rollstream")


RUNTIME_FAILURES: tuple[type[Exception], ...] = (RollstreamError, *REDIS_ERRORS)  # exit 1


class UsageError(Exception):
    """A bad command line: exit status 2."""


class RunNotFound(RollstreamError):
    """An operator command named a run that has no published config: exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollstream", description=__doc__.split("\n")[0])
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


METRICS_PORT_ENV = "ROLLSTREAM_METRICS_PORT"  # the default of --metrics-port (compose sets it)


def _env_port() -> int | None:
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
        args.metrics_port = _env_port()
    if args.command == "config":
        if args.config_command == "show":
            text = RolloutConfig.from_yaml(args.file).to_yaml()
            print(f"# {args.file} as rollstream resolved it (a plain rollstream config)\n{text}",
                  end="")
            return 0
        return _config_check(args)
    if args.command in ("up", "train"):
        return _up(args)
    if args.command == "produce":
        return _produce(args)
    if args.command == "fake-llm":
        from rollstream.fake_llm import run as run_fake_llm
        return run_fake_llm(args)
    return _admin(args)


def _load_checked(path: str) -> RolloutConfig:
    """The config, with one env of each tag built and reset (bad env settings fail here)."""
    from producers.envs import check_envs

    config = RolloutConfig.from_yaml(path)
    try:
        check_envs(config)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return config


def _config_check(args: argparse.Namespace) -> int:
    config = _load_checked(args.file)
    _warn_python_policy(config)
    layout: dict = config.layout()
    location = _locate(args.redis_url, resolve_run(args.run, config)) if args.redis_url else None
    if args.json:
        if location is not None:
            layout["redis"] = {"kind": location.kind, "node": location.node,
                               "slot": location.slot, "replicas": location.replicas}
        print(json.dumps(layout))
        return 0
    print(f"{args.file}: ok ({'sync' if config.is_sync else 'async'}, ratio {config.ratio}, "
          f"train batch {config.train_batch_size}, "
          f"{config.episodes_per_step('train')} episode(s) per env per step)")
    for mode, info in layout.items():
        print(f"{mode}: {info['envs']} envs, {info['groups']} groups of {info['group_size']}, "
              f"{info['shards']} shards")
        for tag, (start, end) in info["tags"].items():
            print(f"  {tag}: groups [{start}, {end})")
    if location is not None:
        run = resolve_run(args.run, config)
        print(f"run {run}: {location}{_replica_note(config, location)}")
    return 0


def _warn_python_policy(config: RolloutConfig) -> None:
    """A python policy whose entrypoint does not import here: a warning, not an error (the
    producers may run where it does: another image, another PYTHONPATH)."""
    if not isinstance(config.policy, PythonPolicyConfig):
        return
    from producers.policies.python import find_factory
    from schemas.errors import PolicyError

    try:
        find_factory(config.policy)
    except PolicyError as exc:
        print(f"warning: {exc}; producers that cannot import it exit 1", file=sys.stderr)


def _locate(url: str, run: str) -> Location:
    client = _client(url)
    try:
        return locate(client, Keys(run))
    finally:
        client.close()


def _replica_note(config: RolloutConfig, location: Location) -> str:
    """A warning when `min_replicas` asks for more replicas than the run's node has."""
    if config.min_replicas <= location.replicas:
        return ""
    return (f"; warning: min_replicas {config.min_replicas} but {location.replicas} online: "
            "commits, acks and version publishes wait until enough replicas are back")


def _client(url: str | None) -> SyncClient:
    """A client for `url` (any deployment), checked by a PING: a bad URL exits 2, an
    unreachable Redis or wrong credentials exit 1, each with one line (the URL masked)."""
    client = None
    try:
        client = sync_client(check_url(url), socket_timeout=10, socket_connect_timeout=5)
        client.ping()
    except REDIS_ERRORS as exc:
        if client is not None:
            client.close()
        if is_auth_error(exc):
            raise RedisSetupError(auth_message(str(url))) from None
        raise RedisSetupError(f"cannot reach Redis at {mask_url(str(url))}: "
                              f"{error_text(exc)}") from None
    return client


def _lookup(args: argparse.Namespace) -> tuple[str | None, str]:
    """(Redis URL, run name) for the operator commands and `produce`: flags, the
    environment, then the `--config` file's `redis_url` / `run`."""
    config = RolloutConfig.from_yaml(args.config) if args.config else None
    return resolve_redis_url(args.redis_url, config), resolve_run(args.run, config)


def _up(args: argparse.Namespace) -> int:
    from rollstream.launcher import UpOptions, train, up

    if getattr(args, "trainer", None) is not None:
        return _up_trainer(args)
    if not args.config:
        raise UsageError("up needs --config FILE (or --trainer SCRIPT)")
    config = _load_checked(args.config)
    if args.command == "up":
        _check_local_key(config)
    url = resolve_redis_url(args.redis_url, config)
    if url or args.command == "train":
        _client(url).close()  # checks the URL and the server before anything starts
    if args.plot:
        _check_plot(args.plot)
    if args.metrics_port == 0:
        raise UsageError(f"{args.command} --metrics-port needs a fixed port (0 picks one at "
                         "random; Prometheus could not find it)")
    opts = UpOptions(config=config, redis_url=url, run=resolve_run(args.run, config),
                     producers=getattr(args, "producers", None), steps=args.steps,
                     seconds=args.seconds, train_step_s=args.train_step_s,
                     timeout_s=args.timeout_s, val_every=args.val_every,
                     log_level=args.log_level, metrics_port=args.metrics_port,
                     metrics_addr=args.metrics_addr, plot=args.plot)
    return up(opts) if args.command == "up" else train(opts)


def _check_local_key(config: RolloutConfig) -> None:
    """`up` starts the producers here, with this environment: an API key variable the
    openai policy names must be set (producers elsewhere, as with `train`, have their own)."""
    import os

    name = getattr(config.policy, "api_key_env", None)
    if name and not os.environ.get(name):
        raise UsageError(f"policy.api_key_env: the environment variable {name} is not set "
                         "(the producers up starts read the API key from it)")


def _check_plot(path: str) -> None:
    """Before a run that plots at its end: matplotlib is there and the folder is writable."""
    import os

    from rollstream.plots import require_matplotlib

    require_matplotlib()
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise UsageError(f"--plot {path}: the folder {folder} does not exist or is not "
                         "writable")


def _up_trainer(args: argparse.Namespace) -> int:
    """`up --trainer`: the user's script instead of the stand-in trainer loop."""
    import os
    import shlex

    from rollstream.launcher import default_producers, up_trainer

    try:
        script = shlex.split(args.trainer)
    except ValueError as exc:  # an unbalanced quote
        raise UsageError(f"--trainer {args.trainer!r}: {exc}") from None
    if not script or not os.path.isfile(script[0]):
        named = script[0] if script else ""
        hint = ("; give the script itself, SCRIPT [ARGS]: it runs with this Python"
                if os.path.basename(named).startswith("python") else "")
        raise UsageError(f"--trainer: no script file {named!r}{hint}")
    stand_in = [flag for flag, value, default in (
        ("--steps", args.steps, None), ("--seconds", args.seconds, None),
        ("--train-step-s", args.train_step_s, 0.0), ("--val-every", args.val_every, 0),
        ("--plot", args.plot, None))
        if value != default]
    if stand_in:
        raise UsageError(f"{', '.join(stand_in)}: flags of the stand-in trainer, not of "
                         "--trainer (pass them to your script)")
    config = _load_checked(args.config) if args.config else None
    if config is not None:
        _check_local_key(config)
    url = resolve_redis_url(args.redis_url, config)
    if url:
        _client(url).close()  # checks the URL's form before anything starts
    producers = args.producers or (default_producers(config) if config else os.cpu_count() or 1)
    if args.metrics_port == 0:
        raise UsageError("up --metrics-port needs a fixed port (the producers take the next "
                         "ones)")
    return up_trainer(script, url, resolve_run(args.run, config), producers, args.log_level,
                      config_path=args.config, metrics_port=args.metrics_port,
                      metrics_addr=args.metrics_addr)


def _produce(args: argparse.Namespace) -> int:
    from producers.producer import Producer, tune_gc

    url, run = _lookup(args)
    if args.check:
        return _check_producer(_client(url), Keys(run))
    check_url(url)
    assert url is not None
    producer = Producer(url, run, max_shards=args.max_shards,
                        seconds=args.seconds)
    if args.metrics_port is not None:
        producer.serve_metrics(args.metrics_port, args.metrics_addr)
    tune_gc()  # this process is the producer and nothing else
    return producer.run()


def _check_producer(client: SyncClient, keys: Keys) -> int:
    """Healthcheck: a producer id of this host whose heartbeat has not expired."""
    import socket

    raw = client.get(keys.config)
    if raw is None:
        print(f"run {keys.run}: no config published yet")
        return 1
    prefix = socket.gethostname() + "-"
    fresh = [name for name in live_producers(client, keys) if name.startswith(prefix)]
    print(f"run {keys.run}: {len(fresh)} live producer(s) on this host")
    return 0 if fresh else 1


def _admin(args: argparse.Namespace) -> int:
    url, run = _lookup(args)
    client = _client(url)
    keys = Keys(run)
    if args.command == "reset":
        return _reset(client, keys, args.yes)
    config = _published_config(client, keys, needed=args.command == "status")
    if args.command in ("pause", "resume"):
        if args.command == "pause":
            client.sadd(keys.pause, "operator")
        else:
            client.srem(keys.pause, "operator")
        publish(client, keys.control, b"pause")
        reasons = sorted(_text(r) for r in client.smembers(keys.pause))
        print(f"run {keys.run}: pause reasons {reasons or 'none'}")
        return 0
    if args.command == "stop":
        client.set(keys.stop, 1)
        publish(client, keys.control, b"stop")
        print(f"run {keys.run}: stopped; {len(live_producers(client, keys))} live "
              "producer(s) exit now (a trainer that starts the run again resumes it)")
        return 0
    assert config is not None
    return _status(client, keys, config, args)


def _published_config(client: SyncClient, keys: Keys, needed: bool) -> RolloutConfig | None:
    """The run's published config. A run without one and without live producers does not
    exist (exit 1). With live producers, Redis lost it (restarted without persistence while
    no trainer ran): `stop`, `pause` and `resume` still reach them (None); `status`, which
    needs the config, says so (exit 1)."""
    raw = client.get(keys.config)
    if raw is not None:
        return RolloutConfig.from_json(raw)
    live = live_producers(client, keys)
    if not live:
        raise RunNotFound(f"run {keys.run!r} does not exist here (no config at {keys.config}; "
                          "a trainer publishes it when it starts)")
    if not needed:
        return None
    paused = sorted(_text(r) for r in client.smembers(keys.pause))
    raise RunNotFound(
        f"run {keys.run!r} has {len(live)} live producer(s) ({', '.join(sorted(live))}"
        f"{', paused: ' + ', '.join(paused) if paused else ''}) but no "
        f"config at {keys.config}: Redis lost it (restarted without persistence while no "
        "trainer ran?); the producers go on with theirs, a trainer started again publishes "
        f"it (from version 0: the version was lost too), `rollstream stop --run {keys.run}` "
        "ends them")


def _reset(client: SyncClient, keys: Keys, yes: bool) -> int:
    """Stop the run's producers, then delete every key of the run."""
    names = list(client.scan_iter(match=keys.pattern(), count=1000))
    if not names:
        print(f"run {keys.run}: no keys; nothing to reset")
        return 0
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"reset deletes {len(names)} keys of run {keys.run!r}: pass --yes "
                             "to confirm (stdin is not a terminal)")
        try:
            answer = input(f"delete all {len(names)} keys of run {keys.run!r}? type the run "
                           "name to confirm: ")
        except EOFError:  # Ctrl+D: no answer is not a yes
            answer = ""
            print()
        if answer.strip() != keys.run:
            print("not confirmed; nothing deleted")
            return 1
    raw = client.get(keys.config)
    ttl_s = RolloutConfig.from_json(raw).lease_ttl_s if raw is not None else 10.0
    client.set(keys.stop, 1)
    publish(client, keys.control, b"stop")
    # a dead trainer's liveness key outlives it by its own ttl: wait that long too
    alive_s = max(_live_batchers(client, keys).values(), default=0) / 1000
    deadline = time.monotonic() + max(ttl_s, alive_s) + 2.0
    # a trainer waiting in get_batch ends at the stop (RunStopped); one that goes on would
    # put the run back (it restores a run whose keys are gone), so it must be gone first
    while (live_producers(client, keys) or _live_batchers(client, keys)) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    trainers = _live_batchers(client, keys)
    if trainers:
        print(f"error: run {keys.run}: not reset: a trainer still runs (batcher "
              f"{', '.join(trainers)}), and it would put the run back; the run is stopped: "
              "end the trainer, then reset again", file=sys.stderr)
        return 1
    left = len(live_producers(client, keys))
    deleted = 0
    names = list(client.scan_iter(match=keys.pattern(), count=1000))
    for i in range(0, len(names), 500):
        deleted += int(client.delete(*names[i : i + 500]))
    note = f"; {left} producer(s) did not leave in time" if left else ""
    print(f"run {keys.run}: reset, {deleted} keys deleted{note}")
    return 0


def _live_batchers(client: SyncClient, keys: Keys) -> dict[str, int]:
    """Consumer -> ms its liveness key has left, for every batcher whose key is fresh (not
    missing, not `closed`): found by the keys themselves, which a training batcher keeps
    fresh however long its step (its state record is written only by get_batch)."""
    prefix = keys.batcher_alive("")
    out: dict[str, int] = {}
    for name in client.scan_iter(match=keys.batchers_alive_pattern(), count=1000):
        name = _text(name)
        value, ttl_ms = client.get(name), client.pttl(name)
        if value is not None and value != BATCHER_CLOSED:
            out[name[len(prefix):]] = max(0, int(ttl_ms))
    return out


def _status(client: SyncClient, keys: Keys, config: RolloutConfig,
            args: argparse.Namespace) -> int:
    """The run's state: text, or JSON (`--json`); refreshed with `--watch`. Says which
    Redis node holds the run (and warns when it has fewer replicas than `min_replicas`)."""
    from rollstream.status.render import render_text
    from rollstream.status.snapshot import snapshot
    from rollstream.status.warnings import Limits
    from rollstream.status.watch import watch

    limits = Limits(wait_warn_s=args.wait_warn_s, redis_limit_mb=args.redis_limit_mb)

    def take() -> dict:
        snap = snapshot(client, keys, config, limits)
        location = locate(client, keys)
        snap["node"] = str(location)
        note = _replica_note(config, location)
        if note:
            snap["warnings"].append(note.removeprefix("; warning: "))
        return snap

    if not args.watch:
        snap = take()
        print(json.dumps(snap) if args.json else render_text(snap))
        return 0
    return watch(take, sys.stdout, as_json=args.json, live=sys.stdout.isatty(),
                 interval_s=args.interval_s, count=args.count)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


if __name__ == "__main__":
    sys.exit(main())
