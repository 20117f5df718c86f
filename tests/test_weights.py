"""Weights by version through Redis: producers fetch each version once, act with it, and
record on every step the version of the weights that chose it; sync waits for the weights
of the current version. The test policy's action *is* its weights (`WeightedPolicy`), so each
step tells which weights chose it."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from pathlib import Path

import pytest
from helpers import small_config, wait_for
from redis.asyncio import Redis as AsyncRedis

from consumer import Batch, Batcher
from producers.control import ControlState
from producers.weights import WeightsFollower
from schemas.keys import Keys

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
from toy_policies import BadWeightsPolicy, WeightedPolicy, weights_for  # noqa: E402


def steps_of(batch: Batch) -> list[dict]:
    return [step for traj in batch.trajectories for step in traj["steps"]]


def assert_chosen_by_stamped_weights(batch: Batch) -> None:
    """Weights of version v take action v: every step's action equals its recorded version."""
    for traj in batch.trajectories:
        for step in traj["steps"]:
            assert step["action"] == step["version"], (traj["traj_id"], step)


def test_actions_follow_published_weights_fetched_once_per_version(r, run, producer_thread):
    config = small_config()  # sync: every step of a batch is chosen by its version's weights
    batcher = Batcher(r, config, run=run)
    policy = WeightedPolicy(action=0)
    producer = producer_thread(policy=policy).producer
    for version in (1, 2, 3):
        batch = batcher.get_batch("train", timeout_s=30)
        assert {s["version"] for s in steps_of(batch)} == {version - 1}
        assert_chosen_by_stamped_weights(batch)
        batcher.ack(batch)
        assert batcher.publish_version(weights=weights_for(version)) == version
    batch = batcher.get_batch("train", timeout_s=30)
    assert {s["action"] for s in steps_of(batch)} == {3}
    assert_chosen_by_stamped_weights(batch)
    # once per producer per version, for all its 24 envs
    assert policy.decoded == [1, 2, 3]
    assert producer.weights is not None and producer.weights.loads == 3
    # decoded off the event loop, set on it
    assert policy.decode_threads.isdisjoint(policy.set_threads)
    assert len(policy.set_threads) == 1


