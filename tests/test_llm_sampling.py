"""A turn's sampling as ROLL applies it: the mode's settings, ROLL's token cap
`min(max_tokens_per_step, max_new_tokens, sequence_length - prompt tokens)`, and the episode's
end when the prompt reaches `sequence_length` (roll/pipeline/agentic/env_manager/
traj_env_manager.py `make_decision`, alibaba/ROLL 8eb27cc2). Pure logic, then the openai
policy against the stand-in server on loopback (what the server was sent)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import small_config
from llm_helpers import MODEL, fake_llm_factory, llm_config

from consumer import Batcher
from producers.envs import build_env
from producers.llm.sampling import for_turn
from producers.policies import StepContext, make_policy
from schemas.errors import ContextFull
from schemas.sampling import SamplingConfig

fake_llm = pytest.fixture(fake_llm_factory)


def config(**given: Any) -> SamplingConfig:
    base = {"temperature": 0.9, "top_p": 0.8, "top_k": -1, "max_new_tokens": 100}
    return SamplingConfig.model_validate({
        "train": {**base, **given.get("train", {})},
        "val": {**base, "temperature": 0.2, **given.get("val", {})},
        "sequence_length": given.get("sequence_length")})


def test_each_mode_samples_with_its_own_settings() -> None:
    sampling = config(train={"top_k": 50, "stop": ["</answer>"], "repetition_penalty": 1.1,
                             "include_stop_str_in_output": True})
    assert for_turn(sampling, "train", None).fields() == {
        "temperature": 0.9, "top_p": 0.8, "max_tokens": 100, "top_k": 50,
        "stop": ["</answer>"], "include_stop_str_in_output": True, "repetition_penalty": 1.1}
    # the server's defaults are left out: top_k off, no stop strings, repetition_penalty 1
    assert for_turn(sampling, "val", None).fields() == {
        "temperature": 0.2, "top_p": 0.8, "max_tokens": 100}


@pytest.mark.parametrize(("per_step", "max_new", "length", "cap"), [
    (None, 100, None, 100), (64, 100, None, 64), (128, 100, None, 100),
    (128, 100, 80, 80),  # before the prompt is known: sequence_length caps it too (ROLL's
    # min(max_new_tokens, sequence_length))
])
def test_the_cap_is_the_smallest_of_rolls_three(per_step, max_new, length, cap) -> None:
    """A tag's max_tokens_per_step no longer replaces the mode's max_new_tokens: ROLL takes
    the smaller (a tag asking for more than the policy allows gets the policy's)."""
    sampling = config(train={"max_new_tokens": max_new}, sequence_length=length)
    turn = for_turn(sampling, "train", per_step)
    assert turn.fields()["max_tokens"] == cap
    assert turn.max_response_length == (max_new if per_step is None else per_step)


def answer(prompt: int, completion: int) -> dict[str, Any]:
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def test_after_the_answer_the_prompt_decides_the_rest_of_the_cap() -> None:
    turn = for_turn(config(sequence_length=1000), "train", 64)
    assert turn.refit(answer(900, 64)) is None  # 900 + 64 fits
    assert turn.refit(answer(950, 64)) == 50  # ask again for the 50 ROLL would have allowed
    assert turn.refit(answer(950, 50)) is None
    with pytest.raises(ContextFull, match="sequence_length 1000 reached: the prompt has 1000 "
                                          "tokens"):
        turn.refit(answer(1000, 1))
    # the prompt's length from its ids when the answer has no usage (vLLM's top level,
    # SGLang's per choice); no length at all: the first cap stands
    assert turn.refit({"prompt_token_ids": [1] * 990, "choices": [{"token_ids": [2] * 20}]}) \
        == 10
    assert turn.refit({"choices": [{"prompt_token_ids": [1] * 990,
                                    "response_token_ids": [2] * 5}]}) is None
    assert turn.refit({"choices": [{"message": {"content": "x"}}]}) is None
    assert for_turn(config(), "train", 64).refit(answer(10**6, 64)) is None  # no length set


# -- what the server is sent --------------------------------------------------------------------
LAKE = {"env_type": "frozen_lake", "max_tokens_per_step": 96,
        "env_config": {"is_slippery": False, "max_steps": 10}}


def policy_config(base_url: str, **sampling: Any):
    return small_config(
        custom_envs={"Lake": LAKE}, train_env_manager={"tags": ["Lake"]},
        val_env_manager={"tags": ["Lake"]},
        policy={"type": "openai", "base_urls": [base_url], "model": MODEL, "timeout_s": 5.0,
                "max_retries": 1, "sampling": sampling})


def one_turn(run_config, mode: str = "train") -> tuple[Any, StepContext]:
    """One turn of a fresh lake episode: (the `Turn`, or what the policy raised; its ctx)."""
    env = build_env(run_config, "Lake")
    obs, info = env.reset(seed=3)
    ctx = StepContext(env=env, seed=3, version=0, mode=mode, group_id=0, episode_id=0,
                      member=0, tag="Lake", info=info)

    async def act() -> Any:
        policy = make_policy(run_config.policy)
        await policy.start()
        try:
            return (await policy.act(obs, ctx))[1]
        except ContextFull as exc:
            return exc
        finally:
            await policy.close()

    return asyncio.run(act()), ctx


def test_train_and_val_turns_send_their_modes_sampling(fake_llm) -> None:
    server = fake_llm()
    run_config = policy_config(
        server.base_url,
        train={"temperature": 0.7, "top_p": 0.9, "top_k": 40, "max_new_tokens": 64,
               "stop": ["</answer>"], "repetition_penalty": 1.05},
        val={"temperature": 0.3, "top_p": 0.95, "max_new_tokens": 200})
    one_turn(run_config, "train")
    one_turn(run_config, "val")
    train, val = list(server.requests)
    # train: min(max_tokens_per_step 96, max_new_tokens 64); val: min(96, 200)
    assert {k: train[k] for k in ("temperature", "top_p", "top_k", "max_tokens", "stop",
                                  "repetition_penalty")} == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "max_tokens": 64, "stop": ["</answer>"],
        "repetition_penalty": 1.05}
    assert {k: val.get(k) for k in ("temperature", "top_p", "top_k", "max_tokens", "stop")} \
        == {"temperature": 0.3, "top_p": 0.95, "top_k": None, "max_tokens": 96, "stop": None}


