"""ROLL's example configs run unchanged: producers, Redis and the Batcher, with the stand-in
model server, get ROLL's prompts and ROLL's sampling.

Each test takes one of ROLL's agentic example YAMLs (tests/data/roll/examples, alibaba/ROLL
8eb27cc2) under a file of a user's own that only makes the batch tiny and points an openai
policy at the stand-in server, plays a batch, and reads what the server was sent. The
expected prompts are written from ROLL's env managers' `format_messages`
(roll/pipeline/agentic/env_manager/), filled in with the trajectories' own observations,
rewards and replies.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import redis
from llm_helpers import MODEL, fake_llm_factory

from consumer import Batcher
from producers.llm.chat import turn_seed
from producers.policies import StepContext
from schemas.config import RolloutConfig

EXAMPLES = Path(__file__).parent / "data" / "roll" / "examples"
SYSTEM = ("You're a helpful assistant. You are a good game player. You are aiming to get high "
          "reward in the game.")
TIP = ("(IMPORTANT TIPS: this action is not valid, your new response *must* strictly adhere "
       "to the format according to env instructions.)")

fake_llm = pytest.fixture(fake_llm_factory)


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("roll") / "examples"
    shutil.copytree(EXAMPLES, root)
    return root


def tiny(examples: Path, name: str, base_url: str, managers: str) -> RolloutConfig:
    """ROLL's example `name` under a user's file: a tiny batch, the stand-in server."""
    example = examples / name
    mine = example.with_name(f"tiny_{example.name}")
    mine.write_text(
        f"defaults:\n  - {example.stem}@_here_\n  - _self_\n{managers}"
        f"policy:\n  type: openai\n  base_urls: [{base_url}]\n  model: {MODEL}\n"
        "  timeout_s: 10\n  max_retries: 1\n", encoding="utf-8")
    return RolloutConfig.from_yaml(mine)


def request_of(server: Any, traj: dict[str, Any], turn: int) -> dict[str, Any]:
    """The body the server got for turn `turn` of `traj` (its request seed is the episode's
    seed, member and turn)."""
    ctx = StepContext(env=None, seed=traj["seed"], version=0, mode=traj["mode"], group_id=0,
                      episode_id=0, member=traj["member"], tag="", turn=turn)
    (body,) = [b for b in server.requests if b["seed"] == turn_seed(ctx)]
    return body


def sampled(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body.get(k) for k in ("temperature", "top_p", "top_k", "max_tokens", "stop",
                                     "repetition_penalty")}


# -- StepEnvManager: ROLL's GiGPO FrozenLake ------------------------------------------------
GIGPO = "qwen2.5-0.5B-agentic/agent_val_frozen_lake_gigpo.yaml"
SMALL_MANAGERS = (
    "rollout_batch_size: 4\nval_batch_size: 4\n"
    "train_env_manager:\n  max_env_num_per_worker: 4\n  num_env_groups: 2\n  group_size: 2\n"
    "  num_groups_partition: [2]\n"
    "val_env_manager:\n  max_env_num_per_worker: 4\n  num_env_groups: 4\n"
    "  num_groups_partition: [1, 1, 1, 1]\n")


def gigpo_action(step: dict[str, Any]) -> str:
    """ROLL's shown action: the env's action_content (the <answer> text; "" when the reply
    has none), and the tip after an invalid action."""
    found = re.search(r"<answer>(.*?)</answer>", step["response"], re.DOTALL)
    action = found.group(1).strip() if found else ""
    return action if step["info"]["action_is_valid"] else action + TIP


def gigpo_user(instruction: str, steps: list[dict[str, Any]], turn: int) -> str:
    """StepEnvManager.format_messages with step_envs.yaml's template, history_length 5 and the
    file's max_tokens_per_step 64 (every shown step listed: rollstream's decision)."""
    window = steps[max(0, turn + 1 - 5):turn]
    history = ", ".join(
        f"(step: {turn - len(window) + j + 1}, observation: {s['observation']}, "
        f"action: {gigpo_action(s)}, reward: {s['reward']})" for j, s in enumerate(window))
    return (f"## Env Instruction: {instruction}\n\n"
            "## State Description: \n"
            f"Prior to this step, you have completed {turn} steps. \n"
            f"Recent History: Below are the most recent {len(window)} observations, and your "
            f"responses:\n[{history}]\n\n"
            "Current State:\n"
            f"You are currently at step {turn + 1}. Your current observation is: "
            f"[{steps[turn]['observation']}]\n\n"
            "## Output Format Requirement: \n"
            "1. output format is '<answer> [your answer] </answer>' with no extra text. \n"
            "2. Max response length: 64 words (tokens).\n"
            "Decide the next action:")


def test_rolls_gigpo_example_sends_step_env_manager_prompts_and_its_sampling(
        fake_llm, examples, producer_thread, r: redis.Redis, run: str) -> None:
    from producers.envs import build_env

    server = fake_llm(p_good=0.6, malformed_share=0.5)
    config = tiny(examples, GIGPO, server.base_url, SMALL_MANAGERS)
    instruction = build_env(config, "FrozenLake").unwrapped.instruction
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    assert len(batch) == 4 and {t["tag"] for t in batch.trajectories} == {"FrozenLake"}
    turns = [(t, i) for t in batch.trajectories for i in range(t["num_actions"])]
    assert any(i >= 2 for _, i in turns), "an episode of three turns shows a history"
    for traj, i in turns:
        body = request_of(server, traj, i)
        user = body["messages"][1]["content"]
        assert body["messages"] == [{"role": "system", "content": SYSTEM + "\n"},
                                    {"role": "user", "content": user}]
        assert user.rstrip("\n") == gigpo_user(instruction, traj["steps"], i)
        # actor_infer.generating_args samples both modes; max_tokens = min(the tags' 64,
        # max_new_tokens 128, sequence_length 1024)
        assert sampled(body) == {"temperature": 0.99, "top_p": 0.99, "top_k": 100,
                                 "max_tokens": 64, "stop": None, "repetition_penalty": None}
        assert len(traj["steps"][i]["prompt_ids"]) + len(traj["steps"][i]["response_ids"]) \
            <= 1024


# -- TrajEnvManager: the val manager's own sampling ------------------------------------------
def test_rolls_frozen_lake_example_samples_val_with_the_val_managers_args(
        fake_llm, examples, producer_thread, r: redis.Redis, run: str) -> None:
    """agent_val_frozen_lake.yaml has no actor_infer block: train turns sample at the train
    manager's 0.99, val turns at the val manager's 0.2 (not greedily)."""
    server = fake_llm(p_good=0.8)
    config = tiny(examples, "qwen2.5-0.5B-agentic/agent_val_frozen_lake.yaml",
                  server.base_url, SMALL_MANAGERS)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    train = batcher.get_batch(timeout_s=60)
    batcher.ack(train)
    val = batcher.get_batch(mode="val", timeout_s=120)
    assert {t["tag"] for t in val.trajectories} == {"SimpleSokoban", "LargerSokoban",
                                                    "SokobanDifferentGridVocab", "FrozenLake"}
    expected = {"train": 0.99, "val": 0.2}
    for batch in (train, val):
        for traj in batch.trajectories:
            for i in range(traj["num_actions"]):
                body = request_of(server, traj, i)
                assert sampled(body) == {"temperature": expected[traj["mode"]], "top_p": 0.99,
                                         "top_k": 100, "max_tokens": 64, "stop": None,
                                         "repetition_penalty": None}
                assert body["messages"][0] == {"role": "system", "content": SYSTEM}


# -- StepConcatEnvManager: ROLL's GEM GuessTheNumber --------------------------------------------
@pytest.mark.skipif(not __import__("importlib").util.find_spec("gem"),
                    reason="the gem extra (gem-llm) is not installed")
def test_rolls_gem_game_example_sends_step_concat_prompts_with_no_system_message(
        fake_llm, examples, producer_thread, r: redis.Redis, run: str) -> None:
    server = fake_llm()
    config = tiny(examples, "qwen3_agentic_gem/gem_game_guess_the_number.yaml",
                  server.base_url,
                  "rollout_batch_size: 4\nval_batch_size: 4\n"
                  "train_env_manager:\n  max_env_num_per_worker: 4\n  num_env_groups: 4\n"
                  "  num_groups_partition: [4]\n"
                  "val_env_manager:\n  max_env_num_per_worker: 4\n  num_env_groups: 4\n"
                  "  num_groups_partition: [4]\n")
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    head = "You are playing language games. Make valid actions to win.\nObservation:\n"
    tail = "Please reason step by step, and put your final answer within \\\\boxed{}.\n"
    for traj in batch.trajectories:
        body = request_of(server, traj, 0)
        # agent_system_template: ~ -> no system message; history "" then the observation,
        # a newline and GEM's suffix of the reset
        assert body["messages"] == [{"role": "user", "content":
                                     f"{head}\n{traj['steps'][0]['observation']}\n"
                                     f"Enter your next guess.\n{tail}"}]
        # actor_infer.generating_args: temperature 1, top_p 1, top_k -1 (off), max_new_tokens
        # 512 = max_tokens_per_step; sequence_length 12800
        assert sampled(body) == {"temperature": 1.0, "top_p": 1.0, "top_k": None,
                                 "max_tokens": 512, "stop": None, "repetition_penalty": None}


# -- AgentNativeStepEnvManager: ROLL's native Sokoban ------------------------------------------
def test_rolls_native_sokoban_example_sends_the_envs_own_chat(
        fake_llm, examples, producer_thread, r: redis.Redis, run: str) -> None:
    """agentic_val_sokoban_native.yaml: the env's messages (ROLL's SokobanNativeEnv: system =
    its template, a blank line and the instruction; users "Here is the current state:" /
    "Current state:", the grid, a blank line, the reminder); the tag's placeholder templates
    go unused; one conversation per episode."""
    from producers.envs import build_env
    from producers.envs.sokoban_native import SUFFIX_FORMAT

    server = fake_llm(p_good=0.5)
    config = tiny(examples, "qwen2.5-0.5B-agentic/agentic_val_sokoban_native.yaml",
                  server.base_url,
                  "rollout_batch_size: 4\nval_batch_size: 4\n"
                  "train_env_manager:\n  max_env_num_per_worker: 4\n  num_env_groups: 2\n"
                  "  group_size: 2\n  num_groups_partition: [2]\n"
                  "val_env_manager:\n  max_env_num_per_worker: 4\n  num_env_groups: 4\n"
                  "  num_groups_partition: [4]\n")
    env = build_env(config, "SokobanNativeEnv").unwrapped
    reminder = SUFFIX_FORMAT.format(actions="Up, Down, Left, Right")
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    multi = [t for t in batch.trajectories if t["num_actions"] >= 2]
    assert multi, "an episode of two turns"
    for traj in batch.trajectories:
        last = traj["num_actions"] - 1
        body = request_of(server, traj, last)
        expected = [{"role": "system", "content": f"{SYSTEM}\n\n{env.instruction}"}]
        for i, step in enumerate(traj["steps"]):
            lead = "Here is the current state:" if i == 0 else "Current state:"
            expected.append({"role": "user",
                             "content": f"{lead}\n{step['observation']}\n\n{reminder}"})
            if i < last:
                expected.append({"role": "assistant", "content": step["response"]})
        assert body["messages"] == expected
        assert "placeholder" not in str(body["messages"])
        assert sampled(body) == {"temperature": 0.99, "top_p": 0.99, "top_k": 100,
                                 "max_tokens": 128, "stop": None, "repetition_penalty": None}
