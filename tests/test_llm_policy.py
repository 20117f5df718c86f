"""The openai policy end to end: producers drive the envs through a stand-in LLM server on
loopback, the Batcher hands the trajectories out, and every turn carries its tokens."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from typing import Any

import numpy as np
import pytest
import redis
from helpers import ROOT, ProducerThread, clean_env, free_port, small_config, wait_for
from llm_helpers import MODEL, fake_llm_factory, llm_config

from consumer import Batcher
from producers.llm.chat import turn_seed
from producers.policies import StepContext
from producers.producer import Producer
from schemas.envspec import DEFAULT_AGENT_SYSTEM_TEMPLATE
from schemas.errors import ConfigError
from schemas.keys import Keys

fake_llm = pytest.fixture(fake_llm_factory)

THINK_PATTERN = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>"
LAKE_TEMPLATE = "LAKE turn {turn_idx}, {actions_left} left, {max_response_length} tokens\n" \
                "{observation}"


def two_tag_config(base_urls: list[str], *, ratio: int = 0, **policy: Any):
    """Two tags with their own prompts: Lake (custom templates, 48 tokens per step) and Box
    (default templates, a pattern that requires the thinking)."""
    return small_config(
        async_generation_ratio=ratio,
        rollout_batch_size=8,
        train_env_manager={"max_env_num_per_worker": 8, "num_env_groups": 4, "group_size": 2,
                           "tags": ["Lake", "Box"]},
        val_env_manager={"max_env_num_per_worker": 8, "num_env_groups": 2, "group_size": 1,
                         "tags": ["Lake", "Box"]},
        custom_envs={
            "Lake": {"env_type": "frozen_lake", "agent_system_template": "SYS-LAKE",
                     "agent_template": LAKE_TEMPLATE, "max_tokens_per_step": 48,
                     "env_config": {"size": 4, "p": 0.8, "is_slippery": False,
                                    "max_steps": 6, "format_penalty": -0.01}},
            "Box": {"env_type": "sokoban",
                    "env_config": {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 30,
                                   "max_steps": 4, "action_pattern": THINK_PATTERN,
                                   "format_penalty": -0.15}},
        },
        policy={"type": "openai", "base_urls": base_urls, "model": MODEL, "max_tokens": 64,
                "timeout_s": 5.0, "max_retries": 2, **policy},
    )


def check_turns(batch: Any, base_urls: list[str]) -> None:
    """Every step of every trajectory is a model turn with its tokens."""
    for traj in batch.trajectories:
        for step in traj["steps"]:
            assert step["prompt_ids"].dtype == np.int32 and len(step["prompt_ids"]) > 0
            assert step["response_ids"].dtype == np.int32
            assert step["logprobs"].dtype == np.float32
            assert len(step["logprobs"]) == len(step["response_ids"]) > 0
            assert step["finish_reason"] == "stop" and step["server"] in base_urls
            assert step["latency_s"] > 0 and isinstance(step["response"], str)
    tokens = batch.trajectory_tokens()
    assert len(tokens) == len(batch) and tokens.non_extending == 0


@pytest.mark.parametrize("ratio", [0, 1], ids=["sync", "async"])
def test_a_run_with_the_openai_policy(fake_llm, producer_thread, r: redis.Redis, run: str,
                                      ratio: int) -> None:
    server = fake_llm(p_good=0.5, malformed_share=0.5, latency_s=0.002)
    config = two_tag_config([server.base_url], ratio=ratio)
    batcher = Batcher(r, config, run=run)
    producer_thread()

    first = batcher.get_batch(timeout_s=30)
    check_turns(first, [server.base_url])
    assert {t["steps"][0]["version"] for t in first.trajectories} == {0}
    batcher.ack(first)
    batcher.publish_version()
    later = batcher.get_batch(timeout_s=30)
    check_turns(later, [server.base_url])
    versions = {s["version"] for t in later.trajectories for s in t["steps"]}
    assert versions == {1} if ratio == 0 else versions <= {0, 1}
    batcher.ack(later)

    steps = [(t["tag"], s) for b in (first, later) for t in b.trajectories for s in t["steps"]]
    penalty = {"Lake": -0.01, "Box": -0.25}  # ROLL's Sokoban: a no-op step (-0.1) and -0.15
    malformed = [(tag, s) for tag, s in steps if "<answer>" not in s["response"]]
    assert malformed, "p_good 0.5: some replies are malformed"
    for tag, s in malformed:
        assert s["reward"] == pytest.approx(penalty[tag])
        assert s["info"]["action_is_valid"] is False and s["action"] == -1
    check_prompts(list(server.requests))

    val = batcher.get_batch(mode="val", timeout_s=30)
    check_turns(val, [server.base_url])
    val_seeds = {request_seed(t["seed"], t["member"], turn) for t in val.trajectories
                 for turn in range(t["num_actions"])}  # the val turns' requests
    val_bodies = [b for b in server.requests if b["seed"] in val_seeds]
    assert len(val_bodies) == len(val_seeds)
    assert {b["temperature"] for b in val_bodies} == {0.0}
    assert {b["temperature"] for b in server.requests if b["seed"] not in val_seeds} == {1.0}
    assert all(t["success"] for t in val.trajectories if t["tag"] == "Lake")


def request_seed(episode_seed: int, member: int, turn: int) -> int:
    ctx = StepContext(env=None, seed=episode_seed, version=0, mode="val", group_id=0,
                      episode_id=0, member=member, tag="", turn=turn)
    return turn_seed(ctx)


def check_prompts(bodies: list[dict[str, Any]]) -> None:
    """Each tag's requests carry its own templates, placed as ROLL places them (the system
    template alone, the env's instruction opening the first user message); conversations
    grow turn by turn."""
    lake = [b for b in bodies if b["messages"][0]["content"] == "SYS-LAKE"]
    box = [b for b in bodies if b["messages"][0]["content"] == DEFAULT_AGENT_SYSTEM_TEMPLATE]
    assert lake and box and len(lake) + len(box) == len(bodies)
    for tag_bodies, rules in ((lake, "You are solving the FrozenLake puzzle."),
                              (box, "You are solving the Sokoban puzzle.")):
        for body in tag_bodies:
            assert body["messages"][1]["content"].startswith(rules)
            assert not any(rules in m["content"] for m in body["messages"][2:])
    for body in lake:
        turns = (len(body["messages"]) - 1) // 2 + 1
        user = body["messages"][-1]["content"]
        assert f"\nLAKE turn {turns}, {6 - turns + 1} left, 48 tokens\n" in "\n" + user
        assert body["max_tokens"] == 48 and body["temperature"] in (1.0, 0.0)
        assert body["logprobs"] is True and body["return_token_ids"] is True
    for body in box:
        turns = (len(body["messages"]) - 1) // 2 + 1
        user = body["messages"][-1]["content"]
        assert f"\nTurn {turns}:\nObservation:\n" in "\n" + user
        assert f"You have {4 - turns + 1} actions left." in user
        assert "Max response length: 64 words (tokens)." in user
        assert body["max_tokens"] == 64
    grown = [b for b in bodies if len(b["messages"]) >= 4]
    assert grown and all(b["messages"][2]["role"] == "assistant" for b in grown)


def test_a_reply_without_thinking_gets_the_format_penalty_under_a_think_pattern(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    """The Box tag requires `<think>...</think>` before the answer: the stand-in model's
    answers with thinking pass, and its malformed ones (no tags at all) are penalised."""
    server = fake_llm(p_good=0.0, malformed_share=0.0)  # random moves, always well formed
    config = two_tag_config([server.base_url])
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=30)
    box = [s for t in batch.trajectories if t["tag"] == "Box" for s in t["steps"]]
    assert box and all(s["info"]["action_is_valid"] for s in box)


def test_two_servers_one_killed_mid_run(fake_llm, producer_thread, r: redis.Redis,
                                        run: str) -> None:
    a, b = fake_llm(latency_s=0.005), fake_llm(latency_s=0.005)
    config = two_tag_config([a.base_url, b.base_url], ratio=1, max_retries=1)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=30)
    # both servers in use before one dies: each episode sticks to one server (its group's),
    # so the first batch's few groups may all be on one; the servers' own counts say it
    wait_for(lambda: a.stats["completed"] > 0 and b.stats["completed"] > 0, 30,
             what="both servers answering turns")
    a.stop()
    for _ in range(3):
        batcher.ack(batch)
        batcher.publish_version()
        batch = batcher.get_batch(timeout_s=30)
        check_turns(batch, [a.base_url, b.base_url])
    assert {s["server"] for t in batch.trajectories for s in t["steps"]} == {b.base_url}
    assert batch.metrics["scheduler/failed_groups"] == 0


def test_a_4xx_fails_the_episode_without_retries(fake_llm, producer_thread, r: redis.Redis,
                                                 run: str) -> None:
    server = fake_llm(latency_s=0.002)
    config = two_tag_config([server.base_url], ratio=1)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=30)
    requests_before = server.stats["requests"]
    server.fail_next("400")
    failed = 0.0
    for _ in range(3):
        batcher.ack(batch)
        batcher.publish_version()
        batch = batcher.get_batch(timeout_s=30)
        failed += batch.metrics["scheduler/failed_groups"]
        if failed:
            break
    assert server.stats["fault:400"] == 1 and server.stats["requests"] > requests_before
    assert failed == 1  # the group of the refused episode, dropped and counted
    # the refused episode was not replayed: its turn-1 request was sent once
    firsts = [b for b in server.requests if len(b["messages"]) == 2]
    seeds = [b["seed"] for b in firsts]
    assert len(seeds) == len(set(seeds))


def start_producer(redis_url: str, run: str, env: dict[str, str],
                   log_level: str = "INFO") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rollstream", "--log-level", log_level, "produce",
         "--redis-url", redis_url, "--run", run], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_an_unknown_model_exits_1_at_start(fake_llm, r: redis.Redis, run: str,
                                           redis_url: str) -> None:
    server = fake_llm()
    config = two_tag_config([server.base_url], model="no-such-model")
    Batcher(r, config, run=run)
    proc = start_producer(redis_url, run, clean_env(), log_level="WARNING")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if "ERROR" in line]
    assert len(lines) == 1
    assert (f"model 'no-such-model' is unknown to every server ({server.base_url})"
            in lines[0])


@pytest.mark.slow
def producer_waiting_for_servers(r: redis.Redis, run: str, redis_url: str,
                                 *extra: str) -> tuple[Batcher, subprocess.Popen, list[str]]:
    """A producer process inside its policy's start (nothing listens at the base URL), with
    the lines it logged up to saying so: (the run's Batcher, the process, those lines)."""
    batcher = Batcher(r, two_tag_config([f"http://127.0.0.1:{free_port()}/v1"]), run=run)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "--log-level", "INFO", "produce", "--redis-url",
         redis_url, "--run", run, *extra], cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # evidence first: the producer is inside its policy's start
        seen.append(line)
        if "waiting for model servers" in line:
            break
    assert seen and "waiting for model servers" in seen[-1], seen
    return batcher, proc, seen


