"""One test per protocol guarantee, each built so its guard is what decides the outcome.

Every situation is made to happen, with evidence, not left to timing: a commit held on the
wire by the proxy (tests/proxy.py) while its lease moves, a pause lands or a val round ends;
a reply lost after Redis ran the commit; a producer SIGKILLed while a commit of a known
episode is held; batcher inputs written by hand so groups complete piecemeal, out of order,
or stale after the eviction step. Streams are read with XRANGE/XLEN, not through a batcher,
where the batcher's own de-duplication would hide a double.
`scripts/mutants.py` removes each guard in turn and checks that these tests catch it.
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import gymnasium as gym
import pytest
from helpers import (
    ONE_STEP_ENV_ID,
    add_group,
    add_trajectory,
    publish,
    small_config,
    stream_lengths,
    stream_messages,
    trajectory,
    wait_for,
)

from consumer import Batcher
from schemas.codec import ENTRY_FIELD, encode_trajectory
from schemas.errors import BatchTimeout
from schemas.keys import CONSUMER_GROUP, Keys

ONE_STEP_ENVS = {"OneStep": {"env_id": ONE_STEP_ENV_ID}}


def one_step_config(groups: int = 1, group_size: int = 1, val_groups: int = 0, **overrides):
    """Train (and optionally val) groups of one-step envs in one shard each."""
    manager = {"num_env_groups": groups, "group_size": group_size, "max_env_num_per_worker": 8,
               "tags": ["OneStep"]}
    val = ({"num_env_groups": val_groups, "group_size": 1, "max_env_num_per_worker": 8,
            "tags": ["OneStep"]} if val_groups else None)
    overrides.setdefault("rollout_batch_size", groups * group_size)
    return small_config(custom_envs=ONE_STEP_ENVS, train_env_manager=manager,
                        val_env_manager=val, **overrides)


def commit_marker(keys: Keys, mode: str = "train") -> bytes:
    """Bytes only a commit carries: its stream keys (nothing else names a stream)."""
    return f"{keys.prefix}:traj:{mode}:".encode()


def set_pause(r, keys: Keys, reason: str, on: bool) -> None:
    """What `rollstream pause` / `resume` do."""
    (r.sadd if on else r.srem)(keys.pause, reason)
    r.publish(keys.control, b"pause")


def start_val_round(r, keys: Keys) -> int:
    """What the batcher does when the trainer asks for a val round."""
    pipe = r.pipeline(transaction=True)
    pipe.incr(keys.val_round)
    pipe.delete(keys.cursor("val"))
    number = int(pipe.execute()[0])
    r.publish(keys.control, b"val_round")
    return number


class GatedEnv(gym.Env):
    """A one-step env whose step signals `entered`, then blocks (in a worker thread: its tag
    is `threaded`) until `go`: a step past the episode's gate, which a pause does not cut
    short (a policy call in flight would be)."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)
    entered = threading.Event()
    go = threading.Event()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: int):
        GatedEnv.entered.set()
        GatedEnv.go.wait(30)
        return 1, 1.0, True, False, {"success": True}


GATED_ENV_ID = "rollstream-test/Gated-v0"
if GATED_ENV_ID not in gym.registry:
    gym.register(id=GATED_ENV_ID, entry_point=GatedEnv)


# -- the commit script -----------------------------------------------------------------------
@pytest.mark.slow
def test_a_zombie_producers_commit_is_fenced_once_its_lease_moved(r, run, proxy,
                                                                  producer_process):
    # fencing: a producer frozen past its lease (SIGSTOP) whose commit reaches Redis after
    # the shard changed hands writes nothing. The new owner has committed nothing, so the
    # cursor cannot refuse it: only the lease check can.
    config = small_config(rollout_batch_size=4, val_env_manager=None,
                          train_env_manager={"num_env_groups": 1})  # a process: FrozenLake
    keys = Keys(run)
    Batcher(r, config, run=run)
    proxy.hold(commit_marker(keys))
    zombie = producer_process("--redis-url", proxy.url)
    assert proxy.held.wait(30), "the producer never sent a commit"
    lease = keys.lease("train", 0)
    assert f"-{zombie.pid}-".encode() in (r.get(lease) or b"")
    zombie.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: not r.exists(lease), timeout_s=10, what="the zombie's lease to expire")
        r.set(lease, "new-owner", px=60_000)  # another producer holds the shard now
    finally:
        zombie.send_signal(signal.SIGCONT)
    proxy.release()
    assert proxy.replied.wait(10), "Redis never answered the zombie's commit"
    zombie_id = f"-{zombie.pid}-"
    assert [m["traj_id"] for m in stream_messages(r, keys, config)
            if zombie_id in m["producer"]] == []
    assert stream_lengths(r, keys, config) == [0]
    assert r.hlen(keys.cursor("train")) == 0


