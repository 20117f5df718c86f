"""A producer ends when it is told to, not at its next lease beat (a third of the lease ttl):

- `seconds` (`rollstream produce --seconds`) even while it is still claiming shards: a claim
  pass may last a third of the lease ttl, and a producer of a thousand envs given 1 s ran
  2.9 s claiming the rest of its 64 shards;
- a run's stop (`rollstream stop`): the lease loop looked at it only at its next beat, up to
  3.3 s later at the default 10 s ttl (the compose test's producer waited ~3 s);
- a stop or `seconds` while Redis is unreachable at its start: the backoff's sleep (up to
  5 s) ran to its end (`produce --seconds 3` took 4.9-5.8 s)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from helpers import free_port, slow_build_config, small_config, wait_for

from consumer import Batcher
from producers.lifetime import Lifetime
from producers.startup import Startup
from schemas.keys import Keys


def test_seconds_ends_a_producer_midway_through_its_claims(r, run, producer_thread,
                                                           caplog) -> None:
    # 30 shards of 4 envs that take 25 ms each to build: claiming them all takes 3 s or more
    # (sleeps, whatever the machine's speed), within one pass of a 30 s ttl; given 0.3 s the
    # producer stops claiming at its deadline
    config = slow_build_config(lease_ttl_s=30.0, groups=60)
    shards = config.train_env_manager.num_shards
    assert shards == 30
    Batcher(r, config, run=run)
    caplog.set_level(logging.INFO, logger="producers.shard_runner")
    thread = producer_thread(seconds=0.3)
    thread.thread.join(60)
    assert not thread.thread.is_alive() and thread.result == [0]
    # (none at all when its start took the whole 0.3 s, on a loaded machine: on time too)
    claimed = [rec for rec in caplog.records if rec.getMessage().startswith("claimed shard")]
    assert len(claimed) < shards // 2, f"{len(claimed)} of {shards} shards claimed"


def test_a_runs_stop_ends_a_producer_before_its_next_lease_beat(r, run, producer_thread) -> None:
    # a 30 s ttl: the lease loop beats every 10 s; the stop comes just after the first beat
    # (its claims), so a loop that looks only when it beats ends ~10 s later
    config = small_config(lease_ttl_s=30.0)
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    shards = [keys.lease("train", s) for s in range(config.train_env_manager.num_shards)]
    wait_for(lambda: all(r.mget(shards)), what="the producer's claims (its first beat)")
    batcher.stop_run()
    stopped = time.monotonic()
    thread.thread.join(20)
    assert not thread.thread.is_alive() and thread.result == [0]
    assert time.monotonic() - stopped < 5, "ended at its next beat, not at the stop"


@pytest.mark.parametrize("how", ["stop", "seconds"])
def test_a_producer_retrying_an_unreachable_redis_ends_mid_backoff(run, how, monkeypatch):
    # no jitter: the backoff sleeps 0.1, 0.2, 0.4, then 0.8 s from 0.7 s on; told to end at
    # 0.75 s, a sleep that runs to its end returns at 1.5 s
    monkeypatch.setattr("schemas.backoff.random.uniform", lambda low, high: high)
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there: refused at once

    async def connect() -> tuple[object, float]:
        life = Lifetime(asyncio.Event())
        if how == "stop":
            asyncio.get_running_loop().call_later(0.75, life.stop.set)
        else:
            life.deadline = time.monotonic() + 0.75
        started = time.monotonic()
        client = await Startup(url, Keys(run), "p", life).connect()
        return client, time.monotonic() - started

    client, took = asyncio.run(connect())
    assert client is None
    assert took < 1.2, f"ended after {took:.2f} s: the backoff's sleep ran to its end"