def finish(proc: subprocess.Popen, seen: list[str]) -> str:
    """The process's exit (within 20 s, else killed): asserts 0 and returns its output."""
    try:
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, "".join(seen)
    return out


def test_sigterm_while_waiting_for_model_servers_exits_0(r: redis.Redis, run: str,
                                                         redis_url: str) -> None:
    _, proc, seen = producer_waiting_for_servers(r, run, redis_url)
    # and says why (a typo'd host, TLS to a plain-HTTP port and a closed port look alike)
    assert "not answering (ClientConnectorError: Cannot connect to host 127.0.0.1:" in seen[-1]
    proc.send_signal(signal.SIGTERM)  # one signal is enough to stop, as anywhere else
    out = finish(proc, seen)
    assert "stopped while its policy was starting" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("policy, message", [
    ({"base_urls": ["http:///v1"]}, "'http:///v1' is not a server URL"),
    ({"base_urls": ["http://exa mple:80/v1"]}, "'http://exa mple:80/v1' is not a server URL"),
    ({"base_urls": ["http://127.0.0.1:99999/v1"]}, "the port is not a number in 0..65535"),
    ({"base_urls": ["http://u:sk-SECRET@127.0.0.1:1/v1"]}, "must not hold credentials"),
    ({"base_urls": ["http://h:1/v1", "http://h:1/v1/"]}, "'http://h:1/v1' is listed twice"),
    ({"api_key": "sk-SECRET"}, "api_key: a key in the config would be published"),
    # the body's model would skip the start-up check that the servers serve `model`
    ({"extra_body": {"model": "m2"}}, "policy.extra_body: 'model' is set by the "
                                      "policy itself (use policy.model)"),
    ({"extra_body": {"logprobs": False}}, "'logprobs' is set by the policy itself"),
    ({"extra_body": {"stream": True}}, "'stream' is set by the policy itself"),
])
def test_an_openai_policy_that_cannot_work_is_refused_without_its_secrets(policy, message):
    urls = policy.pop("base_urls", ["http://127.0.0.1:1/v1"])
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        two_tag_config(urls, **policy)
    assert "SECRET" not in str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["seconds", "run stopped"])