def test_a_pause_landing_mid_episode_keeps_its_commit_out_until_resume(r, run, proxy,
                                                                      producer_at):
    # "not even the step in flight": the episode was already past its pause gate when the
    # pause landed; its commit reaches Redis while paused and must be refused.
    config = small_config(rollout_batch_size=1, val_env_manager=None,
                          custom_envs={"Gated": {"env_id": GATED_ENV_ID, "threaded": True}},
                          train_env_manager={"num_env_groups": 1, "group_size": 1,
                                             "tags": ["Gated"]})
    keys = Keys(run)
    Batcher(r, config, run=run)
    GatedEnv.entered.clear()
    GatedEnv.go.clear()
    producer = producer_at(proxy.url).producer
    assert GatedEnv.entered.wait(20), "the episode never reached its env step"
    set_pause(r, keys, "operator", True)
    wait_for(lambda: "operator" in producer.state.paused, what="the producer to see the pause")
    proxy.hold(commit_marker(keys))
    GatedEnv.go.set()  # the episode finishes; its commit goes out
    assert proxy.held.wait(10), "the finished episode was never committed"
    proxy.release()
    assert proxy.replied.wait(10), "Redis never answered the commit"
    assert stream_lengths(r, keys, config) == [0]
    assert r.hlen(keys.cursor("train")) == 0
    set_pause(r, keys, "operator", False)
    wait_for(lambda: stream_lengths(r, keys, config) == [1], what="the held episode to land")
    [msg] = stream_messages(r, keys, config)
    assert (msg["episode_id"], msg["producer"]) == (0, producer.producer_id)


def test_a_commit_resent_after_a_lost_reply_is_in_the_stream_once(r, run, proxy, producer_at):
    config = one_step_config()
    keys = Keys(run)
    Batcher(r, config, run=run)
    proxy.hold(commit_marker(keys))
    producer_at(proxy.url)
    assert proxy.held.wait(20), "the producer never sent a commit"
    proxy.lose_reply(then_hold=commit_marker(keys))  # Redis ran it; the producer can't know
    assert stream_lengths(r, keys, config) == [1]
    assert proxy.held.wait(20), "the commit whose reply was lost was never resent"
    proxy.release()
    assert proxy.replied.wait(10)
    messages = stream_messages(r, keys, config)
    assert [(m["env_id"], m["episode_id"]) for m in messages] == [(0, 0)]
    assert r.hget(keys.cursor("train"), "0") == b"1"


@pytest.mark.slow
def test_an_episode_replayed_after_a_takeover_is_in_the_streams_once(
        r, run, proxy, producer_process, producer_thread):
    # 4 envs, 4 episodes each admitted at version 0; the victim dies with episodes 0-1 of
    # group 0 committed and the commit of group 0's episode 2 held on the wire
    config = small_config(rollout_batch_size=16, val_env_manager=None,
                          train_env_manager={"num_env_groups": 2, "group_size": 2},
                          policy={"type": "random", "latency_s": 0.01})
    assert config.episodes_per_step("train") == 4
    keys = Keys(run)
    Batcher(r, config, run=run)
    proxy.hold(b"train-0-2-")  # a traj_id inside the commit's message
    victim = producer_process("--redis-url", proxy.url)
    assert proxy.held.wait(30), "the victim never committed group 0's episode 2"
    # evidence: the held member's episodes 0 and 1 are committed, its episode 2 is not
    before = stream_messages(r, keys, config)
    assert len([m for m in before if m["group_id"] == 0]) >= 2
    assert not [m for m in before if m["traj_group_id"] == "train-0-2"]
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    survivor = producer_thread().producer
    every = {(env, k) for env in range(4) for k in range(4)}

    def all_landed():
        messages = stream_messages(r, keys, config)
        return messages if {(m["env_id"], m["episode_id"]) for m in messages} == every else None

    messages = wait_for(all_landed, timeout_s=30, what="every env's 4 episodes to land")
    counts = Counter((m["env_id"], m["episode_id"]) for m in messages)
    assert counts == {pair: 1 for pair in every}
    assert r.hmget(keys.cursor("train"), "0", "1", "2", "3") == [b"4"] * 4
    replayed = [m["producer"] for m in messages if m["traj_group_id"] == "train-0-2"]
    assert replayed == [survivor.producer_id] * 2
    assert any(f"-{victim.pid}-" in m["producer"] for m in messages)


