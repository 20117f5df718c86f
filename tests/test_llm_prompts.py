"""ROLL's agentic prompt pieces: per-tag templates placed as ROLL places them, the envs'
action_pattern, one turn's request body and the reply read back (pure logic, no server)."""

from __future__ import annotations

import pytest
from helpers import small_config

from producers.envs import build_env, make_env
from producers.llm.chat import messages_for_turn, request_body, turn_from_answer, turn_seed
from producers.policies import StepContext
from schemas.envspec import (
    DEFAULT_AGENT_SYSTEM_TEMPLATE,
    DEFAULT_AGENT_TEMPLATE,
    DEFAULT_CUSTOM_ENVS,
    FROZENLAKE_ID,
    AgentPrompt,
)
from schemas.errors import ConfigError

THINK = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>"


def lake(**env_config):
    return make_env(FROZENLAKE_ID, {**DEFAULT_CUSTOM_ENVS["FrozenLake"]["env_config"],
                                    **env_config})


@pytest.mark.parametrize(("reply", "valid"), [
    ("<think>down is safe</think> <answer>Down</answer>", True),
    ("<think>x</think>\n<answer> right </answer>", True),
    ("<answer>Down</answer>", False),  # the pattern requires the thinking
    ("<think>x</think>", False),
])
def test_action_pattern_last_group_is_the_action(reply: str, valid: bool) -> None:
    env = lake(action_pattern=THINK)
    env.reset(seed=1)
    _, reward, _, _, info = env.unwrapped.step_text(reply)
    assert info["action_is_valid"] is valid
    if not valid:
        assert reward == -0.01


def test_format_penalty_from_env_config() -> None:
    env = lake(format_penalty=-0.5)
    env.reset(seed=1)
    assert env.unwrapped.step_text("no answer")[1] == -0.5


@pytest.mark.parametrize(("pattern", "message"), [
    ("<answer>.*</answer>", "has no group"),
    ("<answer>(.*</answer>", "is not a regular expression"),
])
def test_a_bad_action_pattern_fails_config_with_the_tag(pattern: str, message: str) -> None:
    config = small_config(custom_envs={"Lake": {"env_type": "frozen_lake",
                                                "env_config": {"action_pattern": pattern}}},
                          train_env_manager={"tags": ["Lake"]})
    with pytest.raises(ConfigError, match=f"custom_envs.Lake: .*action_pattern.*{message}"):
        build_env(config, "Lake")


def test_unknown_template_placeholders_fail_config() -> None:
    with pytest.raises(ConfigError) as info:
        small_config(custom_envs={"Lake": {"env_type": "frozen_lake",
                                           "agent_template": "turn {turn} {observation}"}},
                     train_env_manager={"tags": ["Lake"]})
    assert "custom_envs.Lake: agent_template has unknown placeholders ['turn']" \
        in str(info.value)


def test_build_env_hands_the_tag_prompt_to_the_policy() -> None:
    config = small_config(custom_envs={"Lake": {
        "env_type": "frozen_lake", "agent_system_template": "S", "agent_template": "T",
        "max_tokens_per_step": 7}}, train_env_manager={"tags": ["Lake"]})
    assert build_env(config, "Lake").unwrapped.agent_prompt == AgentPrompt("S", "T", 7)
    default = build_env(config, "FrozenLake").unwrapped.agent_prompt
    assert default.system_template == DEFAULT_AGENT_SYSTEM_TEMPLATE
    assert default.max_tokens_per_step is None  # the policy's max_tokens
    assert build_env(config, "Lake").unwrapped.agent_prompt.system_template == "S"


def test_default_templates_are_rolls_traj_envs_yaml() -> None:
    """Word for word, trailing spaces included (examples/config/traj_envs.yaml)."""
    assert DEFAULT_AGENT_SYSTEM_TEMPLATE == (
        "You're a helpful assistant. You are a good game player. You are aiming to get high "
        "reward in the game.")
    assert DEFAULT_AGENT_TEMPLATE.format(turn_idx=1, observation="OBS", actions_left=10,
                                         max_response_length=128) == (
        "Turn 1:\nObservation:\nOBS\nStrictly follow this format:\n"
        "1. output format is '<answer> [your answer] </answer>' with no extra text. \n"
        "2. You have 10 actions left. \n3. Max response length: 128 words (tokens).\n"
        "Decide the next action:\n")


