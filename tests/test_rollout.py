"""The rollout path against a real Redis: producers (in threads) -> streams -> batcher."""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import pytest
from helpers import (
    BROKEN_ENV_ID,
    ROOT,
    SLEEPY_ENV_ID,
    BrokenEnv,
    HoldsSecondEpisode,
    blocked_in_xreadgroup,
    broken_group_config,
    get_batch_in_thread,
    publish,
    slow_build_config,
    small_config,
    wait_for,
)

import consumer.assembly as assembly_module
import producers.commit
import producers.shard_runner
from consumer import Batcher
from producers.leases import Leases, fair_share
from producers.policies import StepContext
from producers.policies.random import RandomPolicy
from rollstream.status.snapshot import snapshot
from schemas.codec import ENTRY_FIELD, decode_trajectory, encode_trajectory
from schemas.errors import BatcherConflict, BatchTimeout, ConfigError, StepExhausted
from schemas.keys import Keys
from schemas.liveness import live_producers
from schemas.redisconn import async_client
from schemas.seeding import episode_seed


def stream_lengths(r, keys: Keys, config, mode: str = "train") -> list[int]:
    pipe = r.pipeline(transaction=False)
    for g in range(config.manager(mode).num_env_groups):
        pipe.xlen(keys.stream(mode, g))
    return pipe.execute()


def assert_complete_groups(batch, group_size: int) -> None:
    by_group = Counter(batch.traj_group_ids)
    assert all(count == group_size for count in by_group.values()), by_group
    for group_id in by_group:
        members = [t for t in batch.trajectories if t["traj_group_id"] == group_id]
        assert sorted(t["member"] for t in members) == list(range(group_size))


def test_batches_hold_only_complete_groups_with_shared_seeds(r, run, producer_thread):
    config = small_config(rollout_batch_size=8)  # 2 of the 4 groups per step
    batcher = Batcher(r, config, run=run)
    producer_thread()
    for _ in range(3):
        batch = batcher.get_batch("train", timeout_s=20)
        assert len(batch) == 8
        assert_complete_groups(batch, 4)
        for t in batch.trajectories:
            assert t["seed"] == episode_seed(config.seed, "train", t["group_id"], t["episode_id"])
        # members share the env seed but act on their own generators
        first = [t for t in batch.trajectories if t["traj_group_id"] == batch.traj_group_ids[0]]
        assert len({tuple(s["action"] for s in t["steps"]) for t in first}) > 1
        assert batch.scores.shape == (8,) and batch.mask.shape[0] == 8
        assert list(batch.group_index) == [0, 0, 0, 0, 1, 1, 1, 1]  # groups in batch order
        assert batch.mask.sum() == batch.num_actions.sum()
        batcher.ack(batch)
        batcher.publish_version()


class SlowGroupPolicy(RandomPolicy):
    """Random actions, but group 0 takes `delay_s` per action (a straggler)."""

    def __init__(self, delay_s: float):
        super().__init__()
        self.delay_s = delay_s

    async def act(self, observation: Any, ctx: StepContext):
        if ctx.mode == "train" and ctx.group_id == 0:
            await asyncio.sleep(self.delay_s)
        return await super().act(observation, ctx)