def test_a_producer_waiting_for_model_servers_honours_seconds_and_stop(
        r: redis.Redis, run: str, redis_url: str, how: str) -> None:
    extra = ["--seconds", "3"] if how == "seconds" else []
    batcher, proc, seen = producer_waiting_for_servers(r, run, redis_url, *extra)
    if how == "run stopped":
        batcher.stop_run()
    out = finish(proc, seen)  # before: it waited for the servers forever
    assert "stopped while its policy was starting" in out, "".join(seen) + out


@pytest.mark.slow
def test_the_api_key_stays_out_of_logs_argv_and_redis(fake_llm, r: redis.Redis, run: str,
                                                      redis_url: str) -> None:
    key = f"sk-test-{uuid.uuid4().hex}"
    server = fake_llm(api_key=key, latency_s=0.002)
    config = two_tag_config([server.base_url], api_key_env="ROLLSTREAM_TEST_LLM_KEY")
    batcher = Batcher(r, config, run=run)
    proc = start_producer(redis_url, run, {**clean_env(), "ROLLSTREAM_TEST_LLM_KEY": key},
                          log_level="DEBUG")
    try:
        batch = batcher.get_batch(timeout_s=60)  # the server requires the key: it was sent
        assert len(batch) == 8 and server.stats["completed"] > 0
        with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
            assert key.encode() not in cmdline.read()
        batcher.ack(batch)
        batcher.publish_version()
        assert len(batcher.get_batch(timeout_s=60)) == 8
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "producer" in out and key not in out
    assert key.encode() not in redis_dump(r, Keys(run))