def context(env, turn: int = 0, member: int = 0, scratch: dict | None = None) -> StepContext:
    return StepContext(env=env, seed=11, version=0, mode="train", group_id=0, episode_id=0,
                       member=member, tag="Lake", turn=turn, scratch=scratch or {})


def test_the_conversation_grows_turn_by_turn_placed_as_roll_places_it() -> None:
    """ROLL's TrajEnvManager: the system message is the system template alone; the env's
    instruction and a newline open the first user message; later ones are the template."""
    env = lake(max_steps=5)
    obs, _ = env.reset(seed=2)
    prompt = AgentPrompt("SYS", "t={turn_idx} left={actions_left} max={max_response_length}\n"
                         "{observation}")
    ctx = context(env)
    first = messages_for_turn(ctx, obs, prompt, 32)
    instruction = env.unwrapped.instruction
    assert instruction.startswith("You are solving the FrozenLake puzzle.")
    assert first == [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": f"{instruction}\nt=1 left=5 max=32\n{obs}"},
    ]
    first.append({"role": "assistant", "content": "reply 1"})
    ctx.turn = 1
    second = messages_for_turn(ctx, "next", prompt, 32)
    assert second is first and len(second) == 4
    assert second[3] == {"role": "user", "content": "t=2 left=4 max=32\nnext"}


def test_a_first_turn_sent_again_still_opens_with_the_instruction() -> None:
    """The policy takes a failed turn's user message back and asks again: the first user
    message must carry the instruction the second time too, and the system message stays
    alone."""
    env = lake()
    obs, _ = env.reset(seed=3)
    prompt = AgentPrompt("SYS", "{observation}")
    ctx = context(env)
    first = messages_for_turn(ctx, obs, prompt, 32)
    expected = list(first)
    del first[-1]
    assert messages_for_turn(ctx, obs, prompt, 32) == expected


def test_an_env_without_an_instruction_gets_the_template_only() -> None:
    env = make_env("CartPole-v1")
    obs, _ = env.reset(seed=0)
    messages = messages_for_turn(context(env), "OBS", AgentPrompt("SYS", "{observation} "
                                 "{actions_left}"), 8)
    assert messages == [{"role": "system", "content": "SYS"},
                        {"role": "user", "content": "OBS 500"}]


def test_request_body() -> None:
    messages = [{"role": "user", "content": "hé"}]
    sampling = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 16}
    body = request_body("m", messages, sampling=sampling, seed=5, extra_body={"min_p": 0.1})
    assert body == {"model": "m", "messages": messages, "temperature": 0.7, "top_p": 0.9,
                    "max_tokens": 16, "seed": 5, "logprobs": True, "return_token_ids": True,
                    "min_p": 0.1}


def test_members_of_a_group_send_different_seeds() -> None:
    env = lake()
    seeds = {turn_seed(context(env, turn=t, member=m)) for t in range(3) for m in range(4)}
    assert len(seeds) == 12 and all(0 <= s < 2**31 for s in seeds)


def answer(**top) -> dict:
    choice = {"message": {"content": "<answer>Up</answer>"}, "finish_reason": "stop",
              "token_ids": [5, 6],
              "logprobs": {"content": [{"token": "a", "logprob": -0.5},
                                       {"token": "b", "logprob": -0.25}]}}
    return {"choices": [choice], "prompt_token_ids": [1, 2, 3], **top}


def test_turn_from_a_vllm_answer() -> None:
    turn = turn_from_answer(answer())
    assert turn.text == "<answer>Up</answer>" and turn.finish_reason == "stop"
    assert list(turn.prompt_ids) == [1, 2, 3] and list(turn.response_ids) == [5, 6]
    assert list(turn.logprobs) == [-0.5, -0.25]
    assert turn.version is None and turn.version_source is None


