"""The commands that run a rollout: `up` (Redis, producers and the stand-in trainer here),
`up --trainer SCRIPT` (the same with the user's script), `train` (only the stand-in trainer)
and `produce` (one producer process; `--check`, its healthcheck).

Each checks what a user can get wrong (flags, config, URL, ports, the plot's folder) before
anything starts, then hands over to `rollstream/launcher.py` or the `Producer`.
"""

from __future__ import annotations

import argparse

from rollstream.cli.config import load_checked
from rollstream.cli.connect import connect, lookup
from rollstream.cli.errors import UsageError
from schemas.config import RolloutConfig, resolve_redis_url, resolve_run
from schemas.keys import Keys
from schemas.liveness import live_producers
from schemas.redisconn import SyncClient, check_url


def up(args: argparse.Namespace) -> int:
    from rollstream import launcher
    from rollstream.trainer import UpOptions

    if getattr(args, "trainer", None) is not None:
        return up_trainer(args)
    if not args.config:
        raise UsageError("up needs --config FILE (or --trainer SCRIPT)")
    config = load_checked(args.config)
    if args.command == "up":
        _check_local_key(config)
    url = resolve_redis_url(args.redis_url, config)
    if url or args.command == "train":
        connect(url).close()  # checks the URL and the server before anything starts
    if args.plot:
        _check_plot(args.plot)
    if args.record:
        _check_record(args.record)
    if args.metrics_port == 0:
        raise UsageError(f"{args.command} --metrics-port needs a fixed port (0 picks one at "
                         "random; Prometheus could not find it)")
    opts = UpOptions(config=config, redis_url=url, run=resolve_run(args.run, config),
                     producers=getattr(args, "producers", None), steps=args.steps,
                     seconds=args.seconds, train_step_s=args.train_step_s,
                     timeout_s=args.timeout_s, val_every=args.val_every,
                     log_level=args.log_level, metrics_port=args.metrics_port,
                     metrics_addr=args.metrics_addr, plot=args.plot, record=args.record)
    return launcher.up(opts) if args.command == "up" else launcher.train(opts)


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


def _check_record(path: str) -> None:
    """Before a run that records: pyarrow is there and DIR is (or can be) a folder."""
    import os

    from consumer.store import _pyarrow

    _pyarrow()
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--record {path}: a file, not a folder")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(path) and not os.access(parent, os.W_OK):
        raise UsageError(f"--record {path}: cannot make the folder in {parent}")


def up_trainer(args: argparse.Namespace) -> int:
    """`up --trainer`: the user's script instead of the stand-in trainer loop."""
    import os
    import shlex

    from rollstream import launcher

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
        ("--plot", args.plot, None), ("--record", args.record, None))
        if value != default]
    if stand_in:
        raise UsageError(f"{', '.join(stand_in)}: flags of the stand-in trainer, not of "
                         "--trainer (pass them to your script)")
    config = load_checked(args.config) if args.config else None
    if config is not None:
        _check_local_key(config)
    url = resolve_redis_url(args.redis_url, config)
    if url:
        connect(url).close()  # checks the URL's form before anything starts
    producers = args.producers or (launcher.default_producers(config) if config
                                   else os.cpu_count() or 1)
    if args.metrics_port == 0:
        raise UsageError("up --metrics-port needs a fixed port (the producers take the next "
                         "ones)")
    return launcher.up_trainer(script, url, resolve_run(args.run, config), producers,
                               args.log_level, config_path=args.config,
                               metrics_port=args.metrics_port, metrics_addr=args.metrics_addr)


def produce(args: argparse.Namespace) -> int:
    from producers.producer import Producer, tune_gc

    url, run = lookup(args)
    if args.check:
        return _check_producer(connect(url), Keys(run))
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