def redis_dump(r: redis.Redis, keys: Keys) -> bytes:
    """Every value of every key of the run, as bytes."""
    out = []
    for name in r.scan_iter(match=keys.pattern(), count=1000):
        kind = r.type(name)
        if kind == b"string":
            out.append(r.get(name) or b"")
        elif kind == b"hash":
            out += [k + v for k, v in r.hgetall(name).items()]
        elif kind == b"set":
            out += list(r.smembers(name))
        elif kind == b"zset":
            out += [m for m, _ in r.zrange(name, 0, -1, withscores=True)]
        elif kind == b"list":
            out += r.lrange(name, 0, -1)
        elif kind == b"stream":
            out += [k + v for _, fields in r.xrange(name) for k, v in fields.items()]
        out.append(name)
    assert out, "the run has keys"
    return b"\n".join(out)


@pytest.mark.skipif(not os.environ.get("ROLLSTREAM_TEST_VLLM_URL"),
                    reason="set ROLLSTREAM_TEST_VLLM_URL (and ROLLSTREAM_TEST_VLLM_MODEL) to "
                    "run against a real vLLM server")
def test_against_a_real_vllm_server(producer_thread, r: redis.Redis, run: str) -> None:
    url = os.environ["ROLLSTREAM_TEST_VLLM_URL"]
    config = two_tag_config([url], model=os.environ.get("ROLLSTREAM_TEST_VLLM_MODEL", MODEL),
                            timeout_s=120.0)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=600)
    for traj in batch.trajectories:
        for step in traj["steps"]:
            assert len(step["logprobs"]) == len(step["response_ids"]) > 0
    assert len(batch.turn_tokens()) == sum(t["num_actions"] for t in batch.trajectories)


