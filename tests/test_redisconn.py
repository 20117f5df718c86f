"""The connection layer: URL forms and their errors, acknowledged-means-replicated
(`min_replicas`), and a producer that stops when a background loop dies.

The replication tests run a real primary with a real replica on loopback and make the
replica fall behind on cue (SIGSTOP), so a WAIT really falls short."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis
from helpers import (
    ONE_STEP_ENV_ID,
    ProducerThread,
    clean_env,
    record_acknowledged,
    run_cli,
    small_config,
    wait_for,
)
from proxy import RedisProxy
from redis_servers import LocalSentinel, Node, redis_server_7

from consumer import Batcher
from producers.producer import Producer
from schemas.errors import BatchTimeout, NotReplicated
from schemas.keys import Keys
from schemas.redisconn import (
    RedisUrlError,
    ReplicaWait,
    check_url,
    mask_url,
    parse_sentinel_url,
)


# -- URLs ------------------------------------------------------------------------------------
def test_the_sentinel_url_form():
    parsed = parse_sentinel_url(
        "redis+sentinel://:s3cret@10.0.0.1:26380,10.0.0.2/mymaster/2?socket_timeout=3")
    assert parsed.sentinels == [("10.0.0.1", 26380), ("10.0.0.2", 26379)]
    assert (parsed.service, parsed.db, parsed.password, parsed.ssl) == ("mymaster", 2, "s3cret",
                                                                        False)
    assert parsed.options == {"socket_timeout": 3.0}
    assert parse_sentinel_url("rediss+sentinel://h/svc").ssl
    assert mask_url("redis+sentinel://u:s3cret@h1:1,h2:2/svc/0") == \
        "redis+sentinel://u:***@h1:1,h2:2/svc/0"


@pytest.mark.parametrize("url, says", [
    ("redis://127.0.0.1:6379?cluster=true", "unknown option 'cluster'"),
    ("redis://127.0.0.1:6379/0?password=x", "user part"),
    ("redis+sentinel:///mymaster", "no sentinel host"),
    ("redis+sentinel://h1:26379", "/SERVICE"),
    ("redis+sentinel://h1:port/mymaster", "bad sentinel address 'h1:port'"),
    ("redis+sentinel://h1/mymaster/zero", "database 'zero'"),
    ("redis+sentinel://:pw@h1/mymaster?cluster=1", "unknown option 'cluster'"),
])
def test_bad_urls_name_the_problem(url, says):
    with pytest.raises(RedisUrlError) as raised:
        check_url(url)
    assert says in str(raised.value)
    assert "pw" not in str(raised.value).replace("password", "")


def test_known_url_options_pass():
    assert check_url("redis://h:1/0?socket_timeout=2&health_check_interval=5")
    assert check_url("rediss://h:1/0?ssl_cert_reqs=none")
    assert check_url("unix:///tmp/redis.sock?db=1")


@pytest.mark.parametrize("command", [["status"], ["pause"], ["produce"]])
def test_a_cluster_flag_in_the_url_is_a_clear_error_with_exit_2(command):
    out = run_cli(*command, "--redis-url", "redis://:hidden@127.0.0.1:1/0?cluster=true",
                  "--run", "x", timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown option 'cluster'" in lines[0], out.stderr
    assert "hidden" not in out.stderr and "Traceback" not in out.stderr


# -- a producer does not run on blind --------------------------------------------------------
def test_a_producer_whose_control_loop_dies_exits_1(r, run, producer_thread):
    keys = Keys(run)
    Batcher(r, small_config(), run=run)
    producer = producer_thread()
    wait_for(lambda: producer.producer.committed > 0, what="the producer to commit")
    r.set(keys.version, b"not-a-number")  # what no trainer writes: the control poll fails
    producer.thread.join(30)
    assert not producer.thread.is_alive(), "the producer ran on without its control loop"
    assert producer.result == [1]
    producer.producer.request_stop()  # asking an ended producer to stop is harmless


# -- acknowledged means replicated -----------------------------------------------------------
@pytest.fixture
def replicated() -> Iterator[LocalSentinel]:
    """A primary and one replica (no sentinels), both redis-server processes on loopback."""
    if redis_server_7() is None:
        pytest.skip("no redis-server 7.0+ on PATH to run a primary with a replica")
    with LocalSentinel(replicas=1, sentinels=0) as setup:
        yield setup


class Stopped:
    """SIGSTOP a replica (it stays connected, but acknowledges nothing) until `resume`."""

    def __init__(self, node: Node):
        self.node = node

    def __enter__(self) -> Stopped:
        assert self.node.process is not None
        os.kill(self.node.process.pid, signal.SIGSTOP)
        return self

    def resume(self) -> None:
        if self.node.process is not None and self.node.process.poll() is None:
            os.kill(self.node.process.pid, signal.SIGCONT)

    def __exit__(self, *exc: object) -> None:
        self.resume()


def replicated_config(**overrides):
    overrides.setdefault("min_replicas", 1)
    overrides.setdefault("replica_timeout_ms", 200)
    overrides.setdefault("rollout_batch_size", 16)
    return small_config(val_env_manager=None, **overrides)


def stream_total(client: redis.Redis, keys: Keys, groups: int) -> int:
    return sum(client.xlen(keys.stream("train", g)) for g in range(groups))


@pytest.mark.slow
def test_commits_count_only_once_a_replica_has_them(replicated, monkeypatch):
    told = record_acknowledged(monkeypatch)
    keys = Keys("repl")
    client = redis.Redis.from_url(replicated.primary_url, socket_timeout=5)
    Batcher(client, replicated_config(), run=keys.run)
    producer = None
    with Stopped(replicated.data[1]) as replica:
        producer = ProducerThread(Producer(replicated.primary_url, keys.run,
                                           handle_signals=False, poll_interval_s=0.05)).start()
        wait_for(lambda: getattr(producer.producer, "committer", None) is not None
                 and producer.producer.committer.unreplicated >= 2,
                 what="commits held for want of a replica")
        assert stream_total(client, keys, 4) > 0  # the primary has them ...
        assert told == [] and producer.producer.committed == 0  # ... nobody was told so
        replica.resume()
        # the resends are answered DUPLICATE (the cursor is past them), then replicated;
        # sync, nothing handed out: each of the 16 envs plays its episode 0, once
        wait_for(lambda: len(told) == 16, what="the held commits to be acknowledged")
    assert sorted(told) == sorted(f"train-{g}-0-{m}" for g in range(4) for m in range(4))
    assert producer.producer.committed == 16  # the first sends wrote them: counted once
    assert stream_total(client, keys, 4) == 16
    assert producer.stop() == 0
    client.close()


@pytest.mark.slow
def test_a_resend_answered_duplicate_waits_for_replicas_too(replicated, monkeypatch):
    # the commit runs while the replica is stopped and its reply is lost with the
    # connection; the resend writes nothing (DUPLICATE): it must not count until the
    # replica has the lost commit's write
    told = record_acknowledged(monkeypatch)
    keys = Keys("dup")
    client = redis.Redis.from_url(replicated.primary_url, socket_timeout=5)
    # one env, one one-step episode admitted, heartbeats 10 s apart: between the replica's
    # stop and the resend, the producer writes nothing but that commit
    config = replicated_config(
        replica_timeout_ms=300, rollout_batch_size=1, lease_ttl_s=30,
        custom_envs={"OneStep": {"env_id": ONE_STEP_ENV_ID}},
        train_env_manager={"num_env_groups": 1, "group_size": 1, "max_env_num_per_worker": 8,
                           "tags": ["OneStep"]})
    Batcher(client, config, run=keys.run)
    marker = f"{keys.prefix}:traj:train:".encode()
    with RedisProxy(replicated.primary_url) as proxy:
        proxy.hold(marker)
        producer = ProducerThread(Producer(proxy.url, keys.run, handle_signals=False,
                                           poll_interval_s=0.05)).start()
        assert proxy.held.wait(20), "the producer never committed"
        client.set(f"{keys.prefix}:probe", 1)  # the replica has every write made so far
        assert client.execute_command("WAIT", 1, 5000) == 1
        with Stopped(replicated.data[1]) as replica:
            proxy.lose_reply(then_hold=marker)  # it ran in Redis, not on the replica
            assert stream_total(client, keys, 1) == 1
            assert proxy.held.wait(20), "the commit whose reply was lost was never resent"
            short = producer.producer.committer.unreplicated
            proxy.release()  # the resend: DUPLICATE, then its WAIT
            wait_for(lambda: told or producer.producer.committer.unreplicated > short,
                     what="the resend's answer")
            assert told == [], "acknowledged while only the primary had it"
            replica.resume()
            wait_for(lambda: told == ["train-0-0-0"], what="the commit to be acknowledged")
        assert stream_total(client, keys, 1) == 1
        assert producer.stop() == 0
    client.close()


@pytest.mark.slow
def test_a_wait_covers_writes_made_on_other_connections(replicated):
    # A resend that wrote nothing (DUPLICATE) goes out on any pooled connection; its WAIT
    # must cover the lost commit written on another connection. Redis up to 7.0 (this
    # machine's) stamps a connection's WAIT offset after every command, so any WAIT covers
    # all earlier writes; servers that stamp it only after a propagated write would confirm
    # such a resend at once. The wait mark (a write right before the WAIT) covers both.
    keys = Keys("mark")
    pooled = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(
        replicated.primary_url, max_connections=1, socket_timeout=5))  # one connection
    other = redis.Redis.from_url(replicated.primary_url, socket_timeout=5)
    pooled.set(f"{keys.prefix}:old", 1)
    assert pooled.execute_command("WAIT", 1, 5000) == 1
    wait = ReplicaWait(pooled, keys, replicas=1, timeout_ms=200)
    with Stopped(replicated.data[1]):
        other.set(f"{keys.prefix}:lost", 1)  # the write whose reply was lost
        pipe = pooled.pipeline(transaction=False)
        pipe.get(f"{keys.prefix}:lost")  # the resend: it writes nothing
        sent_to = wait.queue(pipe)
        assert wait.shortfall(sent_to, pipe.execute()) == "on 0 of 1 replica(s) after 200 ms"
    pipe = pooled.pipeline(transaction=False)
    sent_to = wait.queue(pipe)
    assert wait.shortfall(sent_to, pipe.execute()) is None  # the replica caught up
    pooled.close()
    other.close()


@pytest.mark.slow
def test_acks_and_version_publishes_wait_for_replicas(replicated):
    keys = Keys("acks")
    client = redis.Redis.from_url(replicated.primary_url, socket_timeout=5)
    config = replicated_config(min_replicas=0)
    Batcher(client, config, run=keys.run)  # the run's config, published without waiting
    producer = ProducerThread(Producer(replicated.primary_url, keys.run, handle_signals=False,
                                       poll_interval_s=0.05)).start()
    batcher = Batcher(client, replicated_config(), run=keys.run, publish_config=False,
                      write_timeout_s=1.0)
    batch = batcher.get_batch("train", timeout_s=30)
    with Stopped(replicated.data[1]) as replica:
        started = time.monotonic()
        with pytest.raises(NotReplicated, match="ack of a train batch not acknowledged"):
            batcher.ack(batch)
        assert time.monotonic() - started >= 1.0  # retried for write_timeout_s first
        with pytest.raises(NotReplicated, match="publish of version 1"):
            batcher.publish_version()
        assert batcher.version == 0  # not counted as published
        replica.resume()
        batcher.ack(batch)  # both are safe to call again
        assert batcher.publish_version() == 1
    assert client.get(keys.version) == b"1"
    assert batcher.unreplicated >= 2
    assert producer.stop() == 0
    client.close()


@pytest.mark.slow
def test_a_batch_is_handed_out_only_once_replicas_hold_it(replicated):
    """Producers' XADDs reach the primary before their WAIT; a batch read from the primary
    alone could be lost in a failover and then committed again by the resend: delivered
    twice. The hand-out's own write waits for replicas, and that covers the batch."""
    keys = Keys("handout")
    client = redis.Redis.from_url(replicated.primary_url, socket_timeout=5)
    batcher = Batcher(client, replicated_config(), run=keys.run)  # write_timeout_s 60
    producer = None
    with Stopped(replicated.data[1]) as replica:
        producer = ProducerThread(Producer(replicated.primary_url, keys.run,
                                           handle_signals=False, poll_interval_s=0.05)).start()
        wait_for(lambda: stream_total(client, keys, 4) == 16,
                 what="every group complete on the primary")
        assert producer.producer.committed == 0  # held: no replica has them
        started = time.monotonic()
        with pytest.raises(BatchTimeout, match="a batch is ready, but hand-out of a train "
                                               "batch not acknowledged: on 0 of 1"):
            batcher.get_batch("train", timeout_s=2)
        assert time.monotonic() - started < 10  # its own timeout, not write_timeout_s
        assert not client.sismember(keys.pause, "sync")  # nothing handed out: not paused
        replica.resume()
        batch = batcher.get_batch("train", timeout_s=30)  # the same groups, now replicated
    assert sorted(batch.traj_ids) == sorted(f"train-{g}-0-{m}" for g in range(4)
                                            for m in range(4))
    batcher.ack(batch)
    assert producer.stop() == 0
    client.close()