def test_a_val_commit_of_an_older_round_is_refused(r, run, proxy, producer_at):
    config = one_step_config(val_groups=1)
    keys = Keys(run)
    Batcher(r, config, run=run)
    proxy.hold(commit_marker(keys, "val"))
    producer_at(proxy.url)
    assert start_val_round(r, keys) == 1
    assert proxy.held.wait(20), "round 1's episode was never committed"
    assert start_val_round(r, keys) == 2  # round 1 is over while its commit is on the wire
    proxy.release()
    assert proxy.replied.wait(10)
    assert [m for m in stream_messages(r, keys, config, "val") if m["round"] != 2] == []
    wait_for(lambda: stream_lengths(r, keys, config, "val") == [1],
             what="round 2's episode to land")
    assert [m["round"] for m in stream_messages(r, keys, config, "val")] == [2]


# -- the batcher -----------------------------------------------------------------------------
def batcher_config():
    """4 train groups of 4, async (no pause), one episode per env per step."""
    return small_config(rollout_batch_size=4, async_generation_ratio=1, val_env_manager=None)


def pending(r, keys: Keys, group: int) -> int:
    return r.xpending(keys.stream("train", group), CONSUMER_GROUP)["pending"]


def read_once(batcher: Batcher, n: int) -> None:
    """One get_batch that reads once without waiting (timeout 0) and finds too few complete
    groups: what was in the streams is read (and held, or dropped), nothing handed out."""
    with pytest.raises(BatchTimeout):
        batcher.get_batch(n=n, timeout_s=0)


def test_a_group_completed_over_several_reads_is_delivered_only_when_whole(r, run):
    config = batcher_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run, read_count=1)
    add_group(r, keys, "train", 0, 0, group_size=4, members=[0, 1, 2])
    with pytest.raises(BatchTimeout):
        batcher.get_batch(n=4, timeout_s=0.5)
    assert pending(r, keys, 0) == 3  # the three were read, and are held
    add_trajectory(r, keys, "train", 0, 0, 3, group_size=4)
    batch = batcher.get_batch(n=4, timeout_s=5)
    assert batch.traj_ids == [f"train-0-0-{m}" for m in range(4)]


def test_groups_completing_out_of_order_are_delivered_oldest_episode_first(r, run):
    config = batcher_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    add_group(r, keys, "train", 0, 1, group_size=4)  # group 0's episode 1 completes first
    read_once(batcher, n=8)
    assert pending(r, keys, 0) == 4  # read and held, waiting for a second group
    add_group(r, keys, "train", 1, 0, group_size=4)  # an older episode completes later
    batch = batcher.get_batch(n=8, timeout_s=5)
    assert batch.traj_group_ids == ["train-1-0"] * 4 + ["train-0-1"] * 4


def test_an_older_group_completed_in_redis_goes_before_a_newer_one_already_held(r, run):
    config = batcher_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    add_group(r, keys, "train", 0, 1, group_size=4)
    # read while waiting (not `read_once`: the one read of a get_batch that may not wait is
    # the read this test's guard makes before a hand-out)
    with pytest.raises(BatchTimeout):
        batcher.get_batch(n=8, timeout_s=0.3)
    assert pending(r, keys, 0) == 4  # read and held
    add_group(r, keys, "train", 1, 0, group_size=4)
    first = batcher.get_batch(n=4, timeout_s=5)
    assert set(first.traj_group_ids) == {"train-1-0"}


@pytest.fixture
def other_run(redis_url: str, r) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield name
    keys = list(r.scan_iter(match=Keys(name).pattern(), count=1000))
    if keys:
        r.delete(*keys)


