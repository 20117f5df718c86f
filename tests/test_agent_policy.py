"""A python policy's own agent loop (`policy.llm`, producers/policies/agent.py): the example
agent (examples/agent_policy.py) end to end against the stand-in server, an agent's calls
token-in/token-out with the repository's generated tokenizer, each call recorded on its step
in call order with its version, and what a bad `llm` block says."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from helpers import (
    ONE_STEP_ENV_ID,
    ROOT,
    clean_env,
    publish,
    small_config,
    stream_messages,
    wait_for,
)
from llm_helpers import MODEL, fake_llm_factory
from real_servers import load_tiny_model_script

from consumer import Batcher, ModelServers
from producers.control import ControlState
from producers.envs import build_env, make_env
from producers.llm.chat import turn_seed
from producers.policies import StepContext, make_policy
from producers.policies.agent import CALL_SEED_STRIDE, CALLS_KEY, CONVERSATIONS_KEY, recorded
from producers.policies.protocol import Turn
from producers.rollout import EnvSlot, play_episode
from rollstream.fake_llm import player
from schemas.codec import ENTRY_FIELD, encode_trajectory
from schemas.errors import BatchTimeout
from schemas.keys import Keys
from schemas.policy import server_record

fake_llm = pytest.fixture(fake_llm_factory)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
AGENTS = str(Path(__file__).parent / "agent_policies.py")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    out = tmp_path_factory.mktemp("tiny")
    load_tiny_model_script().generate(out, seed=0)
    return out


def calls_of(step: dict[str, Any]) -> list[dict[str, Any]]:
    """A step's model calls in call order: its `model_calls`, then its own."""
    return [*step.get("model_calls", ()), step]


def seeds_of(traj: dict[str, Any], step: int, calls: int) -> list[int]:
    """The request seed of each call of a step (what the agent client sends)."""
    ctx = StepContext(env=None, seed=traj["seed"], version=0, mode=traj["mode"], group_id=0,
                      episode_id=0, member=traj["member"], tag="", turn=step)
    return [(turn_seed(ctx) + k * CALL_SEED_STRIDE) & 0x7FFF_FFFF for k in range(calls)]


def check_tokens(batch: Any, version: int) -> None:
    """turn_tokens: one row per call, in call order; trajectory_tokens: every call's reply
    trainable with its version, the step's reward on its last call's last token."""
    rows = batch.turn_tokens()
    expected = [(i, t, c) for i, traj in enumerate(batch.trajectories)
                for t, step in enumerate(traj["steps"]) for c in range(len(calls_of(step)))]
    assert list(zip(rows.traj_index, rows.turn_index, rows.call_index, strict=True)) == expected
    flat = [call for traj in batch.trajectories for step in traj["steps"]
            for call in calls_of(step)]
    for row, call in enumerate(flat):
        n = int(rows.response_lengths[row])
        assert np.array_equal(rows.response_ids[row, :n], call["response_ids"])
        assert np.array_equal(rows.prompt_ids[row, :int(rows.prompt_lengths[row])],
                              call["prompt_ids"])
    assert set(rows.versions.tolist()) == {version}
    tokens = batch.trajectory_tokens()
    assert tokens.non_extending == tokens.missing_ids == 0
    assert len(tokens) == len(batch.trajectories)
    for m, i in enumerate(tokens.traj_index):
        steps = batch.trajectories[i]["steps"]
        mask = tokens.loss_mask[m].astype(bool)
        replies = np.concatenate([call["response_ids"] for step in steps
                                  for call in calls_of(step)])
        assert np.array_equal(tokens.input_ids[m][mask], replies)  # every call, in order
        assert set(tokens.token_versions[m][mask].tolist()) == {version}
        assert (tokens.token_versions[m][~mask] == -1).all()
        ends = [int(np.flatnonzero(tokens.turn_ids[m] == t)[-1]) for t in range(len(steps))]
        assert tokens.token_rewards[m][ends].tolist() == [s["reward"] for s in steps]
        assert np.count_nonzero(tokens.token_rewards[m]) <= len(steps)


# -- the example agent: a math solver with a python tool, end to end -------------------------
def math_config(base_url: str) -> Any:
    return small_config(
        rollout_batch_size=8,
        train_env_manager={"max_env_num_per_worker": 8, "num_env_groups": 4, "group_size": 2,
                           "tags": ["Math"]},
        val_env_manager={"max_env_num_per_worker": 8, "num_env_groups": 2, "group_size": 1,
                         "tags": ["Math"]},
        custom_envs={"Math": {"env_type": "rg:basic_arithmetic", "env_config": {"size": 100}}},
        policy={"type": "python", "entrypoint": f"{ROOT}/examples/agent_policy.py:make_agent",
                "llm": {"base_urls": [base_url], "model": MODEL, "max_tokens": 256,
                        "timeout_s": 10.0}})