@pytest.mark.slow
def test_sentinels_that_want_a_password_say_so(tmp_path):
    """redis-py folds each sentinel's NOAUTH into "No master found": the commands said the
    server cannot be reached (exit 1), as if the sentinels were down."""
    if redis_server_7() is None:
        pytest.skip("no redis-server 7.0+ on PATH to run sentinels")
    with LocalSentinel(replicas=0, sentinels=1, sentinel_password="sentPW") as setup:
        sentinel = setup.sentinels[0]
        admin = redis.Redis(port=sentinel.port, password="sentPW")

        def connections() -> int:
            return int(admin.info("stats")["total_connections_received"])

        env = {**clean_env(), "ROLLSTREAM_SENTINEL_PASSWORD": "wrong"}
        for extra in ({}, env):
            before = connections()
            out = run_cli("status", "--redis-url", setup.url, "--run", "x", env=extra or None)
            assert out.returncode == 1, out.stderr
            assert "refused the credentials" in out.stderr, out.stderr
            assert "ROLLSTREAM_SENTINEL_PASSWORD" in out.stderr and "wrong" not in out.stderr
            # asked once, not again with backoff (redis-py retries its AuthenticationError,
            # a ConnectionError, 10 times: the line came after ~4 s)
            assert connections() - before == 1, connections() - before
        # a producer's asyncio client too (its MasterNotFoundError is another class)
        before = connections()
        out = run_cli("produce", "--redis-url", setup.url, "--run", "x", "--seconds", "20",
                      env={**clean_env(), "ROLLSTREAM_SENTINEL_PASSWORD": "wrong"})
        assert out.returncode == 1 and "refused the credentials" in out.stderr, out.stderr
        assert "retrying" not in out.stderr, out.stderr
        assert connections() - before == 1, connections() - before
        admin.close()
        right = {**clean_env(), "ROLLSTREAM_SENTINEL_PASSWORD": "sentPW"}
        out = run_cli("status", "--redis-url", setup.url, "--run", "x", env=right)
        assert "refused the credentials" not in out.stderr, out.stderr  # the run is missing


def test_a_connection_closed_under_a_command_is_a_connection_error():
    # redis-py's asyncio connection, disconnected by another task while a command is on its
    # way (its cluster client disconnects a node's connections when the slot map changes)
    import asyncio

    import redis.asyncio.connection

    from schemas.redisconn.clients import _lost_connection_named

    async def send_on_a_closed_connection() -> None:
        conn = redis.asyncio.connection.Connection()
        conn._writer = None  # what disconnect() leaves
        with _lost_connection_named():
            await conn._send_packed_command([b"PING\r\n"])

    with pytest.raises(redis.exceptions.ConnectionError) as named:
        asyncio.run(send_on_a_closed_connection())
    assert "writelines" in str(named.value)
    assert isinstance(named.value.__cause__, AttributeError)
    with pytest.raises(AttributeError):  # an AttributeError of anyone else's code stays one
        with _lost_connection_named():
            getattr(None, "writelines")  # noqa: B009
