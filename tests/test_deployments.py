"""Past one Redis: runs on a Redis Cluster and behind Sentinel, every client given one URL,
and a run carried through the SIGKILL of its primary.

Every server is a real redis-server started here on loopback (tests/redis_servers.py) and
killed, with its folder removed, when the test ends, also when it fails. Failovers are the
deployments' own (no CLUSTER FAILOVER, no SENTINEL FAILOVER): a short `cluster-node-timeout`
or `down-after-milliseconds` makes them quick.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster
import yaml
from helpers import (
    ROOT,
    ProducerThread,
    add_group,
    blocked_in_xreadgroup,
    clean_env,
    get_batch_in_thread,
    record_acknowledged,
    run_cli,
    run_cli_here,
    small_config,
    wait_for,
)
from redis_servers import LocalCluster, LocalSentinel, Node, redis_server_7

from consumer import Batcher
from consumer.batch import Entry
from producers.producer import Producer
from rollstream.embedded import spawn
from schemas.codec import ENTRY_FIELD, decode_trajectory
from schemas.config import RolloutConfig
from schemas.keys import CONSUMER_GROUP, Keys

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def redis7() -> str:
    binary = redis_server_7()
    if binary is None:
        pytest.skip("no redis-server 7.0+ on PATH (Redis Cluster tests need sharded pub/sub "
                    "and cluster-port)")
    return binary


def run_on(cluster: LocalCluster, node: Node, prefix: str) -> str:
    """A run name whose slot `node` serves."""
    for i in range(10_000):
        name = f"{prefix}{i}"
        if cluster.primary_of(Keys(name).prefix) is node:
            return name
    raise AssertionError(f"no run name maps to {node.name}")


def producer(url: str, run: str) -> ProducerThread:
    return ProducerThread(Producer(url, run, handle_signals=False, poll_interval_s=0.05)).start()


SMALL_YAML = {  # small_config() as a file
    "rollout_batch_size": 16, "async_generation_ratio": 0, "seed": 7, "lease_ttl_s": 1.5,
    "train_env_manager": {"max_env_num_per_worker": 8, "num_env_groups": 4, "group_size": 4,
                          "tags": ["FrozenLake"]},
    "val_env_manager": {"max_env_num_per_worker": 8, "num_env_groups": 8, "group_size": 1,
                        "tags": ["FrozenLake"]},
}


def write_config(path: Path) -> str:
    path.write_text(yaml.safe_dump(SMALL_YAML))
    assert RolloutConfig.from_yaml(path).to_json() == small_config().to_json()
    return str(path)


def cli(*args: str, timeout: float = 90) -> Any:
    return run_cli(*args, env=clean_env(), timeout=timeout)


def operator(*args: str) -> Any:
    """An operator's command (`pause`, `status`, `reset`...) run in this process
    (`run_cli_here`): it ends by itself and starts nothing, so it goes through the same code
    with the same URL, without ~0.5 s of Python start each; the commands that run a trainer
    or a producer stay processes of their own."""
    return run_cli_here(*args, env=clean_env())


# -- a cluster of three primaries, two runs ---------------------------------------------------
def test_two_runs_on_two_nodes_through_one_node_url(redis7, tmp_path, caplog):
    with LocalCluster(masters=3, binary=redis7) as cluster:
        entry, home_a, home_b = cluster.nodes
        url = cluster.url  # the entry node serves neither run
        run_a, run_b = run_on(cluster, home_a, "a"), run_on(cluster, home_b, "b")
        config = small_config()
        path = write_config(tmp_path / "run.yaml")
        produce_b = spawn([sys.executable, "-m", "rollstream", "produce", "--redis-url", url,
                           "--run", run_b], cwd=ROOT, env=clean_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            two_runs(cluster, url, run_a, run_b, config, path, produce_b)
            assert owner_lines(caplog, run_a).count(("batcher batcher-0", entry.name)) == 1
        finally:
            if produce_b.poll() is None:
                produce_b.kill()
            produce_b.wait(10)


def two_runs(cluster: LocalCluster, url: str, run_a: str, run_b: str, config: RolloutConfig,
             path: str, produce_b: subprocess.Popen) -> None:
    entry, home_a, home_b = cluster.nodes
    # run B: the command line only, its trainer and producer as processes
    trained = cli("train", "--config", path, "--redis-url", url, "--run", run_b,
                  "--steps", "3", "--timeout-s", "60")
    assert trained.returncode == 0, trained.stderr
    assert trained.stdout.count("step ") == 3
    # run A: the Batcher API and a producer, both given the entry node's URL
    batcher = Batcher(url, config, run=run_a, block_ms=200)
    thread = producer(url, run_a)
    try:
        run_a_steps(cluster, url, run_a, path, batcher, thread)
    finally:
        if thread.thread.is_alive():
            thread.stop()
        batcher.close()
    stopped = operator("stop", "--redis-url", url, "--run", run_b)
    assert stopped.returncode == 0, stopped.stderr
    assert produce_b.wait(30) == 0


def run_a_steps(cluster: LocalCluster, url: str, run_a: str, path: str, batcher: Batcher,
                thread: ProducerThread) -> None:
    entry, home_a, _ = cluster.nodes
    for step in range(2):
        batch = batcher.get_batch("train", timeout_s=60)
        assert set(batch.episode_ids.tolist()) == {step}
        batcher.ack(batch)
        batcher.publish_version()
    check_sharded_control(cluster, run_a, home_a, thread)

    status = operator("status", "--redis-url", url, "--run", run_a)
    assert status.returncode == 0, status.stderr
    slot = batcher.redis.keyslot(Keys(run_a).prefix)
    assert f"Redis Cluster slot {slot} on node {home_a.name}" in status.stdout

    # move run A's slot to the entry node while its producer runs; everyone follows
    cluster.move_slot(slot, home_a, entry)
    for step in range(2, 4):
        batch = batcher.get_batch("train", timeout_s=60)
        assert set(batch.episode_ids.tolist()) == {step}
        batcher.ack(batch)
        batcher.publish_version()
    assert batcher.owner.current == entry.name
    checked = operator("config", "check", path, "--redis-url", url, "--run", run_a)
    assert checked.returncode == 0, checked.stderr
    assert f"slot {slot} on node {entry.name} (0 replicas online)" in checked.stdout

    batcher.close()  # the trainer ends first: a live one would put the run back
    reset = operator("reset", "--yes", "--redis-url", url, "--run", run_a)
    assert reset.returncode == 0, reset.stderr
    thread.thread.join(30)
    assert thread.result == [0]  # the reset stopped it first
    assert not list(batcher.redis.scan_iter(match=Keys(run_a).pattern()))

    bad = operator("status", "--redis-url", f"redis://{entry.name}/3", "--run", run_a)
    assert bad.returncode == 2 and "database 0" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_trainer_waiting_when_its_slot_moves_follows_it(redis7):
    """Redis 7 ends a read blocked on a stream whose slot migrates away with UNBLOCKED; the
    Batcher reads again and follows MOVED to the new node (before: the trainer failed)."""
    with LocalCluster(masters=2, binary=redis7) as cluster:
        home, other = cluster.nodes
        run = run_on(cluster, home, "w")
        config = small_config()
        batcher = Batcher(cluster.url, config, run=run, block_ms=10_000)
        client = redis.cluster.RedisCluster.from_url(cluster.url)
        keys = Keys(run)
        waiter, result = get_batch_in_thread(batcher, timeout_s=60)
        try:
            with home.client() as node:
                wait_for(lambda: blocked_in_xreadgroup(node),
                         what="the batcher blocked in XREADGROUP on the run's node")
            cluster.move_slot(client.keyslot(keys.prefix), home, other)
            for g in range(config.train_env_manager.num_env_groups):
                add_group(client, keys, "train", g, 0, group_size=4)
            waiter.join(60)
            assert "error" not in result, result
            assert len(result["batch"]) == 16
            assert batcher.owner.current == other.name
        finally:
            waiter.join(60)
            batcher.close()
            client.close()


def check_sharded_control(cluster: LocalCluster, run: str, home: Node,
                          thread: ProducerThread) -> None:
    """The producer listens with SSUBSCRIBE on the run's node only, and an operator's
    pause reaches it as a sharded message."""
    channel = Keys(run).control
    wait_for(thread.producer.watcher.subscribed.is_set, what="the producer to subscribe")
    for node in cluster.nodes:
        with node.client() as client:
            sharded = dict(zip(*[iter(client.execute_command(
                "PUBSUB", "SHARDNUMSUB", channel))] * 2, strict=True))
            classic = dict(client.pubsub_numsub(channel))
        assert sharded[channel.encode()] == (1 if node is home else 0), node.name
        assert classic[channel.encode()] == 0
    client = redis.cluster.RedisCluster.from_url(cluster.url)
    listener = client.pubsub()
    listener.ssubscribe(channel)
    paused = operator("pause", "--redis-url", cluster.url, "--run", run)
    assert paused.returncode == 0, paused.stderr
    heard = wait_for(lambda: listener.get_sharded_message(ignore_subscribe_messages=True,
                                                          timeout=0.2),
                     what="the pause message on the sharded channel")
    assert heard["data"] == b"pause"
    wait_for(lambda: "operator" in thread.producer.state.paused, what="the producer to pause")
    resumed = operator("resume", "--redis-url", cluster.url, "--run", run)
    assert resumed.returncode == 0, resumed.stderr
    listener.close()
    client.close()


# -- a primary SIGKILLed mid-run, min_replicas: 1 ---------------------------------------------
class Chaos:
    """Mid-step, SIGKILL the run's primary; once a replica has taken over and a write was
    held for want of replicas, start the old primary again as a replica (as an operator or
    a supervisor would). Runs in a thread; `error` travels to the test."""

    def __init__(self, told: list[str], held: Callable[[], int], primary: Callable[[], Node],
                 wait_failover: Callable[[Node], Node], rejoin: Callable[[Node, Node], None],
                 kill_at: int):
        self.told, self.held, self.primary = told, held, primary
        self.wait_failover, self.rejoin, self.kill_at = wait_failover, rejoin, kill_at
        self.victim: Node | None = None
        self.successor: Node | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            wait_for(lambda: len(self.told) >= self.kill_at, timeout_s=60,
                     what="the run to be under way")
            self.victim = self.primary()
            self.victim.kill()
            self.successor = self.wait_failover(self.victim)
            before = self.held()
            wait_for(lambda: self.held() > before, timeout_s=60,
                     what="a write held for want of a replica")
            self.rejoin(self.victim, self.successor)
        except BaseException as exc:  # travels to the test
            self.error = exc


def run_through_failover(url: str, run: str, told: list[str], primary: Callable[[], Node],
                         wait_failover: Callable[[Node], Node],
                         rejoin: Callable[[Node, Node], None], caplog: Any,
                         steps: int = 6) -> None:
    """A sync run (each batch: episode `step` of all 16 envs) with two producers, the primary
    killed during step 2; then: nothing delivered twice, nothing acknowledged lost."""
    config = small_config(rollout_batch_size=16, min_replicas=1, replica_timeout_ms=300,
                          lease_ttl_s=3.0, policy={"type": "random", "latency_s": 0.01})
    batcher = Batcher(url, config, run=run, block_ms=200)
    threads = [producer(url, run), producer(url, run)]

    def held() -> int:
        committers = [getattr(t.producer, "committer", None) for t in threads]
        return batcher.unreplicated + sum(c.unreplicated for c in committers if c is not None)

    chaos = Chaos(told, held, primary, wait_failover, rejoin, kill_at=2 * 16 + 8)
    chaos.thread.start()
    delivered: list[str] = []
    acked: set[Entry] = set()
    try:
        for step in range(steps):
            batch = batcher.get_batch("train", timeout_s=90)
            assert set(batch.episode_ids.tolist()) == {step}, chaos.error
            delivered += batch.traj_ids
            batcher.ack(batch)
            acked.update(batch.entries)
            batcher.publish_version()
        chaos.thread.join(60)
        assert chaos.error is None, chaos.error
        assert chaos.successor is not None and chaos.victim is not None
        assert [t.stop() for t in threads] == [0, 0]
        # the run moved to the replica that took over, and its clients followed, each
        # saying so in one line
        assert batcher.owner.current == chaos.successor.name
        assert held() > 0
        moved = owner_lines(caplog, run)
        assert moved.count(("batcher batcher-0", chaos.successor.name)) == 1, moved
        producers = [who for who, _ in moved if who.startswith("producer")]
        assert producers and len(producers) == len(set(producers)) <= 2, moved
        # no trajectory delivered twice
        assert len(delivered) == len(set(delivered)) == steps * 16
        # none acknowledged then lost: what producers were told is in went to the trainer
        # or is still in the streams; what the trainer acked is neither left nor pending
        left = stream_entries(batcher, config)
        assert set(told) <= set(delivered) | set(left.values())
        assert not acked & set(left)
        assert not acked & pending_entries(batcher, config)
    finally:
        for thread in threads:
            if thread.thread.is_alive():
                thread.stop()
        batcher.close()


def owner_lines(caplog: Any, run: str) -> list[tuple[str, str]]:
    """(who, new node) of every "run X is now served by NODE" line."""
    out = []
    for record in caplog.records:
        message = record.getMessage()
        marker = f": run {run} is now served by "
        if marker in message:
            who, rest = message.split(marker, 1)
            out.append((who, rest.split(" ", 1)[0]))
    return out


def stream_entries(batcher: Batcher, config: RolloutConfig) -> dict[Entry, str]:
    """Every entry left in the run's train streams -> its traj_id."""
    out = {}
    for g in range(config.train_env_manager.num_env_groups):
        stream = batcher.keys.stream("train", g)
        for entry_id, fields in batcher.redis.xrange(stream):
            out[Entry(stream, entry_id.decode())] = decode_trajectory(
                fields[ENTRY_FIELD])["traj_id"]
    return out


