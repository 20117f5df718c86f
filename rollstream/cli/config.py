"""`rollstream config check` and `config show`; and `load_checked`, the config loading `up`
and `train` share with `config check` (one env of each tag built and reset)."""

from __future__ import annotations

import argparse
import json
import sys

from rollstream.cli.connect import connect
from schemas.config import RolloutConfig, resolve_run
from schemas.errors import ConfigError
from schemas.keys import Keys
from schemas.policy import PythonPolicyConfig
from schemas.redisconn import Location, locate


def command(args: argparse.Namespace) -> int:
    """`rollstream config show|check`."""
    if args.config_command == "show":
        return show(args)
    return check(args)


def show(args: argparse.Namespace) -> int:
    text = RolloutConfig.from_yaml(args.file).to_yaml()
    print(f"# {args.file} as rollstream resolved it (a plain rollstream config)\n{text}",
          end="")
    return 0


def load_checked(path: str) -> RolloutConfig:
    """The config, with one env of each tag built and reset (bad env settings fail here)."""
    from producers.envs import check_envs

    config = RolloutConfig.from_yaml(path)
    try:
        check_envs(config)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return config


def check(args: argparse.Namespace) -> int:
    config = load_checked(args.file)
    _check_group_filters(args.file, config)
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
        print(f"run {run}: {location}{replica_note(config, location)}")
    return 0


def _check_group_filters(path: str, config: RolloutConfig) -> None:
    """A `group_filter_cls` that does not import or build here is an error (exit 2): the
    trainer builds it, and this is where a trainer runs."""
    from consumer.filters import build_group_filters

    try:
        build_group_filters(config)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


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
    client = connect(url)
    try:
        return locate(client, Keys(run))
    finally:
        client.close()


def replica_note(config: RolloutConfig, location: Location) -> str:
    """A warning when `min_replicas` asks for more replicas than the run's node has."""
    if config.min_replicas <= location.replicas:
        return ""
    return (f"; warning: min_replicas {config.min_replicas} but {location.replicas} online: "
            "commits, acks and version publishes wait until enough replicas are back")