def test_steps_record_the_loaded_version_not_the_runs(r, run, producer_thread):
    """The run moves to version 4, published without weights (the policy did not change, or
    its trainer publishes none): episode 5, of step 4, goes on with version 3's weights and
    its steps say 3, not 4. (Held for weights that never come, it hung the run: a recheck
    audit, async with a trainer that publishes no weights.)"""
    config = small_config(async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    for version in (1, 2, 3):
        batcher.publish_version(weights=weights_for(version))
    producer_thread(policy=WeightedPolicy(action=0))
    batcher.ack(batcher.get_batch("train", timeout_s=30))
    batcher.publish_version()  # version 4, no weights
    started_at_4 = []
    while not started_at_4:  # T = 1, ratio 1: episode 5 is admitted only once the run is at 4
        batch = batcher.get_batch("train", timeout_s=30)
        assert batch.version == 4
        assert_chosen_by_stamped_weights(batch)
        started_at_4 = [t for t in batch.trajectories if t["episode_id"] == 5]
        batcher.ack(batch)
    assert {s["version"] for t in started_at_4 for s in t["steps"]} == {3}


def test_async_episodes_wait_for_the_weights_of_their_step(r, run, producer_thread):
    """Async, ratio 1, T = 1: publishing version v admits episode v + 1, which belongs to step
    v. While v's weights still decode, it waits: started with v - 1's weights, as it did,
    it reached the trainer at version v + 1 two versions stale (`scheduler/staleness/max`
    2 at ratio 1). Episodes of earlier steps go on with the weights at hand."""
    config = small_config(async_generation_ratio=1)
    train_envs = config.train_env_manager.num_envs
    batcher = Batcher(r, config, run=run)
    policy = WeightedPolicy(action=0)
    producer = producer_thread(policy=policy).producer
    batches = [batcher.get_batch("train", timeout_s=30)]
    follower = producer.weights
    assert follower is not None
    for version in (1, 2, 3):
        batcher.ack(batches[-1])
        policy.hold = threading.Event()  # v's decode blocks until released
        policy.decoding.clear()
        holds = follower.holds
        batcher.publish_version(weights=weights_for(version))
        wait_for(policy.decoding.is_set, what=f"the producer to start decoding {version}")
        wait_for(lambda h=holds: follower.holds >= h + train_envs,
                 what=f"every train env to wait for version {version}'s weights")
        policy.hold.set()
        batches.append(batcher.get_batch("train", timeout_s=30))
    batcher.ack(batches[-1])
    batches.append(batcher.get_batch("train", timeout_s=30))
    for batch in batches:
        assert batch.metrics["scheduler/staleness/max"] <= 1, batch.version
        for traj in batch.trajectories:
            assert traj["version_start"] >= max(0, traj["episode_id"] - 1), traj["traj_id"]
        assert_chosen_by_stamped_weights(batch)


def test_late_joiner_loads_only_the_newest_weights(r, run, producer_thread):
    config = small_config(async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    for version in (1, 2, 3):
        batcher.publish_version(weights=weights_for(version))
    policy = WeightedPolicy(action=0)
    producer_thread(policy=policy)
    batch = batcher.get_batch("train", timeout_s=30)
    assert {s["version"] for s in steps_of(batch)} == {3}
    assert_chosen_by_stamped_weights(batch)
    assert policy.decoded == [3]
    assert batch.metrics["scheduler/stale_dropped"] == 0  # loaded before its first step


def test_sync_steps_wait_for_the_weights_of_the_current_version(r, run, producer_thread):
    config = small_config()  # sync
    train_envs = config.train_env_manager.num_envs
    batcher = Batcher(r, config, run=run)
    policy = WeightedPolicy(action=0)
    producer = producer_thread(policy=policy).producer
    first = batcher.get_batch("train", timeout_s=30)
    assert {s["version"] for s in steps_of(first)} == {0}
    batcher.ack(first)
    policy.hold = threading.Event()  # the decode of version 1 blocks until released
    batcher.publish_version(weights=weights_for(1))
    wait_for(policy.decoding.is_set, what="the producer to start decoding version 1")
    acts = policy.acts
    follower = producer.weights
    assert follower is not None
    holds = follower.holds  # paused envs wait before their gate: nothing is held yet
    result: list[Batch] = []
    getter = threading.Thread(target=lambda: result.append(batcher.get_batch("train",
                                                                             timeout_s=30)))
    getter.start()  # lifts the sync pause: without the guard, envs would act with v0 now
    wait_for(lambda: producer.state.version == 1 and not producer.state.paused,
             what="the producer to see version 1 unpaused")
    wait_for(lambda: follower.holds >= holds + train_envs,
             what="every train env to be held back for the weights of version 1")
    assert policy.acts == acts  # nobody acted with version 0's weights at version 1
    policy.hold.set()
    getter.join(30)
    assert result, "get_batch did not return"
    batch = result[0]
    assert {s["version"] for s in steps_of(batch)} == {1}
    assert_chosen_by_stamped_weights(batch)
    assert batch.metrics["scheduler/stale_dropped"] == 0


def test_weights_the_policy_cannot_decode_stop_the_producer_with_one_line(
        r, run, producer_thread, caplog):
    config = small_config(async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    thread = producer_thread(policy=BadWeightsPolicy())
    batcher.get_batch("train", timeout_s=30)
    with caplog.at_level(logging.ERROR, logger="producers.producer"):
        batcher.publish_version(weights=weights_for(1))
        thread.thread.join(20)
        assert thread.result == [1]
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1
    size = len(weights_for(1))
    assert (f"policy.decode_weights failed on {{{run}}}:weights:1 ({size} bytes): ValueError: "
            "these are not my weights") in errors[0]


def test_follower_takes_the_newest_weights_at_or_below_the_run_version(redis_url, run, r):
    keys = Keys(run)
    r.set(keys.weights(3), weights_for(3))
    r.set(keys.weights(4), weights_for(4))
    r.set(keys.weights(6), weights_for(6))  # newer than the run: not for now

    async def scenario() -> None:
        client = AsyncRedis.from_url(redis_url)
        state = ControlState()
        policy = WeightedPolicy()
        follower = WeightsFollower(client, keys, policy, state, sync=True)
        try:
            state.update(5, frozenset(), 0, False)
            assert not await follower.refresh()  # 5 has none yet: the newest older one
            assert (follower.version, policy.decoded) == (4, [4])
            assert follower.must_wait(5)
            assert not await follower.refresh()  # still none: nothing fetched again
            assert policy.decoded == [4]
            await client.set(keys.weights(5), weights_for(5))
            assert await follower.refresh()
            assert (follower.version, policy.decoded, follower.must_wait(5)) == (5, [4, 5], False)
        finally:
            await client.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("sync", [True, False])
def test_no_weights_yet_acts_with_the_factorys_as_version_0(redis_url, run, sync):
    async def scenario() -> None:
        client = AsyncRedis.from_url(redis_url)
        follower = WeightsFollower(client, Keys(run), WeightedPolicy(), ControlState(),
                                   sync=sync)
        try:
            assert await follower.refresh()
            assert follower.version == 0 and not follower.must_wait(0)
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_held_group_whose_weights_fell_behind_is_not_handed_out(r, run, producer_thread):
    """Ratio 1, T = 1: version 2 is published without weights, so episodes 2 and 3 act with
    version 1's. The batcher places both at version 2 (within the ratio), hands out episode
    2 and holds episode 3. Version 3 comes with weights: episode 3's weights are now two
    versions behind; it was handed out so (`scheduler/staleness/max` 2 at ratio 1: a recheck
    audit saw 3 at ratio 2). It is dropped as stale; episode 4 acts with version 3's."""
    config = small_config(async_generation_ratio=1)
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    producer_thread(policy=WeightedPolicy(action=0))
    batcher.ack(batcher.get_batch("train", timeout_s=30))
    batcher.publish_version(weights=weights_for(1))
    batcher.ack(batcher.get_batch("train", timeout_s=30))
    batcher.publish_version()  # version 2: no weights
    wait_for(lambda: sum(r.xlen(keys.stream("train", g)) for g in range(4)) == 32,
             what="episodes 2 and 3 of every env committed")
    held = batcher.get_batch("train", timeout_s=30)
    assert set(held.episode_ids.tolist()) == {2}
    batcher.ack(held)
    batcher.publish_version(weights=weights_for(3))
    batch = batcher.get_batch("train", timeout_s=30)
    assert batch.metrics["scheduler/staleness/max"] <= 1
    assert set(batch.episode_ids.tolist()) == {4}
    assert_chosen_by_stamped_weights(batch)