def test_the_example_agent_solves_with_the_tool_and_records_every_call(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    pytest.importorskip("reasoning_gym")
    server = fake_llm(latency_s=0.001, malformed_share=0.0)
    batcher = Batcher(r, math_config(server.base_url), run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    answers = {a["seed"]: a for a in list(server.answers)}
    requests = {body["seed"]: body for body in list(server.requests)}
    for traj in batch.trajectories:
        (step,) = traj["steps"]
        tool_call, answer = calls_of(step)  # the program, then the boxed answer
        assert "<tool_call>" in tool_call["response"] and "\\boxed{" in answer["response"]
        assert step["reward"] == 1.0  # the sandbox computed it, the env checked it
        seeds = seeds_of(traj, 0, 2)
        for call, seed in zip((tool_call, answer), seeds, strict=True):
            # the ids the server sampled for that request: its reply's pieces and end token
            assert call["response_ids"].tolist() == [
                *player.encode(call["response"]), player.token_id("<|im_end|>")]
            assert len(call["response_ids"]) == answers[seed]["tokens"]
            assert call["version"] == 0 and call["version_source"] == "producer"
            assert len(call["logprobs"]) == len(call["response_ids"])
        second = requests[seeds[1]]["messages"]  # the reply, then the program's output
        assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
        assert second[2]["content"] == tool_call["response"]
        assert answer["response"].count(second[3]["content"].strip().splitlines()[0]) >= 1
    check_tokens(batch, 0)
    batcher.ack(batch)


# -- token-in/token-out: each message list its own conversation ------------------------------
def lake_agent_config(base_urls: list[str], tokenizer: str | None, ratio: int = 0,
                      **kwargs: Any) -> Any:
    lake = {"env_type": "frozen_lake", "env_config": {"size": 4, "p": 0.8,
                                                      "is_slippery": False, "max_steps": 4}}
    return small_config(
        rollout_batch_size=8, val_env_manager=None, custom_envs={"Lake": lake},
        async_generation_ratio=ratio,
        train_env_manager={"num_env_groups": 2, "group_size": 4, "tags": ["Lake"]},
        policy={"type": "python", "entrypoint": f"{AGENTS}:make_reconsider", **kwargs,
                "llm": {"base_urls": base_urls, "model": MODEL, "max_tokens": 64,
                        "timeout_s": 10.0, **({"tokenizer": tokenizer} if tokenizer else {})}})


@pytest.mark.parametrize("subcall", [False, True], ids=["one-conversation", "with-subcall"])
def test_token_in_token_out_calls_extend_their_own_conversation(
        fake_llm, producer_thread, r: redis.Redis, run: str, model_dir: Path,
        subcall: bool) -> None:
    from producers.llm.template import ChatTemplate

    tokenizer = str(model_dir / "thinking")  # drops earlier thinking when re-rendered
    servers = [fake_llm(tokenizer=str(model_dir / "tokenizer.json"), latency_s=0.001)
               for _ in range(2)]
    config = lake_agent_config([s.base_url for s in servers], tokenizer, subcall=subcall)
    for server in servers:  # the trainer's record: version 2, so every call is labelled 2
        r.hset(Keys(run).servers, server.base_url, server_record(2))
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    template = ChatTemplate.load(tokenizer)
    requests = {body["seed"]: body for s in servers for body in list(s.requests)}
    sessions: dict[tuple[int, int], set[str]] = {}  # a group's episode -> its calls' servers
    multi = 0
    for traj in batch.trajectories:
        steps = traj["steps"]
        multi += len(steps) > 1
        for t, step in enumerate(steps):
            calls = calls_of(step)
            assert len(calls) == (3 if subcall else 2)
            for call, seed in zip(calls, seeds_of(traj, t, len(calls)), strict=True):
                assert requests[seed]["prompt"] == call["prompt_ids"].tolist()  # as sent
                assert call["response_ids_source"] == "server"
                assert template.decode(call["response_ids"].tolist()) == call["response"]
                assert (call["version"], call["version_source"]) == (2, "recorded")
                sessions.setdefault((traj["group_id"], traj["episode_id"]), set()).add(
                    call["server"])
            first, final = calls[0], calls[-1]
            sent = np.concatenate([first["prompt_ids"], first["response_ids"]])
            assert np.array_equal(final["prompt_ids"][:len(sent)], sent)  # extends the first
            if subcall:  # a fresh list: rendered afresh, never extended by the others
                assert "Are you sure" not in template.decode(calls[1]["prompt_ids"].tolist())
                assert calls[1]["response"] not in template.decode(
                    final["prompt_ids"].tolist())
        for before, after in zip(steps, steps[1:], strict=False):
            sent = np.concatenate([before["prompt_ids"], before["response_ids"]])
            assert np.array_equal(after["model_calls"][0]["prompt_ids"][:len(sent)], sent)
    assert multi, "no episode had a second step"
    assert traj_versions(batch) == {(2, 2)}
    # sticky: every call of a group's episode went to one server (the openai policy's key)
    assert all(len(used) == 1 for used in sessions.values()), sessions
    if subcall:  # the sub-call's prompt does not extend the conversation: not joined
        assert batch.trajectory_tokens().non_extending == len(batch.trajectories)
        rows = batch.turn_tokens()
        assert len(rows) == 3 * sum(len(t["steps"]) for t in batch.trajectories)
    else:
        check_tokens(batch, 2)
    batcher.ack(batch)


def test_an_agents_call_aborted_by_an_update_resumes_from_its_tokens(
        fake_llm, producer_thread, r: redis.Redis, run: str, model_dir: Path) -> None:
    """`partial_rollout.in_flight: resume` on a python policy's block rules its agent's
    calls as it does the openai policy's turns (one path, `OpenAIPolicy.sample`): the
    stand-in vLLM server holds the calls, the update (`/pause?mode=abort`) aborts them with
    their tokens so far, and each aborted call is continued from them: every recorded call's
    ids are the server's answers to its seed, in order, each once; nothing discarded."""
    from llm_helpers import discarded

    server = fake_llm(flavor="vllm", tokenizer=str(model_dir / "tokenizer.json"),
                      latency_s=0.003, load_time_s=0.05)
    config = lake_agent_config([server.base_url], str(model_dir),
                               ratio=1, partial_rollout={"in_flight": "resume"})
    batcher = Batcher(r, config, run=run)
    servers = ModelServers.for_batcher(batcher, "vllm", watch_s=None)
    assert servers.pause_mode == "abort"
    lost = discarded()
    producer_thread()
    batches = [batcher.get_batch(timeout_s=30)]
    servers.update(1, "/ckpt/1")
    batcher.ack(batches[0])
    batcher.publish_version(1)

    server.hold()
    wait_for(lambda: server.stats["held"] >= 4, what="calls held in flight at version 1")
    aborted = server.stats["aborted"]
    servers.update(2, "/ckpt/2")  # aborts the held calls (vLLM's abort pause)
    assert server.stats["aborted"] > aborted
    server.release()
    wait_for(lambda: all(int(v) == 3 for v in r.hvals(batcher.keys.cursor("train")))
             and server.in_flight == 0, what="every admitted episode committed")
    trajs = [t for b in batches for t in b.trajectories] + stream_messages(r, batcher.keys,
                                                                           config)
    assert len(trajs) == 8 * 3
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for answer in list(server.answers):
        by_seed.setdefault(answer["seed"], []).append(answer)
    resumed = 0
    for traj in trajs:
        for t, step in enumerate(traj["steps"]):
            calls = calls_of(step)
            for call, seed in zip(calls, seeds_of(traj, t, len(calls)), strict=True):
                answers = by_seed[seed]  # this call's requests: aborted ones, then the last
                assert call["response_ids"].tolist() == [i for a in answers for i in a["ids"]]
                assert call.get("resumed", 0) == len(answers) - 1
                resumed += call.get("resumed", 0) > 0
    assert resumed, "no call was resumed"
    assert discarded() == lost


def test_the_trainers_model_servers_are_the_agents(r: redis.Redis, run: str) -> None:
    urls = ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]
    batcher = Batcher(r, lake_agent_config(urls, ""), run=run)
    assert ModelServers.for_batcher(batcher).base_urls == urls


def traj_versions(batch: Any) -> set[tuple[int, int]]:
    return {(t["version_start"], t["version_end"]) for t in batch.trajectories}


def test_a_failed_act_records_nothing_and_leaves_the_ids_as_they_were(
        fake_llm, model_dir: Path) -> None:
    server = fake_llm(tokenizer=str(model_dir / "tokenizer.json"))
    config = lake_agent_config([server.base_url], str(model_dir), fail_after=1)
    policy = make_policy(config.policy)
    env = build_env(config, "Lake")
    observation, _ = env.reset(seed=3)
    ctx = StepContext(env=env, seed=3, version=0, mode="train", group_id=0, episode_id=0,
                      member=0, tag="Lake")

    async def go() -> None:
        await policy.start()
        try:
            with pytest.raises(RuntimeError, match="failed after one call"):
                await policy.act(observation, ctx)
            with pytest.raises(RuntimeError, match="inside act"):  # not recorded: refused
                await policy.llm.chat([{"role": "user", "content": "hi"}], ctx)
        finally:
            await policy.close()

    asyncio.run(go())
    assert len(server.requests) == 1  # the call was made, then the act failed
    assert CALLS_KEY not in ctx.scratch and CONVERSATIONS_KEY not in ctx.scratch
    assert len(ctx.scratch["messages"]) == 1  # the agent's own: the system message


# -- a bad llm block -------------------------------------------------------------------------
@pytest.mark.parametrize("llm,message", [
    ("{model: m, base_urls: ['http://h:1/v1'], temprature: 0.5}",
     "policy.llm.temprature: Extra inputs are not permitted"),
    ("{model: m, base_urls: ['ftp://h/v1']}",
     "policy.llm.base_urls: 'ftp://h/v1' is not an http:// or https:// URL"),
    ("{model: m, base_urls: ['http://h:1/v1'], partial_rollout: {in_flight: abort}}",
     "policy.llm: partial_rollout: set it on the policy block, not in llm"),
])
def test_a_bad_llm_block_is_one_line_and_exit_2(tmp_path: Path, llm: str,
                                                message: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("rollout_batch_size: 8\n"
                    "train_env_manager: {num_env_groups: 4, group_size: 2, tags: [FrozenLake]}\n"
                    f"policy:\n  type: python\n  entrypoint: 'agent.py:make'\n  llm: {llm}\n")
    out = subprocess.run([sys.executable, "-m", "rollstream", "config", "check", str(path)],
                         cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [f"rollstream: error: {path}: {message}"]


# -- the staleness bound counts an agent's oldest call ---------------------------------------
class OlderFirstCall:
    """One step of two calls: the first generated by version 1, the last by version 3 (the
    weights moved between them), recorded as the agent client records them."""

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, Turn]:
        first = Turn(text="a", prompt_ids=[1, 2], response_ids=[3, 4, 5], logprobs=[-1.0] * 3,
                     version=1, version_source="recorded")
        last = Turn(text="b", prompt_ids=[1, 2, 3, 4, 5, 6], response_ids=[7, 8, 9, 10],
                    logprobs=[-1.0] * 4, version=3, version_source="recorded")
        return 0, recorded(last, [first, last])


def test_the_staleness_bound_counts_an_agents_oldest_call(r: redis.Redis, run: str) -> None:
    """Async, ratio 1, the run at version 3: an episode of step 3 whose step's first call came
    from version 1 is 2 versions behind, dropped as stale with both calls' 7 tokens counted
    as discarded. Labelled by its last call (3) it would pass."""
    batcher = Batcher(r, small_config(async_generation_ratio=1), run=run)
    for _ in range(3):
        publish(batcher)
    k = 12  # created at step 3 (4 episodes per step): live, admitted at version 3

    async def play(member: int) -> dict[str, Any]:
        async def gate() -> bool:
            return True

        slot = EnvSlot(mode="train", env_id=member, group_id=0, member=member, shard=0,
                       tag="FrozenLake", env=make_env(ONE_STEP_ENV_ID, {}), k=k)
        control = ControlState()
        control.version = 3
        return await play_episode(slot, seed=1, producer_id="p", policy=OlderFirstCall(),
                                  control=control, gate=gate)

    trajs = [asyncio.run(play(member)) for member in range(4)]
    assert all((t["version_start"], t["version_end"]) == (1, 3) for t in trajs)
    for t in trajs:
        r.xadd(batcher.keys.stream("train", 0), {ENTRY_FIELD: encode_trajectory(t)})
    with pytest.raises(BatchTimeout):  # looks once: the group is read and dropped
        batcher.get_batch(timeout_s=0)
    totals = batcher._shared.totals
    assert totals["scheduler/stale_dropped"] == 4
    assert totals["tokens_discarded/stale"] == 4 * 7


def test_the_docs_show_the_example_as_it_is() -> None:
    """docs/policies.md shows the example's class; a change to one must reach the other."""
    docs = (ROOT / "docs/policies.md").read_text()
    shown = docs.split("```python\nclass Solver:", 1)[1].split("```", 1)[0]
    example = (ROOT / "examples/agent_policy.py").read_text()
    assert "class Solver:" + shown in example
    assert len(shown.strip().splitlines()) + 1 <= 30
