"""The sample stream the producers write for `rollstream ui`: which group episodes are
sampled, what a sample holds, and that the commit script writes one exactly when its commit
lands (fenced, paused and duplicate commits leave none), trimmed on write."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import msgpack
import numpy as np
import pytest
import redis
from helpers import small_config, stream_messages, wait_for

from consumer import Batcher
from producers.commit import Committer, Outcome
from schemas.backoff import Backoff
from schemas.codec import ENTRY_FIELD, encode_trajectory
from schemas.errors import ConfigError, DecodeError
from schemas.keys import Keys
from schemas.redisconn import async_client
from schemas.samples import (
    MAX_SAMPLE_BYTES,
    MAX_TEXT_CHARS,
    Sampler,
    decode_sample,
    encode_sample,
    sample_of,
)


# -- which episodes -----------------------------------------------------------------------------
def test_the_sampler_picks_group_episodes_at_the_rate_and_the_same_every_time() -> None:
    chosen = Sampler(0.02, seed=42)
    picks = [(m, g, k) for m in ("train", "val") for g in range(200) for k in range(100)
             if chosen(m, g, k)]
    assert 0.015 < len(picks) / 40_000 < 0.025
    assert picks == [(m, g, k) for m in ("train", "val") for g in range(200)
                     for k in range(100) if Sampler(0.02, seed=42)(m, g, k)]
    # spread over groups and episodes, not a few groups every time
    assert len({g for _, g, _ in picks}) > 150 and len({k for _, _, k in picks}) > 80
    other = {(m, g, k) for m in ("train", "val") for g in range(200) for k in range(100)
             if Sampler(0.02, seed=43)(m, g, k)}
    assert len(other & set(picks)) < 0.2 * len(picks)  # another seed, other episodes
    assert not any(Sampler(0.0, seed=42)("train", g, k) for g in range(100) for k in range(10))
    assert all(Sampler(1.0, seed=42)("val", g, k) for g in range(100) for k in range(10))
    assert not Sampler(0.0, seed=1).enabled and Sampler(0.5, seed=1).enabled


def test_the_sample_rate_and_stream_length_are_checked_config_fields() -> None:
    assert small_config().sample_rate == 0.02 and small_config().sample_stream_len == 128
    assert small_config(sample_rate=0).sample_rate == 0
    with pytest.raises(ConfigError, match="sample_rate"):
        small_config(sample_rate=1.5)
    with pytest.raises(ConfigError, match="sample_stream_len"):
        small_config(sample_stream_len=0)


# -- what a sample holds -------------------------------------------------------------------------
def llm_trajectory(turns: int = 3, reply: str = "<answer>Down</answer>") -> dict[str, Any]:
    steps = [{"observation": "P___\nO___\n____\nO__G", "action": 1, "reward": 0.0, "version": 2,
              "info": {"action_is_valid": True, "success": False},
              "response": reply, "prompt_ids": np.arange(300, dtype=np.int32),
              "response_ids": np.arange(12, dtype=np.int32),
              "logprobs": np.zeros(12, dtype=np.float32), "finish_reason": "stop",
              "server": "http://127.0.0.1:9/v1", "latency_s": 0.25,
              "tool_calls": [{"name": "python", "arguments": "print(1)"}]}
             for _ in range(turns)]
    return {"schema": 1, "traj_id": "train-3-7-1", "traj_group_id": "train-3-7", "mode": "train",
            "group_id": 3, "episode_id": 7, "member": 1, "env_id": 13, "tag": "FrozenLake",
            "seed": 5, "version_start": 2, "version_end": 2, "episode_score": 0.0,
            "success": False, "terminated": False, "truncated": True, "num_actions": turns,
            "steps": steps, "final_observation": np.zeros((4, 4), dtype=np.int8),
            "producer": "p1", "failed": False, "finished_at": 1.0, "context_full": "too long"}


def test_a_sample_keeps_what_a_person_reads_and_drops_the_token_arrays() -> None:
    sample = decode_sample(encode_sample(sample_of(
        llm_trajectory(), run_version=3, action_names=("Left", "Down", "Right", "Up"))))
    assert sample["traj_id"] == "train-3-7-1" and sample["run_version"] == 3
    assert sample["context_full"] == "too long" and sample["truncated"] is True
    assert sample["final_observation"] == [[0] * 4] * 4  # a grid travels as a grid
    step = sample["steps"][0]
    assert step["observation"] == "P___\nO___\n____\nO__G"
    assert step["response"] == "<answer>Down</answer>" and step["action_name"] == "Down"
    assert step["prompt_tokens"] == 300 and step["response_tokens"] == 12
    assert not {"prompt_ids", "response_ids", "logprobs"} & set(step)
    assert step["tool_calls"] == [{"name": "python", "arguments": "print(1)"}]
    assert (step["server"], step["latency_s"], step["finish_reason"]) == \
        ("http://127.0.0.1:9/v1", 0.25, "stop")
    assert len(encode_sample(sample_of(llm_trajectory(), run_version=3))) < \
        len(encode_trajectory(llm_trajectory())) / 2


def test_a_large_trajectory_is_cut_to_the_sample_limit_with_what_was_left_out_said() -> None:
    long = "x" * (MAX_TEXT_CHARS + 500)
    traj = llm_trajectory(turns=40, reply=long)
    data = encode_sample(sample_of(traj, run_version=0))
    assert len(data) <= MAX_SAMPLE_BYTES
    sample = decode_sample(data)
    assert sample["steps"][0]["response"].endswith("... [500 more characters]")
    omitted = sample["steps_omitted"]
    assert omitted["count"] + len(sample["steps"]) == 40 and omitted["from"] > 0
    assert sample["num_actions"] == 40
    # nothing is too big: a step with a huge info still leaves the trajectory's fields
    huge = llm_trajectory(turns=1)
    huge["steps"][0]["info"] = {f"k{i}": "y" * MAX_TEXT_CHARS for i in range(60)}
    bare = decode_sample(encode_sample(sample_of(huge, run_version=0)))
    assert bare["steps"] == [] and bare["steps_omitted"] == {"from": 0, "count": 1}
    assert bare["traj_id"] == "train-3-7-1" and bare["episode_score"] == 0.0


def test_a_sample_that_is_not_one_is_named() -> None:
    with pytest.raises(DecodeError, match="not msgpack"):
        decode_sample(b"\xc1")
    with pytest.raises(DecodeError, match="sample schema"):
        decode_sample(msgpack.packb({"traj_id": "x"}))
    with pytest.raises(DecodeError, match="'steps'"):
        decode_sample(msgpack.packb({"sample": 1, "traj_id": "x", "mode": "train",
                                     "group_id": 0, "episode_id": 0, "member": 0}))


# -- the commit script writes them ---------------------------------------------------------------
def commit_all(url: str, keys: Keys, items: list[tuple[int, int, bytes | None]], *,
               producer: str = "p1", stream_len: int = 128) -> list[Outcome]:
    """Commit (env, episode, sample) items of train shard 0 through a real Committer."""
    async def go() -> list[Outcome]:
        client = await async_client(url)
        committer = Committer(client, keys, producer, sample_stream_len=stream_len)
        stop = asyncio.Event()
        runner = asyncio.create_task(committer.run(stop, Backoff(name="test")))
        try:
            futures = [committer.submit("train", 0, 0, env, k, keys.stream("train", 0),
                                        encode_trajectory(trajectory(env, k)), sample=sample)
                       for env, k, sample in items]
            return list(await asyncio.wait_for(asyncio.gather(*futures), 10))
        finally:
            stop.set()
            await runner
            await client.aclose()
    return asyncio.run(go())


def trajectory(env: int, k: int) -> dict[str, Any]:
    traj = llm_trajectory(turns=1)
    traj.update(env_id=env, group_id=0, episode_id=k, member=env,
                traj_id=f"train-0-{k}-{env}", traj_group_id=f"train-0-{k}")
    return traj


def sample_bytes(env: int, k: int, pad: int = 0) -> bytes:
    traj = trajectory(env, k)
    traj["pad"] = "z" * pad
    return encode_sample(sample_of(traj, run_version=0))


def samples_in(r: redis.Redis, keys: Keys) -> list[str]:
    return [decode_sample(fields[ENTRY_FIELD])["traj_id"] for _, fields in r.xrange(keys.samples)]


def test_a_sample_is_written_only_with_a_commit_that_lands(r: redis.Redis, run: str,
                                                           redis_url: str) -> None:
    keys = Keys(run)
    r.set(keys.lease("train", 0), "p1")
    outcomes = commit_all(redis_url, keys, [(0, 0, sample_bytes(0, 0)), (1, 0, None),
                                            (2, 0, sample_bytes(2, 0))])
    assert outcomes == [Outcome.COMMITTED] * 3
    assert samples_in(r, keys) == ["train-0-0-0", "train-0-0-2"]
    # the same episodes again (a resend, a replay after a takeover): duplicates, no sample
    assert commit_all(redis_url, keys, [(0, 0, sample_bytes(0, 0)),
                                        (2, 0, sample_bytes(2, 0))]) == [Outcome.DUPLICATE] * 2
    assert samples_in(r, keys) == ["train-0-0-0", "train-0-0-2"]
    # a mix in one script call: only the one that lands leaves its sample
    assert commit_all(redis_url, keys, [(0, 0, sample_bytes(0, 0)), (0, 1, sample_bytes(0, 1))]
                      ) == [Outcome.DUPLICATE, Outcome.COMMITTED]
    assert samples_in(r, keys) == ["train-0-0-0", "train-0-0-2", "train-0-1-0"]


def test_a_fenced_or_paused_commit_leaves_no_sample(r: redis.Redis, run: str,
                                                    redis_url: str) -> None:
    keys = Keys(run)
    r.set(keys.lease("train", 0), "another-producer")
    assert commit_all(redis_url, keys, [(0, 0, sample_bytes(0, 0))]) == [Outcome.LEASE_LOST]
    r.set(keys.lease("train", 0), "p1")
    r.sadd(keys.pause, "operator")
    assert commit_all(redis_url, keys, [(0, 0, sample_bytes(0, 0))]) == [Outcome.PAUSED]
    assert not r.exists(keys.samples) and r.xlen(keys.stream("train", 0)) == 0
    r.srem(keys.pause, "operator")
    assert commit_all(redis_url, keys, [(0, 0, sample_bytes(0, 0))]) == [Outcome.COMMITTED]
    assert samples_in(r, keys) == ["train-0-0-0"]


def test_the_sample_stream_is_trimmed_on_write(r: redis.Redis, run: str, redis_url: str) -> None:
    keys = Keys(run)
    r.set(keys.lease("train", 0), "p1")
    # samples past a stream node's 4 KiB: `MAXLEN ~` trims them one by one
    commit_all(redis_url, keys, [(env, 0, sample_bytes(env, 0, pad=5000)) for env in range(30)],
               stream_len=8)
    kept = samples_in(r, keys)
    assert 8 <= len(kept) <= 9 and kept[-1] == "train-0-0-29"
    # small samples share nodes: trimmed whole nodes at a time, never unbounded
    commit_all(redis_url, keys, [(env, 1, sample_bytes(env, 1)) for env in range(300)],
               stream_len=8)
    assert r.xlen(keys.samples) <= 8 + 100  # a node holds at most 100 entries


@pytest.mark.slow
def test_producers_sample_whole_group_episodes_of_what_they_commit(r: redis.Redis, run: str,
                                                                  producer_thread) -> None:
    config = small_config(sample_rate=0.5, policy={"type": "random", "latency_s": 0.001})
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    producer_thread()

    def samples() -> list[dict[str, Any]]:
        return [decode_sample(f[ENTRY_FIELD]) for _, f in r.xrange(keys.samples)]

    def whole_group() -> bool:
        counts = Counter((s["mode"], s["group_id"], s["episode_id"]) for s in samples())
        return any(n == 4 for (mode, _, _), n in counts.items() if mode == "train")

    wait_for(whole_group, timeout_s=30, what="every member of a sampled train group episode")
    producer_sampler = Sampler(config.sample_rate, config.seed)
    committed = {m["traj_id"]: m for m in stream_messages(r, keys, config)}
    got = samples()
    assert len({s["traj_id"] for s in got}) == len(got)  # none twice
    for sample in got:
        assert producer_sampler(sample["mode"], sample["group_id"], sample["episode_id"])
        assert sample["run_version"] == 0
        if sample["traj_id"] in committed:  # (a batcher could have taken it)
            traj = committed[sample["traj_id"]]
            assert sample["episode_score"] == traj["episode_score"]
            assert [s["action"] for s in sample["steps"]] == [s["action"] for s in traj["steps"]]
    assert {s["traj_id"] for s in got} & set(committed)
    unsampled = [t for t in committed.values()
                 if not producer_sampler(t["mode"], t["group_id"], t["episode_id"])]
    assert unsampled and not {t["traj_id"] for t in unsampled} & {s["traj_id"] for s in got}
    assert len(batcher.get_batch(timeout_s=30)) == 16  # the batches are what they were
