"""Partial rollouts (`policy.partial_rollout`), against the stand-in LLM server on loopback with
real producers, a real Batcher and the trainer's `ModelServers`:
- async, `in_flight: keep` (the default): a turn held in flight at a weight update finishes
  under the new weights, is sent once, carries both versions, and the server's count of
  generated tokens equals what the trajectories carry; `abort`: the update aborts it and it
  is sent again (the tokens it had are discarded);
- an operator pause lets turns in flight finish (none closed, none sent again);
- sync mode stays on-policy by default (the old step's unfinished episodes expire at the
  publish), and `sync_carry_over` carries them into the next step, their old turns marked.

Every situation is made to happen: the server holds the requests it is told to (`hold`) and
the tests wait for its counters or the producer's control state, never for a timer alone.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
import redis
from helpers import stream_messages, wait_for
from llm_helpers import (
    answered,
    discarded,
    fake_llm_factory,
    lake_config,
    run_steps,
    steps_of,
)

from consumer import Batcher, ModelServers
from consumer.batch import Batch
from consumer.partial import keeping_pause_mode
from producers import metrics
from producers.partial import InFlightRule
from schemas.config import RolloutConfig
from schemas.errors import ConfigError
from schemas.keys import Keys
from schemas.protocol import Schedule

fake_llm = pytest.fixture(fake_llm_factory)


def carried_tokens(trajs: list[dict[str, Any]]) -> int:
    return sum(len(step["response_ids"]) for traj in trajs for step in traj["steps"])


def cursors_at(r: redis.Redis, keys: Keys, k: int) -> bool:
    values = r.hvals(keys.cursor("train"))
    return len(values) == 16 and all(int(v) == k for v in values)


def producer_saw(producer: Any, reason: str) -> None:
    """Wait until the producer's control state has `reason` among its pause reasons, then
    let its loop run its interrupt pass (a few loop passes: the interrupt is the next thing
    the change wakes)."""
    serving = producer.producer._serving
    wait_for(lambda: serving is not None and reason in serving.state.paused,
             what=f"the producer to see the {reason} pause")

    async def passes() -> None:
        for _ in range(50):
            await asyncio.sleep(0)

    asyncio.run_coroutine_threadsafe(passes(), producer.producer._loop).result(10)


# -- the config and its rules (pure logic) ----------------------------------------------------
def test_partial_rollout_config_defaults_and_refusals() -> None:
    config = lake_config(["http://127.0.0.1:1/v1"])
    assert config.policy.partial_rollout.in_flight == "keep"
    assert config.policy.partial_rollout.sync_carry_over is False
    assert config.carry_steps == 0 and config.schedule("train").carry == 0
    carry = lake_config(["http://127.0.0.1:1/v1"], partial_rollout={"sync_carry_over": True})
    assert carry.carry_steps == 1 and carry.schedule("train").carry == 1
    # each carry-over belongs to its mode: a config switches modes by its ratio alone
    assert lake_config(["http://127.0.0.1:1/v1"], ratio=1,
                       partial_rollout={"sync_carry_over": True}).carry_steps == 0
    assert lake_config(["http://127.0.0.1:1/v1"], ratio=1,
                       partial_rollout={"async_carry_over": 2}).schedule("train").carry == 2
    assert lake_config(["http://127.0.0.1:1/v1"],
                       partial_rollout={"async_carry_over": 2}).carry_steps == 0
    with pytest.raises(ConfigError, match="async_carry_over"):
        lake_config(["http://127.0.0.1:1/v1"], ratio=1, partial_rollout={"async_carry_over": -1})
    with pytest.raises(ConfigError, match="in_flight"):  # resume: token-in/token-out only
        lake_config(["http://127.0.0.1:1/v1"], partial_rollout={"in_flight": "resume"})
    with pytest.raises(ConfigError, match="in_flight"):
        lake_config(["http://127.0.0.1:1/v1"], partial_rollout={"in_flight": "pause"})
    with pytest.raises(ConfigError, match="partial_rollout"):
        lake_config(["http://127.0.0.1:1/v1"], partial_rollout={"carry": True})
    random = RolloutConfig.from_dict({**_base(), "policy": {
        "type": "random", "partial_rollout": {"sync_carry_over": True}}})
    assert random.carry_steps == 1


def _base() -> dict[str, Any]:
    return {"rollout_batch_size": 8, "val_env_manager": None,
            "train_env_manager": {"num_env_groups": 2, "group_size": 4,
                                  "tags": ["FrozenLake"]}}


def test_carry_over_extends_expiry_by_one_step_and_never_admission() -> None:
    plain, carry = Schedule(2, 0), Schedule(2, 0, 1)
    for version in range(5):
        assert carry.admit_limit(version) == plain.admit_limit(version)
        assert [k for k in range(12) if carry.admitted(k, version)] == \
            [k for k in range(12) if plain.admitted(k, version)]
        first = carry.first_live(version)
        assert not carry.expired(first, version)
        assert first == 0 or carry.expired(first - 1, version)
    # step 0's episodes (k 0, 1) live through version 1, not 2
    assert plain.expired(1, 1) and not carry.expired(1, 1) and carry.expired(1, 2)
    assert carry.bound == 1 and plain.bound == 0


def test_the_pause_modes_follow_the_policy() -> None:
    keep = lake_config(["http://127.0.0.1:1/v1"]).policy
    abort = lake_config(["http://127.0.0.1:1/v1"], partial_rollout={"in_flight": "abort"}).policy
    assert [keeping_pause_mode(m, keep) for m in ("vllm", "sglang", "vllm-lora")] == \
        ["keep", "retract", None]
    assert [keeping_pause_mode(m, abort) for m in ("vllm", "sglang", "vllm-lora")] == \
        ["abort", None, None]


def test_what_a_control_change_cuts_short() -> None:
    url = ["http://127.0.0.1:1/v1"]
    keep, abort = InFlightRule(lake_config(url, ratio=1)), InFlightRule(
        lake_config(url, ratio=1, partial_rollout={"in_flight": "abort"}))
    sync_keep = InFlightRule(lake_config(url))
    sync_carry = InFlightRule(lake_config(url, partial_rollout={"sync_carry_over": True}))
    operator, sync = frozenset({"operator"}), frozenset({"sync"})
    for rule in (keep, abort, sync_keep, sync_carry):
        assert not rule.must_cut(True, frozenset())  # the gate passes: never
        assert rule.must_cut(False, operator)  # abandoned (expired, stop, handover): always
        assert rule.must_cut(None, frozenset())  # waiting for weights, not a pause
    assert not keep.must_cut(None, operator) and abort.must_cut(None, operator)
    assert not sync_keep.must_cut(None, operator)
    assert sync_keep.must_cut(None, sync)  # sync, on-policy: its episodes expire at publish
    assert not sync_carry.must_cut(None, sync)
    assert not sync_carry.must_cut(None, sync | operator)
    abort_carry = InFlightRule(lake_config(url, partial_rollout={"sync_carry_over": True,
                                                                 "in_flight": "abort"}))
    assert abort_carry.must_cut(None, sync)  # carried over, but its turn is sent again


# -- async: a weight update with turns in flight ----------------------------------------------
@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
@pytest.mark.parametrize("in_flight", ["keep", "abort"])
def test_an_async_update_keeps_a_turn_in_flight_or_sends_it_again(
        fake_llm, producer_thread, r: redis.Redis, run: str, in_flight: str,
        flavor: str) -> None:
    """vLLM 0.33 and SGLang 0.5.23 flavors, the pause mode from the policy (keep: vLLM keep,
    SGLang retract; abort: vLLM abort, SGLang's aborting update). Keep: the held turn is
    paused through the update and finishes under version 2 (spans [1, 2]), sent once; every
    token the server generated is in a trajectory. Abort: the update aborts it, it is sent
    again, and exactly the tokens the aborted requests had sampled are missing from the
    trajectories."""
    # mostly malformed replies (no-op steps): episodes run to their 6 steps, so later turns
    # are in flight when the hold starts
    server = fake_llm(flavor=flavor, latency_s=0.003, load_time_s=0.05, p_good=0.3,
                      malformed_share=1.0)
    config = lake_config([server.base_url], ratio=1, partial_rollout={"in_flight": in_flight})
    batcher = Batcher(r, config, run=run)
    servers = ModelServers.for_batcher(batcher, flavor, watch_s=None)
    assert servers.pause_mode == {("vllm", "keep"): "keep", ("vllm", "abort"): "abort",
                                  ("sglang", "keep"): "retract",
                                  ("sglang", "abort"): None}[flavor, in_flight]
    counted = discarded()
    kept_before = sum(n for (_, how), n in list(metrics.LLM.continued.items()) if how == "kept")
    producer = producer_thread()
    batches = run_steps(batcher, servers, 1)  # the server holds version 1, the run too

    server.hold('"role":"assistant"')  # turns after an episode's first
    wait_for(lambda: server.stats["held"] >= 1, what="a turn held in flight at version 1")
    aborted = server.stats["aborted"]
    updater = threading.Thread(target=servers.update, args=(2, "/ckpt/2"))
    updater.start()
    wait_for(lambda: server.options.weight_version == "2", what="the update under the hold")
    server.release()
    updater.join(30)
    # no publish: the producers finish every episode admitted at version 1 (k < 3), then wait
    wait_for(lambda: cursors_at(r, batcher.keys, 3) and server.in_flight == 0,
             what="every admitted episode committed")
    trajs = [t for b in batches for t in b.trajectories] + stream_messages(r, batcher.keys,
                                                                           config)
    assert len(trajs) == 16 * 3
    generated, carried = server.stats["tokens_generated"], carried_tokens(trajs)
    sent = Counter(body["seed"] for body in list(server.requests))
    answers = list(server.answers)
    if in_flight == "keep":
        assert server.stats["aborted"] == aborted == 0 and server.stats["cancelled"] == 0
        assert max(sent.values()) == 1, "a kept turn was sent again"
        assert carried == generated  # nothing generated was thrown away
        spanning = [step["version_spans"] for traj in trajs for step in traj["steps"]
                    if "version_spans" in step]
        assert any([row[0] for row in rows] == [1, 2] for rows in spanning)
        # counted as kept (`rollstream_turns_kept`, status): each turn whose tokens span
        # versions, once
        kept = sum(n for (_, how), n in list(metrics.LLM.continued.items()) if how == "kept")
        assert kept - kept_before == sum(len({row[0] for row in rows}) > 1
                                         for rows in spanning) > 0
        assert producer.producer.stats.record().turns_continued["kept"] == kept
        for traj in trajs:
            for step in traj["steps"]:
                rows = step.get("version_spans")
                if rows:  # the turn's version: its oldest token's
                    assert step["version"] == rows[0][0] == min(row[0] for row in rows)
        # per-token provenance: each generated token carries the version its span says,
        # and a trajectory's version_start is its oldest token's
        tokens = Batch("train", 2, trajs, [], {}).trajectory_tokens()
        assert len(tokens) == len(trajs) and discarded() == counted
        for row, i in enumerate(tokens.traj_index):
            traj = trajs[i]
            oldest = traj["steps"][0]["version"]
            for t, step in enumerate(traj["steps"]):
                got = tokens.token_versions[row][tokens.turn_ids[row] == t].tolist()
                rows = step.get("version_spans") or [[step["version"], 0,
                                                      len(step["response_ids"])]]
                assert got == [v for v, start, end in rows for _ in range(start, end)]
                oldest = min(oldest, *got)
            assert traj["version_start"] == oldest
    else:
        assert server.stats["aborted"] > aborted
        lost = [a for a in answers if a["finish_reason"] == "abort"]
        assert lost and all(sent[a["seed"]] >= 2 for a in lost)  # each one sent again
        assert generated - carried == server.stats["tokens_cut"] > 0
        assert server.stats["tokens_cut"] >= sum(a["tokens"] for a in lost)
        # the producer counts the tokens the aborting answers carried as discarded (both
        # servers answer an aborted request with its tokens so far)
        assert discarded() - counted == sum(a["tokens"] for a in lost) > 0
        record = producer.producer.stats.record()  # what `rollstream status` shows
        assert record.tokens_discarded.get("aborted", 0) == discarded()
    answered(server)  # and no turn was completed twice


def test_an_operator_pause_lets_turns_in_flight_finish(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    """`in_flight: keep`: the pause closes nothing; the held turns finish, each episode waits
    at its next turn, and after the pause nothing was sent twice."""
    server = fake_llm(latency_s=0.002)
    server.hold()
    config = lake_config([server.base_url])
    batcher = Batcher(r, config, run=run)
    producer = producer_thread()
    wait_for(lambda: server.stats["held"] == 16, what="every env's first turn held")
    firsts = {body["seed"] for body in list(server.requests)}

    batcher.redis.sadd(batcher.keys.pause, "operator")  # what `rollstream pause` does
    batcher.redis.publish(batcher.keys.control, b"pause")
    producer_saw(producer, "operator")
    assert server.stats["cancelled"] == 0
    server.release()
    wait_for(lambda: server.stats["completed"] == 16, what="the held turns answered")
    assert firsts <= set(answered(server))
    batcher.redis.srem(batcher.keys.pause, "operator")
    batcher.redis.publish(batcher.keys.control, b"pause")

    batch = batcher.get_batch(timeout_s=30)
    assert len(batch) == 16
    assert server.stats["cancelled"] == 0
    sent = Counter(body["seed"] for body in list(server.requests))
    assert all(sent[seed] == 1 for seed in firsts)  # none sent again
    assert carried_tokens(batch.trajectories) == server.stats["tokens_generated"]


# -- sync: the old step's unfinished episodes -------------------------------------------------
@pytest.mark.parametrize("carry", [False, True])
def test_sync_stays_on_policy_unless_the_carry_over_is_asked_for(
        fake_llm, producer_thread, r: redis.Redis, run: str, carry: bool) -> None:
    """Sync, vLLM full weights (pause keep). The Lake groups fill step 0's batch while the
    Slow tag's first turns are held. Default: the hand-out's pause closes them and the Slow
    episodes of step 0 expire at the publish; step 1's batch is all version 1. Carry-over:
    the held turns finish (spanning versions 0 and 1), the episodes carry over into step 1,
    which hands them out first, marked: `version_start` 0, old turns version 0, counted in
    `scheduler/carried_over`."""
    server = fake_llm(flavor="vllm", latency_s=0.002, load_time_s=0.05, p_good=0.3,
                      malformed_share=1.0)  # episodes of several turns
    server.hold("SLOW")
    config = lake_config([server.base_url], batch=8, slow_tag=True,
                         partial_rollout={"sync_carry_over": carry})
    batcher = Batcher(r, config, run=run)
    servers = ModelServers.for_batcher(batcher, "vllm", watch_s=None)
    producer = producer_thread()
    wait_for(lambda: server.stats["held"] == 8, what="the Slow envs' turns held in flight")
    slow_firsts = {body["seed"] for body in list(server.requests)
                   if "SLOW" in body["messages"][0]["content"]}

    first = batcher.get_batch(timeout_s=30)
    assert {t["tag"] for t in first.trajectories} == {"Lake"}
    producer_saw(producer, "sync")
    if not carry:
        wait_for(lambda: server.stats["cancelled"] == 8, what="the pause to close them")
    servers.update(1, "/ckpt/1")
    server.release()
    if carry:
        wait_for(lambda: slow_firsts <= set(answered(server)), what="the held turns answered")
    batcher.ack(first)
    batcher.publish_version()

    second = batcher.get_batch(timeout_s=30)
    slow = [t for t in second.trajectories if t["tag"] == "Slow"]
    if not carry:
        assert server.stats["cancelled"] == 8
        assert all(t["version_start"] == 1 for t in second.trajectories)
        assert second.metrics.get("scheduler/carried_over", 0) == 0
        committed = [m for m in stream_messages(r, Keys(run), config) if m["tag"] == "Slow"]
        assert all(m["episode_id"] >= 1 for m in committed + slow)  # episode 0: expired
        return
    assert server.stats["cancelled"] == 0
    assert len(slow) == 8 and {t["episode_id"] for t in slow} == {0}  # oldest first
    assert second.metrics["scheduler/carried_over"] == 8
    assert second.metrics["scheduler/stale_dropped"] == 0
    for traj in slow:
        head = traj["steps"][0]
        assert traj["version_start"] == 0
        assert traj["version_end"] == (1 if traj["num_actions"] > 1 else 0)
        assert head["version"] == 0 and [row[0] for row in head["version_spans"]] == [0, 1]
        assert all(step["version"] == 1 for step in traj["steps"][1:])
    sent = Counter(body["seed"] for body in list(server.requests))
    assert all(sent[seed] == 1 for seed in slow_firsts)  # kept, not sent again
    assert {seed for _, seed in steps_of([second])} >= slow_firsts


# -- async: an episode the staleness bound would expire ---------------------------------------
@pytest.mark.parametrize("carry", [0, 1])
def test_async_carry_over_keeps_an_admitted_episode_past_the_ratio(
        fake_llm, producer_thread, r: redis.Redis, run: str, carry: int) -> None:
    """Async, ratio 1, one episode per env per step. The Slow tag's first turns (episode 0,
    step 0) are held while the Lake groups fill two batches and the version moves to 2.
    Default: at version 2 episode 0 is past the ratio: the producer abandons it (its turns
    in flight are closed) and no Slow trajectory of episode 0 is ever committed.
    `async_carry_over: 1`: it lives on; released, its trajectories are committed and handed
    out first (oldest episode), `version_start` 0 at version 2, counted carried over, none
    dropped as stale, no turn sent twice."""
    server = fake_llm(flavor="vllm", latency_s=0.002, p_good=0.3, malformed_share=1.0)
    server.hold("SLOW")
    config = lake_config([server.base_url], ratio=1, batch=8, slow_tag=True,
                         partial_rollout={"async_carry_over": carry})
    assert config.schedule("train").carry == carry
    batcher = Batcher(r, config, run=run)
    producer_thread()
    wait_for(lambda: server.stats["held"] == 8, what="the Slow envs' first turns held")
    slow_firsts = {body["seed"] for body in list(server.requests)
                   if "SLOW" in body["messages"][0]["content"]}
    for _ in range(2):
        batch = batcher.get_batch(timeout_s=30)
        assert {t["tag"] for t in batch.trajectories} == {"Lake"}
        batcher.ack(batch)
        batcher.publish_version()
    assert batcher.version == 2

    def slow_committed() -> list[dict[str, Any]]:
        return [m for m in stream_messages(r, Keys(run), config)
                if m["tag"] == "Slow" and m["episode_id"] == 0]

    if not carry:
        wait_for(lambda: server.stats["cancelled"] == 8, what="the expiry to close them")
        server.release()
        wait_for(lambda: any(m["tag"] == "Slow" for m in stream_messages(r, Keys(run), config)),
                 what="the Slow envs to commit a later episode")
        assert slow_committed() == []
        return
    server.release()
    wait_for(lambda: len(slow_committed()) == 8, what="episode 0 of the Slow envs committed")
    assert server.stats["cancelled"] == 0
    third = batcher.get_batch(timeout_s=30)
    assert {(t["tag"], t["episode_id"]) for t in third.trajectories} == {("Slow", 0)}
    assert all(t["version_start"] == 0 for t in third.trajectories)
    assert third.metrics["scheduler/carried_over"] == 8
    assert third.metrics.get("scheduler/stale_dropped", 0) == 0
    sent = Counter(body["seed"] for body in list(server.requests))
    assert all(sent[seed] == 1 for seed in slow_firsts)  # kept, not sent again


def test_a_turn_kept_through_the_first_update_is_used_not_sent_again(fake_llm) -> None:
    """The pool knows the server holds version 1 (it reports versions) when a turn kept
    through the first update answers with spans `default` (launch weights) then `1`: the
    answer is used, labelled version 0 with both spans; the server is not set aside for lost
    weights and the turn is not sent again (generated twice)."""
    from llm_helpers import http
    from test_llm_pool import run_pool

    from producers.llm.chat import turn_from_answer
    from schemas.policy import ServerRecord

    server = fake_llm(flavor="vllm", latency_s=0.001)
    server.hold()
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True, "return_token_ids": True, "seed": 1}

    async def scenario(pool: Any) -> Any:
        await pool.check_model("fake-model")
        pool.set_versions({server.base_url: ServerRecord(1, checkpoint="/ckpt/1",
                                                         reports=True)})
        turn = asyncio.create_task(pool.chat(body))
        while server.stats["held"] < 1:
            await asyncio.sleep(0.01)
        for url, data in ((f"{server.url}/pause?mode=keep", {}),
                          (f"{server.url}/update_weight_version", {"new_version": "1"}),
                          (f"{server.url}/resume", {})):
            assert (await asyncio.to_thread(http, url, data))[0] == 200
        server.release()
        return await asyncio.wait_for(turn, 10)

    answer = run_pool([server.base_url], scenario)
    kept = turn_from_answer(answer.data)
    assert kept.version == 0 and kept.extra["version_spans"][0][0] == 0
    assert [row[0] for row in kept.extra["version_spans"]] == [0, 1]
    assert server.stats["requests"] == 1 and answer.attempts == 1