def hand_out_then_die(r, run: str) -> list[str]:
    """A trainer gets group 1's episode 0 while group 0's episode 0 is complete and pending
    too (read in the same read, not handed out), then dies before ack."""
    keys = Keys(run)
    trainer = Batcher(r, batcher_config(), run=run, consumer="trainer", alive_ttl_ms=300)
    add_trajectory(r, keys, "train", 1, 0, 0, group_size=4)  # group 1 is seen first
    read_once(trainer, n=4)
    add_group(r, keys, "train", 0, 0, group_size=4)
    add_group(r, keys, "train", 1, 0, group_size=4, members=[1, 2, 3])
    batch = trainer.get_batch(n=4, timeout_s=5)
    assert set(batch.traj_group_ids) == {"train-1-0"}
    assert pending(r, keys, 0) == 4 and pending(r, keys, 1) == 4
    return batch.traj_ids


def test_a_restarted_batcher_hands_out_its_batch_in_flight_first(r, run, other_run):
    # the situation: without the in-flight record, a restarted batcher would pick group 0
    # (read first from its pending list); with it, it must return the very same batch
    hand_out_then_die(r, other_run)
    r.delete(Keys(other_run).inflight("train", "trainer"))
    # (a short ttl: each restart waits out its previous life's key, as a restarted process
    # within the ttl does; nothing else takes the name, so a key that lapsed on a loaded
    # machine is only a shorter wait)
    without_record = Batcher(r, batcher_config(), run=other_run, consumer="trainer",
                             alive_ttl_ms=300)
    assert set(without_record.get_batch(n=4, timeout_s=5).traj_group_ids) == {"train-0-0"}

    in_flight = hand_out_then_die(r, run)
    restarted = Batcher(r, batcher_config(), run=run, consumer="trainer", alive_ttl_ms=300)
    again = restarted.get_batch(n=4, timeout_s=5)
    assert again.traj_ids == in_flight
    restarted.ack(again)
    assert set(restarted.get_batch(n=4, timeout_s=5).traj_group_ids) == {"train-0-0"}


def test_the_batcher_drops_trajectories_that_arrive_already_stale(r, run):
    # eviction runs before a read, so these arrive after it: only the staleness check of
    # each arriving trajectory can drop them (ratio 1, one episode per step)
    config = batcher_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    publish(batcher)
    publish(batcher)  # version 2: episode 0 (step 0) is expired
    add_group(r, keys, "train", 0, 0, group_size=4)
    read_once(batcher, n=4)
    assert batcher.totals["scheduler/stale_dropped"] == 4
    # episode 2 is live at version 2, but these started at version 0: 2 versions stale
    add_group(r, keys, "train", 1, 2, group_size=4, version_start=0)
    read_once(batcher, n=4)
    assert batcher.totals["scheduler/stale_dropped"] == 8
    assert stream_lengths(r, keys, config) == [0, 0, 0, 0]  # dropped = acked and deleted
    add_group(r, keys, "train", 2, 2, group_size=4, version_start=1)
    batch = batcher.get_batch(n=4, timeout_s=5)
    assert set(batch.traj_group_ids) == {"train-2-2"}
    assert batch.metrics["scheduler/stale_dropped"] == 8
    assert batch.metrics["scheduler/staleness/max"] == 1


def test_thousands_of_entries_dropped_at_once_are_all_acked_and_deleted(r, run):
    # more stale entries of one stream in one read than Lua can unpack at once (~8000):
    # the drop is split into several script calls
    config = batcher_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run, read_count=10_000)
    publish(batcher)
    publish(batcher)  # version 2: episode 0 is expired
    pipe = r.pipeline(transaction=False)
    for i in range(9000):
        group = 0 if i < 8500 else 1
        msg = trajectory("train", group, 0, i % 4, group_size=4)
        pipe.xadd(keys.stream("train", group), {ENTRY_FIELD: encode_trajectory(msg)})
    pipe.execute()
    read_once(batcher, n=4)  # one read of up to read_count entries a stream: all of them
    assert batcher.totals["scheduler/stale_dropped"] == 9000
    assert stream_lengths(r, keys, config) == [0, 0, 0, 0]
    assert pending(r, keys, 0) == pending(r, keys, 1) == 0


