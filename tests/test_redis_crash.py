"""Redis itself crashes (SIGKILL) and comes back from its AOF: producers and the batcher ride
it out with backoff, and no committed trajectory is lost or delivered twice."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import pytest
import redis
from helpers import ProducerThread, publish, run_cli_here, small_config, wait_for
from proxy import RedisProxy

from consumer import Batcher
from producers.producer import Producer
from rollstream.embedded import EmbeddedRedis

pytestmark = pytest.mark.slow


class Rig(NamedTuple):
    server: EmbeddedRedis
    url: str
    client: redis.Redis
    batcher: Batcher
    producer: ProducerThread


@contextmanager
def rig(run: str, *, appendonly: bool, alive_ttl_ms: int = 10_000,
        **config: Any) -> Iterator[Rig]:
    """An embedded Redis of this test's own (to kill and restart), a Batcher of `run` on
    `small_config(**config)` and a producer thread; all stopped at the end."""
    server = EmbeddedRedis(appendonly=appendonly)
    url = server.start()
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=1)
    producer = None
    try:
        batcher = Batcher(client, small_config(**config), run=run, block_ms=200,
                          alive_ttl_ms=alive_ttl_ms)
        producer = ProducerThread(Producer(url, run, handle_signals=False,
                                           poll_interval_s=0.05)).start()
        yield Rig(server, url, client, batcher, producer)
    finally:
        if producer is not None and producer.thread.is_alive():
            producer.stop()
        client.close()
        server.stop()


def test_redis_sigkill_mid_step_loses_and_doubles_nothing():
    server = EmbeddedRedis(appendonly=True)
    url = server.start()
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=1)
    proxy = RedisProxy(url).start()  # the producer's requests pass it: a commit can be held
    producer = None
    done = threading.Event()
    try:
        # sync, every group in every batch: step s must deliver episode s of all 16 envs
        config = small_config(rollout_batch_size=16, lease_ttl_s=4.0,
                              policy={"type": "random", "latency_s": 0.05})
        batcher = Batcher(client, config, run="crash", block_ms=200)
        producer = ProducerThread(Producer(proxy.url, "crash", handle_signals=False,
                                           poll_interval_s=0.05)).start()
        delivered: list[str] = []

        def crash_and_restart() -> None:
            if not proxy.held.wait(60):
                return
            server.kill()  # mid-step: group 0's episode 2 was played, its commit is held
            time.sleep(0.5)  # down: every connection of both sides broke with the kill
            server.start()
            done.wait(120)  # PDEATHSIG follows the thread that started the server: stay

        crasher = threading.Thread(target=crash_and_restart, daemon=True)
        for step in range(5):
            if step == 2:
                proxy.hold(b"train-0-2-")
                crasher.start()
            batch = batcher.get_batch("train", timeout_s=60)
            assert set(batch.episode_ids.tolist()) == {step}
            assert sorted(batch.traj_ids) == sorted(
                f"train-{g}-{step}-{m}" for g in range(4) for m in range(4))
            delivered += batch.traj_ids
            batcher.ack(batch)
            publish(batcher)
        assert proxy.held.is_set()
        assert len(delivered) == len(set(delivered)) == 5 * 16
        assert int(client.get("{crash}:version")) == 5
        assert producer.stop() == 0
    finally:
        done.set()
        if producer is not None and producer.thread.is_alive():
            producer.stop()
        proxy.close()
        client.close()
        server.stop()


@pytest.mark.parametrize("when", ["before get_batch", "before ack", "before publish"])
def test_redis_losing_all_data_heals_without_doubles(when):
    # no persistence: the restarted server is empty; the trainer puts back config, version and
    # groups, producers reclaim their shards, and nothing is delivered twice. Lost while the
    # trainer trains (before its ack or its publish), the publish puts them back: it raised
    # VersionConflict ("at version 0"), blaming another trainer
    with rig("amnesia", appendonly=False, rollout_batch_size=16, async_generation_ratio=1,
             lease_ttl_s=1.5) as (server, _, client, batcher, producer):
        delivered: list[str] = []
        versions: list[int] = []

        def lose_everything() -> None:
            server.kill()
            server.start()  # same folder, but nothing was saved
            # gone: only the trainer writes these (producers reconnect and write
            # heartbeats and leases at once, so the database itself need not stay empty)
            assert client.exists("{amnesia}:config", "{amnesia}:version") == 0

        for step in range(5):
            if step == 2 and when == "before get_batch":
                lose_everything()
            batch = batcher.get_batch("train", timeout_s=60)
            delivered += batch.traj_ids
            versions.append(batch.version)
            assert batch.metrics["scheduler/staleness/max"] <= 1
            if step == 2 and when == "before ack":
                lose_everything()
            batcher.ack(batch)
            if step == 2 and when == "before publish":
                lose_everything()
            publish(batcher)
        assert versions == [0, 1, 2, 3, 4]
        assert len(delivered) == len(set(delivered)) == 5 * 16
        assert int(client.get("{amnesia}:version")) == 5
        assert producer.stop() == 0


def test_redis_back_from_an_older_snapshot_does_not_take_the_run_back_in_time():
    """Redis restarts from an RDB snapshot two steps old (or an AOF without `appendfsync
    always`): the version, cursors, streams and acks go back. Followed, the trainer was handed
    episodes it had trained on and published versions 3 and 4 again for other weights (an
    audit: 88 trajectories delivered twice). The version goes back up; the lost steps'
    episodes expire."""
    with rig("snapshot", appendonly=False, rollout_batch_size=16, async_generation_ratio=1,
             lease_ttl_s=1.5) as (server, _, client, batcher, producer):
        delivered: list[str] = []
        versions: list[int] = []
        for step in range(6):
            if step == 4:
                server.kill()
                server.start()  # from the snapshot of step 2: version 2
                assert int(client.get("{snapshot}:version")) == 2
            batch = batcher.get_batch("train", timeout_s=60)
            delivered += batch.traj_ids
            versions.append(batch.version)
            batcher.ack(batch)
            publish(batcher)
            if step == 1:
                client.save()  # dump.rdb in the server's folder, read at its next start
        assert versions == [0, 1, 2, 3, 4, 5]
        assert len(delivered) == len(set(delivered)) == 6 * 16
        assert int(client.get("{snapshot}:version")) == 6
        assert producer.stop() == 0


def test_producers_that_outlived_their_runs_config_can_still_be_stopped():
    """Redis restarts without persistence while no trainer runs: the producers go on and
    write their heartbeats, leases and cursors again, but not the config. `status`, `stop`
    and `pause` said the run did not exist (exit 1), so only `reset` reached them."""
    with rig("orphan", appendonly=False, lease_ttl_s=1.5) as (server, url, client, batcher,
                                                                producer):
        batcher.ack(batcher.get_batch("train", timeout_s=30))
        batcher.close()  # the trainer ends
        server.kill()
        server.start()  # empty
        wait_for(lambda: client.zcard("{orphan}:producers") == 1,
                 what="the producer's heartbeat in the new Redis")
        assert not client.exists("{orphan}:config")
        status = run_cli_here("status", "--redis-url", url, "--run", "orphan")
        assert status.returncode == 1
        assert "has 1 live producer(s)" in status.stderr and "no config at" in status.stderr
        assert "rollstream stop --run orphan" in status.stderr
        paused = run_cli_here("pause", "--redis-url", url, "--run", "orphan")
        assert paused.returncode == 0 and "['operator']" in paused.stdout
        assert ", paused: operator) but no config" in run_cli_here(
            "status", "--redis-url", url, "--run", "orphan").stderr
        stopped = run_cli_here("stop", "--redis-url", url, "--run", "orphan")
        assert stopped.returncode == 0, stopped.stderr
        producer.thread.join(20)
        assert producer.result == [0]
        gone = run_cli_here("status", "--redis-url", url, "--run", "orphan")
        assert gone.returncode == 1 and "does not exist here" in gone.stderr


def test_ack_and_publish_ride_out_a_redis_restart(caplog):
    """Redis away between get_batch and ack, long enough that no beat of the batcher's
    liveness key lands (half its ttl): ack's name check does its GET then, and with
    publish_version retries until Redis is back (that GET raised ConnectionError and ended
    the trainer: a recheck audit)."""
    back = threading.Event()
    done = threading.Event()
    with rig("blip", appendonly=True, alive_ttl_ms=1000,
             lease_ttl_s=4.0) as (server, _, _, batcher, producer):
        try:
            batch = batcher.get_batch("train", timeout_s=30)
            server.kill()

            def restart() -> None:
                time.sleep(1.5)
                server.start()
                back.set()
                done.wait(60)  # PDEATHSIG follows the thread that started the server: stay

            threading.Thread(target=restart, daemon=True).start()
            wait_for(lambda: time.monotonic() - batcher._alive._beat_at > 0.6,
                     what="half a ttl with no beat landed")
            with caplog.at_level("WARNING", logger="schemas.backoff"):
                batcher.ack(batch)  # Redis is down here: retried until it is back
            assert "ack of a train batch: Error" in caplog.text  # it met the outage
            assert back.wait(10)
            assert batcher.publish_version() == 1
            assert set(batcher.get_batch("train", timeout_s=30).episode_ids.tolist()) == {1}
            assert producer.stop() == 0
        finally:
            done.set()