def test_a_turn_aborted_by_a_weight_update_leaves_no_half_turn(fake_llm) -> None:
    """SGLang aborts requests in flight while it loads weights (`finish_reason: abort`): the
    policy raises `TurnAborted` with the conversation as it was, so the producer can send the
    turn again (tests/test_generation_control.py), which records the server's new version."""
    import asyncio
    import threading

    from llm_helpers import http

    from producers.envs import build_env
    from producers.policies import make_policy
    from schemas.config import RolloutConfig
    from schemas.errors import TurnAborted

    server = fake_llm(flavor="sglang", latency_s=30.0, load_time_s=0.3)
    config: RolloutConfig = two_tag_config([server.base_url])
    env = build_env(config, "Lake")
    obs, _ = env.reset(seed=5)
    ctx = StepContext(env=env, seed=5, version=0, mode="train", group_id=0, episode_id=0,
                      member=0, tag="Lake")

    def update() -> None:
        wait_for(lambda: server.in_flight == 1, 10, what="the turn in flight")
        server.options.latency_s = 0.01
        http(f"{server.url}/update_weights_from_disk",
             {"model_path": "/ckpt/7", "weight_version": "7", "abort_all_requests": True})

    async def act() -> Any:
        policy = make_policy(config.policy)
        await policy.start()
        try:
            with pytest.raises(TurnAborted, match=f"model server {server.base_url} aborted"):
                await policy.act(obs, ctx)
            assert len(ctx.scratch["chat"]) == 1  # the system message: no user turn left
            return await policy.act(obs, ctx)  # sent again, as the producer does
        finally:
            await policy.close()

    updater = threading.Thread(target=update)
    updater.start()
    action, turn = asyncio.run(act())
    updater.join(10)
    assert server.stats["aborted"] == 1 and server.stats["completed"] == 1
    assert turn.finish_reason == "stop" and turn.version == 7
    assert turn.version_source == "server"
    assert len(ctx.scratch["chat"]) == 3  # the aborted attempt left no reply behind


def test_an_episode_that_outgrows_the_context_window_ends_truncated_with_its_turns(
        fake_llm, producer_thread, r: redis.Redis, run: str, redis_url: str, caplog) -> None:
    """A server refusing a turn for its length (vLLM's HTTP 400 "maximum context length")
    ended the episode as failed with no steps and dropped its whole group, so long episodes
    were never trained on. It ends truncated now, with the turns that fit, as ROLL ends one
    at its length limit; the group trains. vLLM 0.33 (the stand-in's default flavor) refuses
    a prompt longer than the window and cuts `max_tokens` to fit otherwise: a turn it cut
    ends the episode the same way (before, it was kept: a truncated reply, format-penalised,
    then the refusal)."""
    roomy = fake_llm(latency_s=0.001)
    config = llm_config([roomy.base_url], rollout_batch_size=16)
    measure = Batcher(r, config, run=run + "-roomy")
    first = ProducerThread(Producer(redis_url, run + "-roomy", handle_signals=False)).start()
    try:
        batch = measure.get_batch(timeout_s=30)
    finally:
        first.stop()
        measure.stop_run()
        for key in r.scan_iter(match=Keys(run + "-roomy").pattern()):
            r.delete(key)
    # a window that holds a second turn but not a third
    second = [len(t["steps"][1]["prompt_ids"]) for t in batch.trajectories
              if t["num_actions"] >= 3]
    assert second, "no episode of three turns to cut"
    window = min(second) + 64  # max_tokens 64
    tight = fake_llm(latency_s=0.001, max_model_len=window)
    config = llm_config([tight.base_url], rollout_batch_size=16)
    batcher = Batcher(r, config, run=run)
    caplog.set_level("WARNING")
    thread = producer_thread()
    batch = batcher.get_batch(timeout_s=30)
    assert batch.metrics["scheduler/failed_groups"] == 0 and len(batch) == 16
    cut = [t for t in batch.trajectories if t.get("context_full")]
    assert batch.metrics["rollout/context_full"] == len(cut)
    assert cut and tight.stats["context_overflow"] >= len(cut)
    for traj in cut:
        assert traj["truncated"] and not traj["terminated"] and not traj["failed"]
        assert traj["num_actions"] >= 1
        assert ("maximum context length" in traj["context_full"]
                or "cut the turn to fit its context window" in traj["context_full"])
        assert "max_model_len" in traj["context_full"]  # the server's own setting named
        for step in traj["steps"]:  # every turn kept ended as the model ended it
            assert len(step["prompt_ids"]) + len(step["response_ids"]) < window
            assert step["finish_reason"] == "stop"
    warned = [rec.getMessage() for rec in caplog.records
              if "outgrew the model's context window" in rec.getMessage()]
    assert len(warned) == 1, warned
    assert sum(thread.producer.stats.context_full_by.values()) >= len(cut)