def test_a_trajectory_in_the_stream_twice_is_delivered_once_and_its_copy_deleted(r, run):
    config = batcher_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    add_group(r, keys, "train", 0, 0, group_size=4, members=[0, 1, 2])
    add_trajectory(r, keys, "train", 0, 0, 2, group_size=4)  # member 2 again, before 3
    add_trajectory(r, keys, "train", 0, 0, 3, group_size=4)
    batch = batcher.get_batch(n=4, timeout_s=5)
    assert batch.traj_ids == [f"train-0-0-{m}" for m in range(4)]
    batcher.ack(batch)
    assert stream_lengths(r, keys, config) == [0, 0, 0, 0]
    assert batcher.totals["scheduler/late_dropped"] == 1


def test_a_cancellation_that_lands_with_the_awaited_result_is_never_lost() -> None:
    """A producer stopping cancels its env tasks; `within` (the producer's deadline wait)
    must keep a cancellation that arrives in the same loop step as the awaited result
    (Python 3.11's `asyncio.wait_for` returned the result and dropped it: the env task
    played on and the producer hung at exit). Made to happen: the result is set and the
    task cancelled back to back, before the task runs again."""
    import asyncio

    from producers.lifetime import within

    async def go() -> str:
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[str] = loop.create_future()
        waiting = asyncio.Event()

        async def env_step() -> str:
            waiting.set()
            return await within(reply, 30.0)

        task = asyncio.create_task(env_step())
        await waiting.wait()
        await asyncio.sleep(0)  # the task is parked on the reply
        reply.set_result("step answered")
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"

    assert asyncio.run(go()) == "cancelled"


def test_a_task_looping_on_redis_commands_ends_when_cancelled(redis_url, run) -> None:
    """`cancel_and_wait` ends a task whose cancellation redis-py dropped: its asyncio client
    sends each command through `asyncio.wait_for`, which on Python 3.11 loses a cancel that
    lands as the send finishes, and a `while True` loop over Redis commands then played on
    (the openai policy's reader of `{RUN}:servers`: its producer hung at close). Made to
    happen against the real Redis: a loop of EXISTS through the producer's own client,
    cancelled at random moments; a single cancel is seen lost, then `cancel_and_wait` ends
    every such task."""
    import asyncio
    import random

    from producers.lifetime import cancel_and_wait
    from schemas.redisconn import async_client

    async def go() -> tuple[int, int]:
        client = await async_client(redis_url)
        key = Keys(run).stop

        async def poll() -> None:
            while True:
                await client.exists(key)

        lost = ended = 0
        rng = random.Random(0)
        try:
            while ended < 40 and lost < 3:  # until three single cancels were seen lost
                once = asyncio.create_task(poll())
                await asyncio.sleep(rng.random() * 0.02)
                once.cancel()
                await asyncio.sleep(0.02)
                if not once.done():
                    lost += 1  # one cancel was not enough: redis-py dropped it
                # without the second cancels this waits for ever: fail here instead (the
                # bound is far above a loaded machine's: a dropped cancel can also cut the
                # connection, and the client's reconnect backoff then runs first)
                async with asyncio.timeout(60):
                    await cancel_and_wait(once)  # ended: cancelled, or failed on the
                ended += 1  # connection a dropped cancel cut
        finally:
            await client.aclose()
        return lost, ended

    lost, ended = asyncio.run(go())
    if lost == 0:
        pytest.skip("no cancellation was lost in 40 tries: the client no longer drops them")


def test_a_commit_submitted_after_the_committer_stopped_fails_at_once(redis_url, run) -> None:
    """An env task that commits after the producer's committer has flushed its last batch
    and returned gets an error at once, not a future that never settles (the producer's
    stop waited for that env task for ever)."""
    import asyncio

    from producers.commit import Committer, CommitterClosed
    from schemas.backoff import Backoff
    from schemas.redisconn import async_client

    keys = Keys(run)

    async def go() -> BaseException | None:
        client = await async_client(redis_url)
        try:
            committer = Committer(client, keys, "p1")
            stop = asyncio.Event()
            stop.set()
            await asyncio.wait_for(committer.run(stop, Backoff(name="test")), 5)
            late = committer.submit("train", 0, 0, 0, 0, keys.stream("train", 0),
                                    encode_trajectory(trajectory("train", 0, 0, 0, group_size=1)))
            await asyncio.sleep(0.2)  # a flush, had one been coming
            return late.exception() if late.done() else None
        finally:
            await client.aclose()

    assert isinstance(asyncio.run(go()), CommitterClosed)