def test_get_batch_returns_while_one_groups_env_is_slow(r, run, producer_thread):
    config = small_config(rollout_batch_size=12, async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    producer_thread(policy=SlowGroupPolicy(delay_s=30.0))
    started = time.monotonic()
    batch = batcher.get_batch("train", timeout_s=20)
    assert time.monotonic() - started < 10
    assert 0 not in set(batch.group_ids.tolist())
    assert_complete_groups(batch, 4)


def test_get_batch_returns_while_one_groups_env_blocks(r, run, producer_thread):
    # group 3's env sleeps 30 s in step(); run in a worker thread, it stalls nobody else
    config = small_config(
        rollout_batch_size=12, async_generation_ratio=1,
        custom_envs={"Sleepy": {"env_id": SLEEPY_ENV_ID, "env_config": {"delay_s": 30.0},
                                "threaded": True}},
        train_env_manager={"tags": ["FrozenLake", "Sleepy"], "num_groups_partition": [3, 1]},
    )
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    started = time.monotonic()
    for _ in range(3):
        batch = batcher.get_batch("train", timeout_s=20)
        assert 3 not in set(batch.group_ids.tolist())
        batcher.ack(batch)
        batcher.publish_version()
    assert time.monotonic() - started < 10
    thread.producer.request_stop()  # the sleeping step is dropped: no 30 s wait at exit


def test_sync_pause_stops_xadds_and_next_get_batch_resumes(r, run, producer_thread):
    config = small_config(rollout_batch_size=16)  # sync, all 4 groups per step
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    first = batcher.get_batch("train", timeout_s=20)
    assert r.smembers(keys.pause) == {b"sync"}
    batcher.ack(first)
    batcher.publish_version()  # version 1 admits episode 1, but the pause holds it
    time.sleep(0.3)
    before = stream_lengths(r, keys, config)
    time.sleep(1.0)
    assert stream_lengths(r, keys, config) == before == [0, 0, 0, 0]
    second = batcher.get_batch("train", timeout_s=20)  # clears the pause as it starts
    assert set(second.episode_ids.tolist()) == {1}
    assert second.metrics["scheduler/staleness/max"] == 0


def test_operator_pause_holds_even_while_the_trainer_asks(r, run, producer_thread):
    config = small_config(rollout_batch_size=16)
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    r.sadd(keys.pause, "operator")
    producer_thread()
    with pytest.raises(BatchTimeout, match="pause reasons: \\['operator'\\]"):
        batcher.get_batch("train", timeout_s=1.5)
    r.srem(keys.pause, "operator")
    r.publish(keys.control, b"pause")
    assert len(batcher.get_batch("train", timeout_s=20)) == 16


def test_async_staleness_is_bounded_and_stale_ones_are_counted(r, run, producer_thread):
    ratio = 1
    config = small_config(rollout_batch_size=8, async_generation_ratio=ratio)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    dropped = 0.0
    for _ in range(6):
        batch = batcher.get_batch("train", timeout_s=20)
        staleness = batch.version - batch.version_start
        assert staleness.max() <= ratio
        assert batch.metrics["scheduler/staleness/max"] <= ratio
        dropped += batch.metrics["scheduler/stale_dropped"]
        batcher.ack(batch)
        batcher.publish_version()
        time.sleep(0.2)  # the producers run ahead while we "train"
    # half the groups are never taken in time: their episodes expire and are counted
    assert dropped > 0
    assert batcher.totals["scheduler/stale_dropped"] == dropped


def test_acked_entries_leave_the_streams(r, run, producer_thread):
    config = small_config(rollout_batch_size=16)
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch("train", timeout_s=20)
    for entry in batch.entries:
        assert r.xrange(entry.stream, entry.entry_id, entry.entry_id)
    batcher.ack(batch)
    for entry in batch.entries:
        assert r.xrange(entry.stream, entry.entry_id, entry.entry_id) == []
    pending = [r.xpending(keys.stream("train", g), "batcher")["pending"] for g in range(4)]
    assert pending == [0, 0, 0, 0]
    assert r.get(keys.inflight("train", "batcher-0")) is None


def test_restarted_batcher_gets_the_same_batch_again(r, run, producer_thread):
    config = small_config(rollout_batch_size=8, async_generation_ratio=1)
    # a short ttl: the restart waits out its previous life's key (its process died within it)
    batcher = Batcher(r, config, run=run, alive_ttl_ms=1000)
    producer_thread()
    first = batcher.get_batch("train", timeout_s=20)
    # more groups complete meanwhile: every episode admitted (2 per env) is in the streams
    wait_for(lambda: sum(stream_lengths(r, Keys(run), config)) == 2 * 16,
             what="every admitted episode committed")
    del batcher  # the trainer dies before ack
    again = Batcher(r, config, run=run, alive_ttl_ms=1000).get_batch("train", timeout_s=20)
    assert again.traj_ids == first.traj_ids


def test_a_closed_batchers_pending_entries_are_claimed_at_once(r, run, producer_thread):
    """close() leaves its key saying `closed`: no ttl of grace (a minute here, longer than
    the get_batch may wait) before its unacked batch is claimed."""
    config = small_config(rollout_batch_size=16)
    old = Batcher(r, config, run=run, consumer="old-trainer")
    producer_thread()
    first = old.get_batch("train", timeout_s=20)
    old.close()  # without ack
    assert r.get(Keys(run).batcher_alive("old-trainer")) == b"closed"
    new = Batcher(r, config, run=run, consumer="new-trainer", claim_idle_ms=0,
                  alive_ttl_ms=60_000)
    again = new.get_batch("train", timeout_s=20)
    assert sorted(again.traj_ids) == sorted(first.traj_ids)
    new.close()


def pending_traj_ids(r, keys: Keys, config, consumer: str) -> set[str]:
    """The traj_ids of the train entries pending to `consumer` (read, not acked)."""
    out = set()
    for g in range(config.train_env_manager.num_env_groups):
        stream = keys.stream("train", g)
        for item in r.xpending_range(stream, "batcher", "-", "+", 1000, consumername=consumer):
            for _, fields in r.xrange(stream, item["message_id"], item["message_id"]):
                out.add(decode_trajectory(fields[ENTRY_FIELD])["traj_id"])
    return out


def pttl_rises(r, key: str) -> Callable[[], bool]:
    """A `wait_for` predicate: true once `key`'s PTTL is higher than at the look before, which
    only a write does (a heartbeat refreshing it): left alone, a key's PTTL only counts down."""
    last = [r.pttl(key)]

    def rose() -> bool:
        now = r.pttl(key)
        up, last[0] = now > last[0], now
        return up

    return rose


@contextmanager
def asking(batcher: Batcher) -> Iterator[list[set[str]]]:
    """`batcher` asks for train batches on a thread until the block ends, acking each: a batch
    of fresher groups may come, and ends a call, so it keeps asking, and its looks for dead
    batchers' entries go on however slow this machine is. Yields the traj_ids of each batch
    it was handed (complete once the block has ended: the thread ends its call first)."""
    handed: list[set[str]] = []
    done = threading.Event()

    def keep_asking() -> None:
        while not done.is_set():
            try:
                batch = batcher.get_batch("train", timeout_s=1)
            except BatchTimeout:
                continue
            handed.append(set(batch.traj_ids))
            batcher.ack(batch)

    thread = threading.Thread(target=keep_asking)
    thread.start()
    try:
        yield handed
    finally:
        done.set()
        thread.join(30)
        assert not thread.is_alive(), "the asking batcher's get_batch did not end"


KEEPS_A_BATCH = """
import json, sys, time
from consumer import Batcher
from schemas.config import RolloutConfig
url, run, config = sys.argv[1:4]
batcher = Batcher(url, RolloutConfig.from_json(config), run=run, consumer="old-trainer",
                  alive_ttl_ms=600)
print(json.dumps(batcher.get_batch("train", timeout_s=20).traj_ids), flush=True)
time.sleep(600)  # a trainer training: its batch is not acked
"""


def test_a_live_batchers_batch_is_never_claimed_and_a_killed_ones_is(
        r, run, redis_url, producer_thread):
    """Two batchers on the same groups, claims at any idle time: while the first one's
    process lives (training for longer than claim_idle_ms), the second never takes its
    unacked batch, however long it looks; once it is SIGKILLed and its liveness key expires,
    a batcher claims it."""
    config = small_config(async_generation_ratio=1)  # two episodes admitted per env at once
    keys = Keys(run)
    alive = keys.batcher_alive("old-trainer")
    producer_thread()
    old = subprocess.Popen([sys.executable, "-c", KEEPS_A_BATCH, redis_url, run,
                            config.to_json()], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(old.stdout.readline())
        assert len(first) == 16
        # held unacked by a live batcher (the batch is 4 complete groups, two of them maybe
        # episodes of one group and so of one stream; its read may hold more)
        assert set(first) <= pending_traj_ids(r, keys, config, "old-trainer")
        # while it trains (get_batch has returned) its key is refreshed, not only written
        # by get_batch: seen as its PTTL going up
        wait_for(pttl_rises(r, alive), what="a heartbeat of the training batcher")
        # block_ms: a look for dead batchers after every read, at least every 0.1 s
        new = Batcher(r, config, run=run, consumer="new-trainer", claim_idle_ms=0,
                      alive_ttl_ms=600, block_ms=100)  # would claim after 0.6 s of a missing key
        grace_s = new.alive_ttl_ms / 1000
        with asking(new) as handed:
            first_look = wait_for(lambda: new._claims.last_claim, what="a look of the second")
            # looks over more than its grace: one that took the old batcher for dead (a key
            # missing, or not looked at) would have claimed its batch by the last of them
            wait_for(lambda: new._claims.last_claim > first_look + grace_s,
                     what="looks of the second over more than its grace")
        assert not any(ids & set(first) for ids in handed), "a live batcher's batch was claimed"
        assert set(first) <= pending_traj_ids(r, keys, config, "old-trainer")  # still its own
        assert r.exists(alive)
    finally:
        old.kill()
        old.wait(10)
    wait_for(lambda: not r.exists(alive), what="the killed batcher's liveness key to expire")
    third = Batcher(r, config, run=run, consumer="third-trainer", claim_idle_ms=0,
                    alive_ttl_ms=600, block_ms=100)  # claims after 0.6 s of a missing key
    assert sorted(third.get_batch("train", timeout_s=20).traj_ids) == sorted(first)
    assert r.exists(Keys(run).batcher_alive("new-trainer"))  # still alive: not claimed
    new.close()
    assert r.get(Keys(run).batcher_alive("new-trainer")) == b"closed"
    third.close()


def test_a_batcher_whose_key_lapsed_in_an_outage_keeps_its_batch(
        r, run, proxy, producer_thread):
    """A live batcher cut off from Redis for longer than its ttl (its next beat held in a
    proxy) has no liveness key until that beat lands, as after a Redis outage. A batcher
    that claims at any idle time finds the key missing and still does not take the batch:
    it waits a whole ttl of its own, and by then the beat has landed. Once the holder is
    killed for real, the claim comes."""
    config = small_config(async_generation_ratio=1)  # two episodes admitted per env at once
    producer_thread()
    alive = Keys(run).batcher_alive("old-trainer")
    old = subprocess.Popen([sys.executable, "-c", KEEPS_A_BATCH, proxy.url, run,
                            config.to_json()], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    suspect = ("train", "old-trainer")
    try:
        first = set(json.loads(old.stdout.readline()))
        assert len(first) == 16
        proxy.hold(alive.encode())
        assert proxy.held.wait(10)  # its next beat waits in the proxy, unsent
        wait_for(lambda: not r.exists(alive), what="the cut-off batcher's key to lapse")
        # block_ms: a look for dead batchers after every read, at least every 0.1 s. The ttl
        # is its grace: from its look that finds no key, through the release below, to its
        # look that finds the key again took at most 0.15 s in five runs beside four CPU
        # hogs on two cores; 1.5 s is ten times that
        new = Batcher(r, config, run=run, consumer="new-trainer", claim_idle_ms=0,
                      alive_ttl_ms=1500, block_ms=100)
        # its looks go on through the release below, however slow this machine is
        with asking(new) as handed:
            wait_for(lambda: suspect in new._claims.suspects, what="a look that finds no key")
            proxy.release()
            wait_for(lambda: r.exists(alive), what="the held beat to land")
            landed = time.monotonic()
            wait_for(lambda: any(ids & first for ids in handed) or (
                new._claims.last_claim > landed and suspect not in new._claims.suspects),
                what="a look that finds the key again")
        assert not any(ids & first for ids in handed), "a live batcher's batch was claimed"
    finally:
        old.kill()
        old.wait(10)
    wait_for(lambda: not r.exists(alive), what="the killed batcher's key to expire")
    claimed = None
    for _ in range(20):  # fresher groups may come first; the claimed ones are the oldest
        claimed = new.get_batch("train", timeout_s=20)
        if set(claimed.traj_ids) == first:
            break
        new.ack(claimed)
        new.publish_version()
    assert claimed is not None and set(claimed.traj_ids) == first
    new.close()


def test_a_second_live_batcher_of_the_same_name_is_refused_not_handed_the_batch(
        r, run, producer_thread):
    """Two trainers started with the default consumer name: the second was handed the first
    one's unacked batch at once (its pending entries are the name's), both trained on it and
    published, and the run stalled (an audit saw 128 trajectories delivered twice). The
    second now finds the name's liveness key kept fresh and refuses, before it reads them.
    After the first's clean close() the name is free at once."""
    config = small_config()
    producer_thread()
    first = Batcher(r, config, run=run, alive_ttl_ms=1500)
    held = first.get_batch(timeout_s=30)  # and now it trains, unacked
    again = Batcher(r, config, run=run, alive_ttl_ms=1500)  # the same name: batcher-0
    with pytest.raises(BatcherConflict, match="another live batcher is named 'batcher-0'"):
        again.get_batch(timeout_s=30)
    # refused before it lifted the sync pause of the first one's step (a recheck saw it)
    assert r.smembers(Keys(run).pause) == {b"sync"}
    first.ack(held)
    first.publish_version()
    first.close()
    with Batcher(r, config, run=run, alive_ttl_ms=1500) as restarted:
        batch = restarted.get_batch(timeout_s=30)
        assert set(batch.traj_ids).isdisjoint(held.traj_ids)


def test_a_trainer_restarted_within_the_ttl_waits_for_its_previous_lifes_key(r, run,
                                                                          redis_url,
                                                                          producer_thread):
    """A SIGKILLed trainer's liveness key lives on for up to its ttl, refreshed by nobody: a
    trainer restarted at once with the same name waits for it to expire (not refused) and
    gets the unacked batch again."""
    config = small_config()
    producer_thread()
    script = KEEPS_A_BATCH.replace('consumer="old-trainer",\n                  alive_ttl_ms=600',
                                   "alive_ttl_ms=1500")  # the default name: batcher-0
    assert script != KEEPS_A_BATCH
    alive = Keys(run).batcher_alive("batcher-0")
    old = subprocess.Popen([sys.executable, "-c", script, redis_url, run, config.to_json()],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        first = set(json.loads(old.stdout.readline()))
        # killed just after a beat: its key has nearly the whole ttl left, however late
        # a loaded machine runs its beats
        wait_for(pttl_rises(r, alive), what="a heartbeat of the trainer")
    finally:
        old.kill()
        old.wait(10)
    assert r.pttl(alive) > 500  # its previous life's key, not refreshed any more
    with Batcher(r, config, run=run) as restarted:
        assert set(restarted.get_batch(timeout_s=30).traj_ids) == first


FROZEN_TRAINER = """
import json, sys
from consumer import Batcher
from schemas.config import RolloutConfig
from schemas.errors import BatcherConflict
url, run, config = sys.argv[1:4]
# a short ttl: the test waits it out once frozen; no other batcher is there before
batcher = Batcher(url, RolloutConfig.from_json(config), run=run, alive_ttl_ms=600)
batch = batcher.get_batch("train", timeout_s=20)
print(json.dumps(batch.traj_ids), flush=True)
sys.stdin.readline()  # (SIGSTOPped here, then continued) the train step ends
try:
    batcher.ack(batch)
    batcher.publish_version()
    print("published", flush=True)
except BatcherConflict as exc:
    print("refused:", exc, flush=True)
"""


def test_a_trainer_frozen_past_its_ttl_is_fenced_once_another_took_its_name(
        r, run, redis_url, producer_thread):
    """A trainer SIGSTOPped past its liveness ttl looks dead: a trainer of the same name takes
    the name and its unacked batch (as it would a killed one's). Continued, the frozen one
    acked and published too (a recheck audit: 128 trajectories trained twice, a version
    published for two updates). Now every ack, publish and get_batch checks the name is
    still its own: it refuses, and the other goes on."""
    config = small_config()
    producer_thread()
    frozen = subprocess.Popen([sys.executable, "-c", FROZEN_TRAINER, redis_url, run,
                               config.to_json()], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        held = set(json.loads(frozen.stdout.readline()))
        frozen.send_signal(signal.SIGSTOP)
        with Batcher(r, config, run=run, alive_ttl_ms=1500) as second:
            batch = second.get_batch("train", timeout_s=30)  # after the key ran out
            assert set(batch.traj_ids) == held
            frozen.send_signal(signal.SIGCONT)
            frozen.stdin.write("\n")
            frozen.stdin.flush()
            said = frozen.stdout.readline()
            assert said.startswith("refused: batcher 'batcher-0': another batcher took this "
                                   "name"), said
            assert frozen.wait(10) == 0
            second.ack(batch)
            assert second.publish_version() == 1
            assert set(second.get_batch("train", timeout_s=30).episode_ids.tolist()) == {1}
    finally:
        frozen.send_signal(signal.SIGCONT)
        frozen.kill()
        frozen.wait(10)


WAITING_TRAINER = """
import sys
from consumer import Batcher
from schemas.config import RolloutConfig
from schemas.errors import BatcherConflict
url, run, config = sys.argv[1:4]
# the test waits the ttl out once frozen. A read blocked when it froze goes on in Redis for
# up to block_ms, into the name's pending entries, guard or no guard: block_ms is well
# within the ttl (the other takes the name at least 2/3 of a ttl after the freeze)
batcher = Batcher(url, RolloutConfig.from_json(config), run=run, alive_ttl_ms=1000,
                  block_ms=100)
try:
    batcher.get_batch("train", timeout_s=60)
    print("handed", flush=True)
except BatcherConflict as exc:
    print("refused:", exc, flush=True)
"""


def test_a_trainer_frozen_while_waiting_reads_nothing_once_another_took_its_name(
        r, run, redis_url, producer_thread):
    """Frozen inside `get_batch` past its ttl: another trainer of its name takes the name
    (and recovers the name's pending entries, once). Continued, the frozen one's wait read on
    as that name, into pending entries the other never reads again, and both waited out
    their timeouts (a recheck audit). It now finds the name gone before its next read."""
    config, keys = small_config(), Keys(run)
    r.sadd(keys.pause, "operator")  # nothing completes until the test lets it
    producer_thread()
    frozen = subprocess.Popen([sys.executable, "-c", WAITING_TRAINER, redis_url, run,
                               config.to_json()], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    alive = keys.batcher_alive("batcher-0")
    try:
        mark = wait_for(lambda: r.get(alive), what="the first trainer waiting in get_batch")
        frozen.send_signal(signal.SIGSTOP)
        second = Batcher(r, config, run=run, alive_ttl_ms=1500)
        thread, result = get_batch_in_thread(second, timeout_s=40)
        wait_for(lambda: r.get(alive) not in (None, mark), what="the second to take the name")
        frozen.send_signal(signal.SIGCONT)
        r.srem(keys.pause, "operator")
        r.publish(keys.control, b"pause")
        said = frozen.stdout.readline()
        assert said.startswith("refused: batcher 'batcher-0': another batcher took"), said
        thread.join(40)
        assert "batch" in result, result
        assert set(result["batch"].episode_ids.tolist()) == {0} and len(result["batch"]) == 16
        second.close()
    finally:
        frozen.send_signal(signal.SIGCONT)
        frozen.kill()
        frozen.wait(10)


def test_a_dropped_batcher_is_freed_without_a_full_collection(r, run):
    """Its heartbeat ends when it is freed; a reference cycle (the BUSYGROUP replies of a run
    that exists carried the frames that made it) kept it until a full collection."""
    Batcher(r, small_config(), run=run)  # the run exists: the next one's groups are there
    gc.disable()
    try:
        freed = weakref.ref(Batcher(r, small_config(), run=run))() is None
        assert freed  # (not in one assert: pytest keeps what an assert evaluates)
        beating = Batcher(r, small_config(), run=run, consumer="dropped", alive_ttl_ms=60)
        beating._alive.start()
        beats = beating._alive._beats
        del beating
        wait_for(lambda: not beats.running, what="the dropped Batcher's heartbeat to end")
    finally:
        gc.enable()


def test_the_heartbeat_outlives_whatever_a_beat_raises(r, run):
    """A cluster client unreachable raises RedisClusterException, none of redis-py's
    RedisErrors: the thread must go on beating once the client is back."""
    from redis.exceptions import RedisClusterException

    with Batcher(r, small_config(), run=run, alive_ttl_ms=60) as batcher:
        heartbeat = batcher._alive
        heartbeat.start()
        beats = []
        beat = heartbeat._name_script

        def unreachable(**kwargs):
            beats.append(1)
            if len(beats) <= 3:
                raise RedisClusterException("Redis Cluster cannot be connected")
            return beat(**kwargs)

        heartbeat._name_script = unreachable
        wait_for(lambda: len(beats) >= 5, what="beats after three that raised")
        assert heartbeat._beats.running
        assert r.exists(Keys(run).batcher_alive(batcher.consumer))
    with pytest.raises(ConfigError, match="get_batch on a closed Batcher"):
        batcher.get_batch(timeout_s=0)


def test_malformed_entry_is_dead_lettered_and_the_batcher_goes_on(r, run, producer_thread):
    config = small_config(rollout_batch_size=16)
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    r.xadd(keys.stream("train", 2), {ENTRY_FIELD: msgpack.packb([1, 2, 3])})
    producer_thread()
    batch = batcher.get_batch("train", timeout_s=20)
    assert len(batch) == 16
    dead = r.xrange(keys.dead)
    assert len(dead) == 1
    assert dead[0][1][b"stream"] == keys.stream("train", 2).encode()
    assert b"expected a map" in dead[0][1][b"reason"]


def test_entry_in_the_wrong_stream_is_dead_lettered(r, run):
    config = small_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    producer_free = {"traj_id": "x", "traj_group_id": "x", "mode": "train", "group_id": 3,
                     "episode_id": 0, "member": 0, "env_id": 12, "tag": "FrozenLake",
                     "seed": 1, "version_start": 0, "version_end": 0, "episode_score": 0.0,
                     "success": False, "terminated": True, "truncated": False,
                     "num_actions": 0, "steps": [], "producer": "test"}
    r.xadd(keys.stream("train", 1), {ENTRY_FIELD: encode_trajectory(producer_free)})
    with pytest.raises(BatchTimeout):
        batcher.get_batch("train", n=4, timeout_s=0.5)
    reason = r.xrange(keys.dead)[0][1][b"reason"].decode()
    assert "sits in" in reason and decode_trajectory(r.xrange(keys.dead)[0][1][b"data"])


def test_timeout_says_what_it_waited_for(r, run):
    batcher = Batcher(r, small_config(), run=run)
    with pytest.raises(BatchTimeout) as info:
        batcher.get_batch("train", timeout_s=0.3)
    text = str(info.value)
    assert "16 trajectories (4 complete groups of 4)" in text
    assert "live producers: 0" in text


def test_val_round_replays_the_same_episodes(r, run, producer_thread):
    config = small_config()
    batcher = Batcher(r, config, run=run)
    producer_thread()
    first = batcher.get_batch("val", timeout_s=20)
    second = batcher.get_batch("val", timeout_s=20)
    assert len(first) == config.val_batch_size == 8
    assert first.round + 1 == second.round
    assert first.traj_ids == second.traj_ids
    assert [t["seed"] for t in first.trajectories] == [t["seed"] for t in second.trajectories]
    assert [t["steps"] for t in first.trajectories] == [t["steps"] for t in second.trajectories]


def test_val_runs_while_train_is_paused(r, run, producer_thread):
    config = small_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    r.sadd(keys.pause, "operator")
    producer_thread()
    assert len(batcher.get_batch("val", timeout_s=20)) == 8


def test_two_batchers_split_the_groups(r, run, producer_thread):
    config = small_config(rollout_batch_size=8)
    even = Batcher(r, config, run=run, index=0, count=2)
    odd = Batcher(r, config, run=run, index=1, count=2)
    producer_thread()
    assert set(even.get_batch("train", timeout_s=20).group_ids.tolist()) == {0, 2}
    assert set(odd.get_batch("train", timeout_s=20).group_ids.tolist()) == {1, 3}
    assert r.smembers(Keys(run).pause) == {b"sync"}  # once both have their batch


@pytest.mark.parametrize("ratio", [0, 1])
def test_a_rank_that_does_not_publish_waits_for_the_one_that_does(r, run, producer_thread,
                                                                  ratio, monkeypatch):
    """Two batchers split the groups and only rank 0 publishes. Rank 1, having taken every
    episode admitted at version 0, asks again before that publish: it waits for it (it got
    StepExhausted at once, advice only a publishing rank can follow) and then gets the next
    episodes, learning of the publish before a read, not at its next look at its envs (no
    look comes once it waits: in sync mode the step's groups are deliverable only at the new
    version)."""
    config = small_config(rollout_batch_size=8, async_generation_ratio=ratio)
    rank0 = Batcher(r, config, run=run, index=0, count=2, consumer="rank0")
    rank1 = Batcher(r, config, run=run, index=1, count=2, consumer="rank1", block_ms=100)
    producer_thread()
    for _ in range(ratio + 1):  # every episode admitted at version 0
        rank1.ack(rank1.get_batch("train", timeout_s=20))
    state = rank1._shared.modes["train"]
    # as after a train step longer than LOOK_EVERY_S: its next wait looks at its envs at once
    state.looked_at = 0.0
    asked = time.monotonic()
    ahead, result = get_batch_in_thread(rank1, timeout_s=30)
    wait_for(lambda: result or state.looked_at >= asked, what="rank 1 to look at its envs")
    wait_for(lambda: result or blocked_in_xreadgroup(r), what="rank 1 waiting in a read")
    assert not result, result  # no StepExhausted: it looked, and waits for the publish
    monkeypatch.setattr(assembly_module, "LOOK_EVERY_S", 1e9)  # no look from now on
    rank0.ack(rank0.get_batch("train", timeout_s=20))
    publish(rank0)
    ahead.join(35)
    assert set(result["batch"].episode_ids.tolist()) == {ratio + 1}
    assert set(result["batch"].group_ids.tolist()) == {1, 3}


def test_a_sync_step_whose_group_failed_is_handed_out_without_it(r, run, producer_thread):
    # a sync step's groups are its only ones until the version moves: a group dropped because
    # a member failed (an env that kept raising, a model server refusing a request) cannot be
    # replaced, and a batch of every group would wait for it forever
    config = broken_group_config(rollout_batch_size=16, env_max_retries=0,
                                 async_generation_ratio=0)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    for step in range(2):
        batch = batcher.get_batch("train", timeout_s=10)
        assert sorted(set(batch.group_ids.tolist())) == [0, 1, 2]
        assert set(batch.episode_ids.tolist()) == {step} and len(batch) == 12
        assert batch.metrics["scheduler/failed_groups"] == 1
        batcher.ack(batch)
        publish(batcher)


def test_a_val_round_whose_group_failed_is_handed_out_without_it(r, run, producer_thread,
                                                                 caplog):
    """A val round plays its episodes once: a group dropped in it (an env that kept raising,
    a model server refusing a request) cannot come back, and `get_batch("val")` waited out
    its whole timeout for it, every round. Now the round goes out without it, and a round
    with no group left says so at once."""
    config = small_config(custom_envs={"Broken": {"env_id": BROKEN_ENV_ID}},
                          val_env_manager={"tags": ["FrozenLake", "Broken"],
                                           "num_groups_partition": [6, 2]},
                          env_max_retries=0, val_batch_size=8)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    caplog.set_level("WARNING", logger="consumer")
    for _ in range(2):  # the same short round each time
        started = time.monotonic()
        val = batcher.get_batch("val", timeout_s=30)
        assert time.monotonic() - started < 15
        assert sorted(val.group_ids.tolist()) == [0, 1, 2, 3, 4, 5]
        assert val.metrics["scheduler/failed_groups"] == 2
        batcher.ack(val)
    assert "handing out 6 of 8 groups" in caplog.text


def test_a_val_round_with_every_group_failed_says_so_at_once(r, run, producer_thread):
    config = small_config(custom_envs={"Broken": {"env_id": BROKEN_ENV_ID}},
                          val_env_manager={"tags": ["Broken"]}, env_max_retries=0)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    started = time.monotonic()
    with pytest.raises(StepExhausted, match="every group of the round was dropped"):
        batcher.get_batch("val", timeout_s=30)
    assert time.monotonic() - started < 15


def test_a_batcher_restarted_in_a_sync_step_knows_what_the_step_lost(r, run, producer_thread):
    """A batcher restarted after its failed group was dropped hands the same short batch out
    again at once (it waited out its timeout for a group that could not come back), and one
    restarted after `ack` but before `publish_version` says at once that only a publish moves
    the run on: every env's cursor is at the admission limit and the streams hold nothing
    else."""
    config = broken_group_config(rollout_batch_size=16, env_max_retries=0,
                                 async_generation_ratio=0)
    first = Batcher(r, config, run=run)
    producer_thread()
    batch = first.get_batch("train", timeout_s=10)
    assert sorted(set(batch.group_ids.tolist())) == [0, 1, 2]
    first.close()  # the trainer dies before ack
    again = Batcher(r, config, run=run)
    redelivered = again.get_batch("train", timeout_s=10)
    assert sorted(redelivered.traj_ids) == sorted(batch.traj_ids)
    again.ack(redelivered)
    again.close()  # and this one dies before its publish
    third = Batcher(r, config, run=run)
    with pytest.raises(StepExhausted, match="no group can complete any more"):
        third.get_batch("train", timeout_s=10)
    publish(third)
    assert set(third.get_batch("train", timeout_s=10).episode_ids.tolist()) == {1}
    third.close()


def test_async_steps_taken_without_a_publish_end_in_step_exhausted(r, run, producer_thread):
    """Ratio 1 admits two episodes per env ahead of the version: a trainer killed twice
    between an ack and its publish has taken both, and a third start is told at once."""
    config = small_config(async_generation_ratio=1)
    producer_thread()
    for _ in range(2):
        with Batcher(r, config, run=run) as batcher:
            batcher.ack(batcher.get_batch("train", timeout_s=10))
    with Batcher(r, config, run=run) as batcher:
        with pytest.raises(StepExhausted, match="publish_version to go on"):
            batcher.get_batch("train", timeout_s=10)
        publish(batcher)
        assert set(batcher.get_batch("train", timeout_s=10).episode_ids.tolist()) == {2}


def test_a_sync_batch_held_by_a_killed_batcher_goes_to_another_consumer(r, run, redis_url,
                                                                      producer_thread):
    """Sync: a batcher of another name that starts while the killed holder's liveness key
    still lives waits for it to expire and then gets that batch (the step is not exhausted:
    its groups are still in the streams)."""
    config = small_config()
    producer_thread()
    old = subprocess.Popen([sys.executable, "-c", KEEPS_A_BATCH, redis_url, run,
                            config.to_json()], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(old.stdout.readline())
    finally:
        old.kill()
        old.wait(10)
    assert r.exists(Keys(run).batcher_alive("old-trainer"))  # not expired yet
    # the holder is dead for sure: its grace can be short; block_ms: a look every 0.1 s
    with Batcher(r, config, run=run, consumer="new-trainer", claim_idle_ms=0,
                 alive_ttl_ms=600, block_ms=100) as new:
        assert sorted(new.get_batch("train", timeout_s=20).traj_ids) == sorted(first)


@pytest.mark.parametrize("threaded", [False, True])
def test_failing_env_drops_its_group_and_counts_it(r, run, producer_thread, threaded):
    BrokenEnv.resets.clear()
    config = broken_group_config(threaded, rollout_batch_size=12, env_max_retries=1,
                                 async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    for _ in range(3):
        batch = batcher.get_batch("train", timeout_s=20)
        assert 3 not in set(batch.group_ids.tolist())
        batcher.ack(batch)
        publish(batcher)
    assert batcher.totals["scheduler/failed_groups"] >= 1
    assert thread.stop() == 0
    # group 3 (broken): each of its 4 members played episode 0 once and retried it
    # env_max_retries (1) times, every attempt reset with the episode's own seed
    seeds = [episode_seed(config.seed, "train", 3, k) for k in range(50)]
    assert BrokenEnv.resets.count(seeds[0]) == 4 * (1 + 1)
    assert set(BrokenEnv.resets) <= set(seeds)


def test_any_gymnasium_env_runs_through_the_producers(r, run, producer_thread):
    import numpy as np

    config = small_config(custom_envs={"Pole": {"env_id": "CartPole-v1"}},
                          train_env_manager={"tags": ["Pole", "FrozenLake"],
                                             "num_groups_partition": [2, 2]})
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch("train", timeout_s=20)
    poles = [t for t in batch.trajectories if t["tag"] == "Pole"]
    assert len(poles) == 8
    obs = poles[0]["steps"][0]["observation"]
    assert isinstance(obs, np.ndarray) and obs.dtype == np.float32 and obs.shape == (4,)
    assert all(isinstance(s["action"], int) for t in poles for s in t["steps"])
    assert batch.metrics["env/Pole/num_actions"] > 1
    lake = [t for t in batch.trajectories if t["tag"] == "FrozenLake"]
    assert isinstance(lake[0]["steps"][0]["observation"], str)


def test_max_shards_caps_what_a_producer_holds(r, run, producer_thread):
    config = small_config(rollout_batch_size=4,
                          train_env_manager={"max_env_num_per_worker": 4})  # 4 + 1 shards
    keys = Keys(run)
    Batcher(r, config, run=run)
    producer_thread(max_shards=2)

    def held():
        return [k for k in r.scan_iter(match=keys.prefix + ":lease:*")]

    wait_for(lambda: len(held()) == 2, what="two leases")
    time.sleep(1.0)  # more heartbeats: still two
    assert len(held()) == 2


def test_what_a_capped_producer_leaves_falls_to_the_others(r, run, producer_thread):
    """5 shards, one producer capped at 1 and one without a cap: the share was ceil(5 / 2) = 3
    for the uncapped one, so a shard stayed with no producer for good (a val round hung)."""
    config = small_config(rollout_batch_size=4,
                          train_env_manager={"max_env_num_per_worker": 4})  # 4 + 1 shards
    keys = Keys(run)
    Batcher(r, config, run=run)
    capped = producer_thread(max_shards=1)
    wait_for(lambda: len(list(r.scan_iter(match=keys.prefix + ":lease:*"))) == 1,
             what="the capped producer's lease")
    free = producer_thread()

    def holders() -> Counter:
        return Counter(r.get(k) for k in r.scan_iter(match=keys.prefix + ":lease:*"))

    wait_for(lambda: sum(holders().values()) == 5, what="every shard leased")
    time.sleep(1.0)  # more heartbeats: nothing handed back
    assert holders() == {capped.producer.producer_id.encode(): 1,
                         free.producer.producer_id.encode(): 4}


def test_seconds_ends_a_producer_on_time_not_at_its_next_lease_beat(r, run, producer_thread):
    """The lease loop looked at `seconds` only once per beat (a third of the lease ttl): with
    a 30 s ttl a producer given 1 s ran 10 s (bench_scale's big producer, 19 s)."""
    config = small_config(lease_ttl_s=30.0)
    Batcher(r, config, run=run)
    started = time.monotonic()
    thread = producer_thread(seconds=1.0)
    thread.thread.join(30)
    assert not thread.thread.is_alive() and thread.result == [0]
    assert 1.0 <= time.monotonic() - started < 8  # a beat would have been 10 s


def test_fair_share_leaves_no_shard_to_nobody():
    assert fair_share(64, [None, None], None) == 32  # ceil(shards / live)
    assert fair_share(5, [None, None, None], None) == 2
    assert fair_share(5, [1, None], None) == 4  # the capped one's shortfall
    assert fair_share(5, [1, None], 1) == 1
    assert fair_share(10, [2, 2, None, None], None) == 3
    assert fair_share(10, [1, 1], 1) == 1  # everyone at the cap: shards stay free
    assert fair_share(3, [None] * 8, None) == 1


def test_a_long_ttl_producer_is_live_between_its_beats_whatever_ttl_the_reader_has(r, run,
                                                                                  redis_url):
    """Liveness by each producer's own ttl: a producer on 3 s that beat 0.7 s ago is live for
    a producer on 0.6 s (its live count, hence its fair share) and for `status` read with a
    0.6 s config. Judged by the reader's ttl it showed as gone between its beats.

    (The fast one's ttl is what this process has to look within after its beat, the slow
    one's what the whole test has: 0.2 s and 2 s were short for a loaded machine.)"""
    async def beats() -> int:
        client = await async_client(redis_url)
        slow = Leases(client, Keys(run), "slow", ttl_s=3.0)
        fast = Leases(client, Keys(run), "fast", ttl_s=0.6)
        await slow.heartbeat([])
        await asyncio.sleep(0.7)  # longer than the fast one's ttl
        live = (await fast.heartbeat([])).live
        await client.aclose()
        return live

    assert asyncio.run(beats()) == 2
    assert set(live_producers(r, Keys(run))) == {"slow", "fast"}
    snap = snapshot(r, Keys(run), small_config(lease_ttl_s=0.6))
    assert {p["id"]: p["state"] for p in snap["producers"]} == {"slow": "live", "fast": "live"}
    time.sleep(0.7)  # the fast one's heartbeat has expired, the slow one's has not
    assert set(live_producers(r, Keys(run))) == {"slow"}


def test_a_short_ttl_beat_does_not_expire_the_heartbeat_set_under_a_long_one(r, run,
                                                                            redis_url):
    """The set's key outlives the latest expiry in it: a producer on 0.05 s set the key to
    expire in ten of its ttls, taking the entry of one on 5 s (beating every 1.7 s) with it."""
    async def beats() -> None:
        client = await async_client(redis_url)
        await Leases(client, Keys(run), "slow", ttl_s=5.0).heartbeat([])
        await Leases(client, Keys(run), "fast", ttl_s=0.05).heartbeat([])
        await client.aclose()

    asyncio.run(beats())
    time.sleep(0.7)
    assert set(live_producers(r, Keys(run))) == {"slow"}


def test_a_claim_longer_than_the_lease_ttl_loses_no_lease(r, run, producer_thread, caplog):
    # 24 shards of 4 envs that take 25 ms each to build: claiming them all takes 2.4 s or
    # more (sleeps: a loaded machine only makes it longer), past the 2 s lease ttl, so the
    # first leases expire unless heartbeats come in between. The ttl itself is what a
    # heartbeat a third of it apart must land within, on a loaded machine too.
    config = slow_build_config(lease_ttl_s=2.0, groups=48)
    keys = Keys(run)
    Batcher(r, config, run=run)
    caplog.set_level("WARNING", logger="producers")
    started = time.monotonic()
    thread = producer_thread()
    shards = config.train_env_manager.num_shards
    lease_keys = [keys.lease("train", s) for s in range(shards)]
    pid = thread.producer.producer_id
    wait_for(lambda: r.mget(lease_keys) == [pid.encode()] * shards, timeout_s=60,
             what=f"all {shards} leases")
    assert time.monotonic() - started > config.lease_ttl_s  # the claim outlasted a ttl
    # two heartbeats more: the first to start after the last claim renews every lease held
    # and finds any that expired meanwhile lost (the one under way may have started before)
    beats = thread.producer.heartbeats
    wait_for(lambda: thread.producer.heartbeats >= beats + 2, what="two heartbeats more")
    lost = [rec.getMessage() for rec in caplog.records if "lost" in rec.getMessage()]
    assert not lost, lost[:3]
    assert thread.producer.stats.refused[("train", "lease_lost")] == 0


def test_redundant_members_first_finishers_win(r, run, producer_thread):
    config = small_config(rollout_batch_size=8, async_generation_ratio=1,
                          train_env_manager={"group_size": 2, "group_size_redundancy": 2,
                                             "max_env_num_per_worker": 16})
    assert config.train_env_manager.num_envs == 16  # 4 groups x (2 + 2 redundant)
    batcher = Batcher(r, config, run=run)
    producer_thread(policy=SlowMembersPolicy(slow={0, 1}, delay_s=0.05))
    seen: set[str] = set()
    for _ in range(3):
        batch = batcher.get_batch("train", timeout_s=20)
        assert len(batch) == 8
        assert all(count == 2 for count in Counter(batch.traj_group_ids).values())
        assert not seen & set(batch.traj_ids)
        seen |= set(batch.traj_ids)
        batcher.ack(batch)
        batcher.publish_version()
        time.sleep(0.2)
    # members 0 and 1 are slow: 2 and 3 finish first and win every group
    assert {int(t.rsplit("-", 1)[1]) for t in seen} == {2, 3}
    wait_for(lambda: batcher.get_batch("train", timeout_s=20) and
             batcher.totals["scheduler/late_dropped"] > 0, what="the losers to be dropped")


class SlowMembersPolicy(RandomPolicy):
    """Random actions; the members in `slow` take `delay_s` per action."""

    def __init__(self, slow: set[int], delay_s: float):
        super().__init__()
        self.slow, self.delay_s = slow, delay_s

    async def act(self, observation: Any, ctx: StepContext):
        if ctx.member in self.slow:
            await asyncio.sleep(self.delay_s)
        return await super().act(observation, ctx)


def _loop_holders(obj: object) -> list[object]:
    """The coroutines and frames that refer to `obj` (an env loop holding it)."""
    return [o for o in gc.get_referrers(obj) if inspect.iscoroutine(o) or inspect.isframe(o)]


def test_a_committed_trajectory_is_let_go_while_the_env_plays_on(r, run, producer_thread,
                                                                  monkeypatch):
    """Memory per env: once an episode is committed, nothing of the producer's env loop holds
    its trajectory while the env plays (or waits in) its next episode. Seen with the env's
    second episode held in flight by its policy, from the referrers of the committed dict."""
    committed: list[dict[str, Any]] = []
    encoded: list[bytes] = []
    encode = producers.shard_runner.encode_trajectory

    def spy(traj: dict[str, Any]) -> bytes:
        committed.append(traj)
        encoded.append(encode(traj))
        return encoded[-1]

    monkeypatch.setattr(producers.shard_runner, "encode_trajectory", spy)
    config = small_config(
        rollout_batch_size=1, async_generation_ratio=1,  # episode 1 is admitted at version 0
        train_env_manager={"max_env_num_per_worker": 1, "num_env_groups": 1, "group_size": 1},
        policy={"type": "python", "entrypoint": "helpers:HoldsSecondEpisode"})
    Batcher(r, config, run=run)
    HoldsSecondEpisode.holding.clear()
    producer_thread()
    wait_for(HoldsSecondEpisode.holding.is_set, what="the env's second episode in flight")
    assert r.xlen(Keys(run).stream("train", 0)) == 1 and len(committed) == 1
    for held in (committed[0], encoded[0]):  # neither the message nor its bytes
        assert _loop_holders(held) == [], type(held)


def test_a_trajectory_waits_for_its_commit_as_bytes_only(r, run, producer_thread, monkeypatch):
    """While a commit waits for its answer (a flush, a Redis outage's backoff), the env's loop
    holds the encoded bytes, not the trajectory's objects (several times their size, and
    freed cold after the wait). Seen with the commit's answer held back: the referrers of the
    encoded dict while its commit is pending."""
    committed: list[dict[str, Any]] = []
    submitted = threading.Event()
    encode = producers.shard_runner.encode_trajectory
    monkeypatch.setattr(producers.shard_runner, "encode_trajectory",
                        lambda traj: committed.append(traj) or encode(traj))

    def never_answered(self: Any, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        submitted.set()
        return asyncio.get_running_loop().create_future()

    monkeypatch.setattr(producers.commit.Committer, "submit", never_answered)
    config = small_config(
        rollout_batch_size=1,
        train_env_manager={"max_env_num_per_worker": 1, "num_env_groups": 1, "group_size": 1})
    Batcher(r, config, run=run)
    producer_thread()
    wait_for(submitted.is_set, what="a commit submitted")
    assert len(committed) == 1 and r.xlen(Keys(run).stream("train", 0)) == 0
    assert _loop_holders(committed[0]) == []