def test_a_reply_past_sequence_length_is_asked_again_within_it(fake_llm) -> None:
    """The stand-in's reply to this prompt is C tokens after a prompt of P: with
    sequence_length P + C - 3, ROLL would have let the reply have C - 3 tokens; the turn is
    asked again with that cap (same request, same seed), and ends `length`. Its latency is
    both requests' (each waits the stand-in's 0.05 s), not the second's alone."""
    server = fake_llm(latency_s=0.05)
    roomy, _ = one_turn(policy_config(server.base_url))
    prompt, reply = len(roomy.prompt_ids), len(roomy.response_ids)
    assert reply > 3
    tight, ctx = one_turn(policy_config(server.base_url, sequence_length=prompt + reply - 3))
    first, again = list(server.requests)[1:]
    assert first["max_tokens"] == 96 and again["max_tokens"] == reply - 3
    assert first["seed"] == again["seed"] and first["messages"] == again["messages"]
    assert len(tight.response_ids) == reply - 3 and tight.finish_reason == "length"
    assert tight.latency_s >= 2 * 0.05
    assert list(tight.prompt_ids) == list(roomy.prompt_ids)
    assert len(ctx.scratch["chat"]) == 3  # system, user, the reply: one turn


def test_a_prompt_at_sequence_length_ends_the_episode_with_no_half_turn(fake_llm) -> None:
    server = fake_llm()
    roomy, _ = one_turn(policy_config(server.base_url))
    length = len(roomy.prompt_ids)
    full, ctx = one_turn(policy_config(server.base_url, sequence_length=length))
    assert isinstance(full, ContextFull)
    assert str(full) == f"sequence_length {length} reached: the prompt has {length} tokens"
    assert ctx.scratch["chat"] == [ctx.scratch["chat"][0]]  # the system message alone
    assert len(server.requests) == 2  # not asked again


def test_a_run_ends_episodes_where_sequence_length_is_reached(
        fake_llm, producer_thread, r, run) -> None:
    """FrozenLake through producers, Redis and the Batcher with sequence_length 480: the
    stand-in's first prompt has 330 tokens and the second ~470, so an episode gets a second
    turn capped at what is left (asked again with that cap), and ends truncated before its
    third, with the turns it played; its group trains."""
    server = fake_llm(latency_s=0.001)
    length = 480
    config = llm_config([server.base_url], policy={"sampling": {"sequence_length": length}})
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    assert batch.metrics["scheduler/failed_groups"] == 0 and len(batch) == 16
    for traj in batch.trajectories:
        for step in traj["steps"]:
            assert len(step["prompt_ids"]) + len(step["response_ids"]) <= length
    ended = [t for t in batch.trajectories if "context_full" in t]
    assert ended and batch.metrics["rollout/context_full"] == len(ended)
    for traj in ended:
        assert traj["context_full"].startswith(f"sequence_length {length} reached: the "
                                               "prompt has ")
        assert traj["truncated"] and not traj["terminated"] and traj["num_actions"] >= 1
    # the second turns: capped at what sequence_length left of the 64 asked first
    assert any(b["max_tokens"] < 64 for b in server.requests)