def test_a_server_that_keeps_aborting_turns_is_warned_about_once(fake_llm, monkeypatch,
                                                                  caplog) -> None:
    """A server stuck loading weights answers every turn `finish_reason: abort`; the turns
    were sent again ~5 times a second per env for ever with nothing logged above debug."""
    import asyncio

    from llm_helpers import http

    import producers.policies.openai as openai_policy
    from producers.envs import build_env
    from producers.policies import make_policy
    from schemas.errors import TurnAborted

    monkeypatch.setattr(openai_policy, "ABORT_WARN_S", 0.3)
    server = fake_llm(flavor="sglang", load_time_s=600, during_load="abort")
    import threading

    def update() -> None:  # loads for 600 s: ends when the server stops at teardown
        try:
            http(f"{server.url}/update_weights_from_disk",
                 {"model_path": "/ckpt/1", "weight_version": "1"}, timeout_s=30)
        except OSError:
            pass

    threading.Thread(target=update, daemon=True).start()
    config = two_tag_config([server.base_url])
    env = build_env(config, "Lake")
    obs, _ = env.reset(seed=5)
    ctx = StepContext(env=env, seed=5, version=0, mode="train", group_id=0, episode_id=0,
                      member=0, tag="Lake")
    caplog.set_level("WARNING")

    async def act() -> int:
        policy = make_policy(config.policy)
        await policy.start()
        aborted = 0
        try:
            started = asyncio.get_running_loop().time()
            while asyncio.get_running_loop().time() - started < 0.8:
                with pytest.raises(TurnAborted):
                    await policy.act(obs, ctx)
                aborted += 1
                await asyncio.sleep(0.05)
        finally:
            await policy.close()
        return aborted

    wait_for(lambda: server.loading, 10, what="the update loading")
    aborted = asyncio.run(act())
    warned = [r.getMessage() for r in caplog.records if "has aborted every turn" in r.getMessage()]
    assert aborted >= 5 and len(warned) == 1, (aborted, warned)
    assert server.base_url in warned[0]


def test_a_first_prompt_that_does_not_fit_fails_its_episode_loudly(
        fake_llm, producer_thread, r: redis.Redis, run: str, caplog) -> None:
    """A context window too small for even the first turn gave trajectories of 0 steps that
    trained as a healthy-looking batch (empty token arrays). Such an episode fails, naming
    the cause, and its group is dropped and counted."""
    server = fake_llm(latency_s=0.001, max_model_len=80)
    config = llm_config([server.base_url], rollout_batch_size=16)
    batcher = Batcher(r, config, run=run)
    caplog.set_level("WARNING")
    producer_thread()
    from schemas.errors import StepExhausted

    with pytest.raises(StepExhausted):
        batcher.get_batch(timeout_s=30)
    assert "the first prompt does not fit the model's context window" in caplog.text
    assert "--max-model-len (max_model_len), 80 tokens" in caplog.text  # vLLM's own name
    assert "max_model_len" not in caplog.text.replace("(max_model_len)", "")
    assert server.stats["completed"] == 0
