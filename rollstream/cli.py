"""The `rollstream` command line.

    rollstream config check FILE [--json]      the env layout of a config
    rollstream up --config FILE [...]          Redis + producers + a trainer loop, locally
    rollstream train --config FILE --redis-url URL [...]   only the trainer loop
    rollstream produce --redis-url URL --run NAME [--max-shards K]
    rollstream pause | resume                  the operator's pause of a run's train rollouts
    rollstream status                          version, pause, producers, stream backlog

Exit status: 0 ok, 1 a runtime failure (one line on stderr), 2 a bad command line or config.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

import redis

from schemas.config import RolloutConfig, resolve_redis_url, resolve_run
from schemas.errors import ConfigError, RollstreamError
from schemas.keys import CONSUMER_GROUP, Keys

logger = logging.getLogger("rollstream")


class UsageError(Exception):
    """A bad command line: exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollstream", description=__doc__.split("\n")[0])
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    config = sub.add_parser("config", help="inspect a config file")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config and print its layout")
    check.add_argument("file")
    check.add_argument("--json", action="store_true", help="print the layout as JSON")

    up = sub.add_parser("up", help="run Redis, producers and a trainer loop here")
    train = sub.add_parser("train", help="only the stand-in trainer loop; producers elsewhere")
    for parser_ in (up, train):
        parser_.add_argument("--config", required=True, help="rollout config YAML")
        _redis_args(parser_)
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
    up.add_argument("--producers", type=_positive_int, default=None,
                    help="producer processes (default: enough for the shards, at most cores)")

    produce = sub.add_parser("produce", help="run a producer process")
    _redis_args(produce)
    produce.add_argument("--max-shards", type=_positive_int, default=None,
                         help="hold at most K shards")
    produce.add_argument("--seconds", type=_positive_float, default=None,
                         help="exit after S seconds")
    produce.add_argument("--check", action="store_true",
                         help="exit 0 if a producer of this host has a fresh heartbeat, else 1 "
                              "(a healthcheck)")

    from rollstream.fake_llm import add_arguments as fake_llm_arguments
    fake_llm_arguments(sub.add_parser("fake-llm", help="a stand-in OpenAI-compatible LLM "
                                      "server (scripted replies, latency, faults)"))

    for name, text in (("pause", "pause train rollouts (reason: operator)"),
                       ("resume", "lift the operator's pause"),
                       ("status", "print the run's state")):
        _redis_args(sub.add_parser(name, help=text))
    return parser


def _redis_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", default=None,
                        help="redis://, rediss:// or unix:// URL (env ROLLSTREAM_REDIS_URL, "
                             "REDIS_URL)")
    parser.add_argument("--run", default=None, help="run name (env ROLLSTREAM_RUN)")


def _number(kind: type, check: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        ok = value > 0 if check == "positive" else value >= 0
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r} must be {check}")
        return value
    return parse


_positive_int = _number(int, "positive")
_nonneg_int = _number(int, "non-negative")
_positive_float = _number(float, "positive")
_nonneg_float = _number(float, "non-negative")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with a usage message on a bad command line
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(args)
    except (UsageError, ConfigError) as exc:
        print(f"rollstream: error: {exc}", file=sys.stderr)
        return 2
    except (RollstreamError, redis.RedisError) as exc:
        print(f"rollstream: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "config":
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
    layout = config.layout()
    if args.json:
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
    return 0


def _client(url: str | None) -> redis.Redis:
    if not url:
        raise UsageError("no Redis URL: pass --redis-url or set ROLLSTREAM_REDIS_URL")
    try:
        return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
    except ValueError as exc:
        raise UsageError(f"bad Redis URL {url!r}: {exc}") from None


def _up(args: argparse.Namespace) -> int:
    from rollstream.launcher import UpOptions, train, up

    config = _load_checked(args.config)
    url = resolve_redis_url(args.redis_url, config)
    if url or args.command == "train":
        _client(url).close()  # checks the URL's form before anything starts
    opts = UpOptions(config=config, redis_url=url, run=resolve_run(args.run, config),
                     producers=getattr(args, "producers", None), steps=args.steps,
                     seconds=args.seconds, train_step_s=args.train_step_s,
                     timeout_s=args.timeout_s, val_every=args.val_every,
                     log_level=args.log_level)
    return up(opts) if args.command == "up" else train(opts)


def _produce(args: argparse.Namespace) -> int:
    from producers.producer import Producer

    url = resolve_redis_url(args.redis_url)
    if args.check:
        return _check_producer(_client(url), Keys(resolve_run(args.run)))
    _client(url).close()
    assert url is not None
    producer = Producer(url, resolve_run(args.run), max_shards=args.max_shards,
                        seconds=args.seconds)
    return producer.run()


def _check_producer(client: redis.Redis, keys: Keys) -> int:
    """Healthcheck: a producer id of this host with a heartbeat within one lease ttl."""
    import socket

    raw = client.get(keys.config)
    if raw is None:
        print(f"run {keys.run}: no config published yet")
        return 1
    ttl_ms = RolloutConfig.from_json(raw).lease_ttl_s * 1000
    server_time: tuple[int, int] = client.time()  # type: ignore[assignment]
    now_ms = server_time[0] * 1000 + server_time[1] // 1000
    prefix = socket.gethostname() + "-"
    beats: list[tuple[bytes, float]] = client.zrange(  # type: ignore[assignment]
        keys.producers, 0, -1, withscores=True)
    fresh = [_text(member) for member, score in beats
             if _text(member).startswith(prefix) and now_ms - score <= ttl_ms]
    print(f"run {keys.run}: {len(fresh)} live producer(s) on this host")
    return 0 if fresh else 1


def _admin(args: argparse.Namespace) -> int:
    client = _client(resolve_redis_url(args.redis_url))
    keys = Keys(resolve_run(args.run))
    if args.command in ("pause", "resume"):
        if args.command == "pause":
            client.sadd(keys.pause, "operator")
        else:
            client.srem(keys.pause, "operator")
        client.publish(keys.control, b"pause")
        reasons = sorted(_text(r) for r in client.smembers(keys.pause))
        print(f"run {keys.run}: pause reasons {reasons or 'none'}")
        return 0
    return _status(client, keys)


def _status(client: redis.Redis, keys: Keys) -> int:
    raw = client.get(keys.config)
    if raw is None:
        print(f"run {keys.run}: no config published")
        return 1
    config = RolloutConfig.from_json(raw)
    print(f"run {keys.run}: version {int(client.get(keys.version) or 0)}, "
          f"val round {int(client.get(keys.val_round) or 0)}, pause reasons "
          f"{sorted(_text(r) for r in client.smembers(keys.pause)) or 'none'}, "
          f"producers {client.zcard(keys.producers)}")
    for mode in config.modes():
        manager = config.manager(mode)
        pipe = client.pipeline(transaction=False)
        for g in range(manager.num_env_groups):
            pipe.xlen(keys.stream(mode, g))
        backlog = sum(pipe.execute())
        pipe = client.pipeline(transaction=False)
        for s in range(manager.num_shards):
            pipe.exists(keys.lease(mode, s))
        held = sum(pipe.execute())
        print(f"  {mode}: {backlog} entries in streams, {held}/{manager.num_shards} shards "
              f"leased, consumer group {CONSUMER_GROUP!r}")
    return 0


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


if __name__ == "__main__":
    sys.exit(main())
