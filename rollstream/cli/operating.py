"""The operator's commands on a run: `pause`, `resume`, `stop`, `reset` and `status`.

Each finds the run (flags, environment, `--config`), connects, and for all but `reset` reads
the run's published config first: a run without one, and without live producers, does not
exist here (exit 1). The status view itself is `rollstream/status/`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rollstream.cli.config import replica_note
from rollstream.cli.connect import connect, lookup, text
from rollstream.cli.errors import RunNotFound, UsageError
from schemas.config import RolloutConfig
from schemas.keys import BATCHER_CLOSED, Keys
from schemas.liveness import live_producers
from schemas.redisconn import SyncClient, locate, publish


def _open(args: argparse.Namespace) -> tuple[SyncClient, Keys]:
    url, run = lookup(args)
    return connect(url), Keys(run)


def pause(args: argparse.Namespace) -> int:
    """`rollstream pause`: add the operator's reason to the run's pause set."""
    return _operator_pause(args, paused=True)


def resume(args: argparse.Namespace) -> int:
    """`rollstream resume`: lift the operator's pause (other reasons stay)."""
    return _operator_pause(args, paused=False)


def _operator_pause(args: argparse.Namespace, paused: bool) -> int:
    client, keys = _open(args)
    _published_config(client, keys, needed=False)
    if paused:
        client.sadd(keys.pause, "operator")
    else:
        client.srem(keys.pause, "operator")
    publish(client, keys.control, b"pause")
    reasons = sorted(text(r) for r in client.smembers(keys.pause))
    print(f"run {keys.run}: pause reasons {reasons or 'none'}")
    return 0


def stop(args: argparse.Namespace) -> int:
    """`rollstream stop`: end the run; its producers exit."""
    client, keys = _open(args)
    _published_config(client, keys, needed=False)
    client.set(keys.stop, 1)
    publish(client, keys.control, b"stop")
    print(f"run {keys.run}: stopped; {len(live_producers(client, keys))} live "
          "producer(s) exit now (a trainer that starts the run again resumes it)")
    return 0


def status(args: argparse.Namespace) -> int:
    """`rollstream status [--json] [--watch]`."""
    client, keys = _open(args)
    config = _published_config(client, keys, needed=True)
    assert config is not None
    return _show_status(client, keys, config, args)


def reset(args: argparse.Namespace) -> int:
    """`rollstream reset [--yes]`."""
    client, keys = _open(args)
    return _reset(client, keys, args.yes)


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
    paused = sorted(text(r) for r in client.smembers(keys.pause))
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
        name = text(name)
        value, ttl_ms = client.get(name), client.pttl(name)
        if value is not None and value != BATCHER_CLOSED:
            out[name[len(prefix):]] = max(0, int(ttl_ms))
    return out


def _show_status(client: SyncClient, keys: Keys, config: RolloutConfig,
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
        note = replica_note(config, location)
        if note:
            snap["warnings"].append(note.removeprefix("; warning: "))
        return snap

    if not args.watch:
        snap = take()
        print(json.dumps(snap) if args.json else render_text(snap))
        return 0
    return watch(take, sys.stdout, as_json=args.json, live=sys.stdout.isatty(),
                 interval_s=args.interval_s, count=args.count)