def test_turn_from_sglang_and_llama_server_answers() -> None:
    """SGLang 0.5 puts both ids per choice; llama-server only in the logprobs entries."""
    sglang = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop",
                           "prompt_token_ids": [1, 2], "response_token_ids": [7, 8],
                           "logprobs": {"content": [{"token": "x", "logprob": -1.0},
                                                    {"token": "y", "logprob": -2.0}]}}],
              "metadata": {"weight_version": "2", "weight_versions": [
                  {"version": "1", "start": 0, "end": 1}, {"version": "2", "start": 1,
                                                            "end": 2}]}}
    turn = turn_from_answer(sglang)
    assert list(turn.prompt_ids) == [1, 2] and list(turn.response_ids) == [7, 8]
    assert (turn.version, turn.version_source) == (1, "server")  # its oldest tokens
    assert turn.extra["version_spans"] == [[1, 0, 1], [2, 1, 2]]
    llama = {"choices": [{"message": {"content": "x"}, "finish_reason": "length",
                          "logprobs": {"content": [{"id": 9, "token": "x", "logprob": -1.0,
                                                    "top_logprobs": []}]}}]}
    turn = turn_from_answer(llama)
    assert turn.prompt_ids is None and list(turn.response_ids) == [9]
    assert "version_spans" not in turn.extra and turn.version is None


def test_logprob_entries_that_merged_tokens_give_no_ids_or_logprobs() -> None:
    """llama-server gives one entry per piece of text: two tokens of one UTF-8 character
    share an entry, so 3 entries stand for 4 tokens; their ids and logprobs would be wrong."""
    from producers.llm.chat import merged_entries

    entries = [{"id": i, "token": "x", "logprob": -1.0} for i in (5, 6, 7)]
    data = {"choices": [{"message": {"content": "xxx"}, "finish_reason": "length",
                         "logprobs": {"content": entries}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    assert merged_entries(data) == (3, 4)
    turn = turn_from_answer(data)
    assert turn.response_ids is None and turn.logprobs is None and turn.text == "xxx"
    data["usage"]["completion_tokens"] = 3
    assert merged_entries(data) is None
    assert list(turn_from_answer(data).response_ids) == [5, 6, 7]


def test_turn_without_token_ids_or_logprobs() -> None:
    data = {"choices": [{"message": {"content": None}, "finish_reason": "length"}]}
    turn = turn_from_answer(data)
    assert turn.text == "" and turn.prompt_ids is None and turn.response_ids is None
    assert turn.logprobs is None and turn.finish_reason == "length"


@pytest.mark.parametrize(("top", "version"), [
    ({"metadata": {"weight_version": "4"}}, 4),  # SGLang's chat completions
    ({"meta_info": {"weight_version": 2}}, 2),  # SGLang's native shape
    ({"metadata": {"weight_version": "default"}}, None),  # never set: no version
    # vLLM 0.33's spans (return_weight_versions): one label
    ({"choices": [{**answer()["choices"][0],
                   "weight_versions": [{"version": "3", "start": 0, "end": 2}]}]}, 3),
    # SGLang's spans: a turn kept across an update counts from its oldest tokens
    ({"metadata": {"weight_version": "5", "weight_versions": [
        {"version": "4", "start": 0, "end": 1}, {"version": "5", "start": 1, "end": 2}]}}, 4),
    # a turn kept through the first update: its first tokens came from the launch weights
    # ("default"), which are the run's version 0 (partial rollouts keep such turns)
    ({"metadata": {"weight_version": "5", "weight_versions": [
        {"version": "default", "start": 0, "end": 1},
        {"version": "5", "start": 1, "end": 2}]}}, 0),
])
def test_the_weight_version_a_server_reports(top: dict, version: int | None) -> None:
    turn = turn_from_answer(answer(**top))
    assert turn.version == version
    assert turn.version_source == ("server" if version is not None else None)


def test_api_key_env_must_name_a_variable() -> None:
    with pytest.raises(ConfigError) as info:
        small_config(policy={"type": "openai", "base_urls": "http://h/v1", "model": "m",
                             "api_key_env": "sk-live-123"})
    assert "policy.api_key_env: must be the name of an environment variable" in str(info.value)
    assert "sk-live-123" not in str(info.value)


def test_start_refuses_a_missing_api_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from producers.policies import make_policy
    from schemas.errors import PolicyError

    monkeypatch.delenv("ROLLSTREAM_TEST_NO_SUCH_KEY", raising=False)
    config = small_config(policy={"type": "openai", "base_urls": "http://127.0.0.1:9/v1",
                                  "model": "m", "api_key_env": "ROLLSTREAM_TEST_NO_SUCH_KEY"})
    policy = make_policy(config.policy)
    with pytest.raises(PolicyError, match="policy.api_key_env: the environment variable "
                       "ROLLSTREAM_TEST_NO_SUCH_KEY is not set"):
        asyncio.run(policy.start())