def pending_entries(batcher: Batcher, config: RolloutConfig) -> set[Entry]:
    out = set()
    for g in range(config.train_env_manager.num_env_groups):
        stream = batcher.keys.stream("train", g)
        for item in batcher.redis.xpending_range(stream, CONSUMER_GROUP, "-", "+", 1000):
            message_id = item["message_id"]
            out.add(Entry(stream, message_id.decode() if isinstance(message_id, bytes)
                          else str(message_id)))
    return out


@pytest.fixture
def told(monkeypatch) -> Iterator[list[str]]:
    yield record_acknowledged(monkeypatch)


def test_a_cluster_primary_killed_mid_run_loses_and_doubles_nothing(redis7, told, caplog):
    with LocalCluster(masters=3, replicas=1, node_timeout_ms=1000, binary=redis7) as cluster:
        run = run_on(cluster, cluster.nodes[1], "f")  # the URL's node is another primary
        key = Keys(run).prefix
        run_through_failover(cluster.url, run, told,
                             primary=lambda: cluster.primary_of(key),
                             wait_failover=lambda dead: cluster.wait_failover(dead, key),
                             rejoin=cluster.rejoin, caplog=caplog)


def test_a_sentinel_primary_killed_mid_run_loses_and_doubles_nothing(redis7, told, caplog):
    with LocalSentinel(replicas=1, sentinels=3, down_after_ms=1000, binary=redis7) as setup:
        run_through_failover(setup.url, "sentinel-run", told, primary=setup.primary,
                             wait_failover=setup.wait_failover, rejoin=setup.rejoin,
                             caplog=caplog)
