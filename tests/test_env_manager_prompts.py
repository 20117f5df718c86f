"""Each env manager's prompts, as ROLL's code renders them, over small real episodes.

A scripted policy plays an episode through the producer's `play_episode` (so the prompts see
what a real run's do: the reset's info, each step's info and the steps so far) and records
the messages `messages_for_turn` gives each turn. The expected texts are written from
ROLL's `format_messages` (alibaba/ROLL 8eb27cc2, roll/pipeline/agentic/env_manager/
traj_env_manager.py, step_env_manager.py, step_concat_env_manager.py), filled in by hand
with the episode's observations, rewards and replies.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from helpers import small_config

from producers.control import ControlState
from producers.envs import build_env
from producers.llm.chat import messages_for_turn
from producers.llm.prompts import INVALID_TIP
from producers.rollout import EnvSlot, play_episode
from schemas.config import RolloutConfig
from schemas.seeding import episode_seed

EXAMPLES = Path(__file__).parent / "data" / "roll" / "examples"
MANAGERS = "roll.pipeline.agentic.env_manager."
STEP = MANAGERS + "step_env_manager.StepEnvManager"
STEP_CONCAT = MANAGERS + "step_concat_env_manager.StepConcatEnvManager"
needs_gem = pytest.mark.skipif(importlib.util.find_spec("gem") is None,
                               reason="the gem extra (gem-llm) is not installed")
LAKE = {"size": 4, "is_slippery": False, "max_steps": 10, "format_penalty": -0.01}
# ROLL's replies of the lake episode: a valid move, an unparsable one, a valid move, a last
VALID, INVALID = "<think>go</think><answer> Left </answer>", "I am not sure."
LAKE_REPLIES = [VALID, INVALID, "<answer>Right</answer>", "<answer>Up</answer>"]


class Scripted:
    """Replies from a script (repeated); records each turn's messages as the openai policy
    sends them (and, as it does, adds the reply to a conversation)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.sent: list[list[dict[str, str]]] = []

    async def act(self, observation: Any, ctx: Any) -> tuple[Any, str]:
        prompt = ctx.env.unwrapped.agent_prompt
        messages = messages_for_turn(ctx, observation, prompt, prompt.max_tokens_per_step)
        self.sent.append(copy.deepcopy(messages))
        reply = self.replies[ctx.turn % len(self.replies)]  # the script again, to the end
        messages.append({"role": "assistant", "content": reply})
        return -1, reply


def play(config: RolloutConfig, tag: str, replies: list[str], seed: int = 0
         ) -> tuple[dict[str, Any], list[list[dict[str, str]]]]:
    """One train episode of `tag` (group 0, first episode, run seed `seed`)."""
    async def gate() -> bool:
        return True

    policy = Scripted(replies)
    slot = EnvSlot(mode="train", env_id=0, group_id=0, member=0, shard=0, tag=tag,
                   env=build_env(config, tag))
    traj = asyncio.run(play_episode(slot, seed=seed, producer_id="p", policy=policy,
                                    control=ControlState(), gate=gate))
    return traj, policy.sent


def lake_seed(config: RolloutConfig, tag: str) -> int:
    """A run seed whose first lake episode lasts the whole script (no hole, no goal)."""
    env = build_env(config, tag).unwrapped
    for seed in range(200):
        env.reset(seed=episode_seed(seed, "train", 0, 0))
        if not any(env.step_text(reply)[2] for reply in LAKE_REPLIES[:3]):
            return seed
    raise AssertionError("no lake seed lasts three moves")


def lake_config(**tag: Any) -> RolloutConfig:
    entry = {"env_type": "frozen_lake", "max_tokens_per_step": 96, "env_config": LAKE, **tag}
    return small_config(custom_envs={"Lake": entry}, train_env_manager={"tags": ["Lake"]},
                        val_env_manager=None)


# -- StepEnvManager (GiGPO) -------------------------------------------------------------------
STEP_TEMPLATE = ("I={env_instruction}|N={step_count}|L={history_length}|H=[{history}]|"
                 "S={current_step}|O=[{current_observation}]|M={max_response_length}")


def test_step_env_manager_renders_a_fresh_prompt_with_the_history_window() -> None:
    """history_length 3: ROLL's history[-3:-1], so at most the two steps before this one,
    each `(step: N, observation: O, action: A, reward: R)`, A the text the env's pattern
    captured (ROLL's action_content), the tip after an invalid one."""
    config = lake_config(env_manager_cls=STEP, history_length=3, agent_system_template="SYS",
                         agent_template=STEP_TEMPLATE)
    traj, sent = play(config, "Lake", LAKE_REPLIES, lake_seed(config, "Lake"))
    assert traj["num_actions"] == 4
    instruction = build_env(config, "Lake").unwrapped.instruction
    obs = [step["observation"] for step in traj["steps"]]
    rewards = [step["reward"] for step in traj["steps"]]
    assert rewards[:3] == [0.0, -0.01, 0.0]
    step1 = f"(step: 1, observation: {obs[0]}, action: Left, reward: 0.0)"
    step2 = f"(step: 2, observation: {obs[1]}, action: {INVALID_TIP}, reward: -0.01)"
    step3 = f"(step: 3, observation: {obs[2]}, action: Right, reward: 0.0)"
    expected_users = [
        f"I={instruction}|N=0|L=0|H=[]|S=1|O=[{obs[0]}]|M=96",
        f"I={instruction}|N=1|L=1|H=[{step1}]|S=2|O=[{obs[1]}]|M=96",
        f"I={instruction}|N=2|L=2|H=[{step1}, {step2}]|S=3|O=[{obs[2]}]|M=96",
        f"I={instruction}|N=3|L=2|H=[{step2}, {step3}]|S=4|O=[{obs[3]}]|M=96",
    ]
    assert sent == [[{"role": "system", "content": "SYS"}, {"role": "user", "content": user}]
                    for user in expected_users]


def test_step_env_manager_without_history_length_shows_no_history() -> None:
    config = lake_config(env_manager_cls=STEP, agent_system_template=None,
                         agent_template=STEP_TEMPLATE)
    traj, sent = play(config, "Lake", LAKE_REPLIES, lake_seed(config, "Lake"))
    third = sent[2]
    assert [m["role"] for m in third] == ["user"]  # a null system template: no system message
    assert "|N=2|L=0|H=[]|S=3|" in third[0]["content"]


def test_rolls_gigpo_example_renders_its_template_word_for_word() -> None:
    """agent_val_frozen_lake_gigpo.yaml (step_envs.yaml's template, history_length 5)."""
    config = RolloutConfig.from_yaml(EXAMPLES / "qwen2.5-0.5B-agentic" /
                                     "agent_val_frozen_lake_gigpo.yaml")
    template = config.env_spec("FrozenLake").agent_template
    traj, sent = play(config, "FrozenLake", LAKE_REPLIES[:2], lake_seed(config, "FrozenLake"))
    obs = [step["observation"] for step in traj["steps"]]
    instruction = build_env(config, "FrozenLake").unwrapped.instruction
    ending = "\n" if template.endswith("\n") else ""
    assert sent[1] == [
        {"role": "system", "content": "You're a helpful assistant. You are a good game "
         "player. You are aiming to get high reward in the game.\n"},
        {"role": "user", "content":
            f"## Env Instruction: {instruction}\n\n"
            "## State Description: \n"
            "Prior to this step, you have completed 1 steps. \n"
            "Recent History: Below are the most recent 1 observations, and your responses:\n"
            f"[(step: 1, observation: {obs[0]}, action: Left, reward: 0.0)]\n\n"
            "Current State:\n"
            f"You are currently at step 2. Your current observation is: [{obs[1]}]\n\n"
            "## Output Format Requirement: \n"
            "1. output format is '<answer> [your answer] </answer>' with no extra text. \n"
            "2. Max response length: 64 words (tokens).\n"  # the file sets 64
            f"Decide the next action:{ending}"},
    ]


# -- StepConcatEnvManager (GEM) ---------------------------------------------------------------
@needs_gem
def test_step_concat_env_manager_renders_observations_and_the_suffix() -> None:
    """gem_game_guess_the_number.yaml's template and null system template: history = the
    shown steps' observations joined by newlines, current = observation, newline, suffix."""
    config = RolloutConfig.from_yaml(EXAMPLES / "qwen3_agentic_gem" /
                                     "gem_game_guess_the_number.yaml")
    template = config.env_spec("GuessTheNumber").agent_template
    guesses = [f"Let me guess \\boxed{{{n}}}." for n in (10, 5, 15, 3, 8, 12, 18, 1, 20)]
    traj, sent = play(config, "GuessTheNumber", guesses)
    obs = [step["observation"] for step in traj["steps"]] + [traj["final_observation"]]
    assert len(traj["steps"]) >= 2
    suffix = "Enter your next guess."  # GEM's info suffix, after the reset and each guess
    head = "You are playing language games. Make valid actions to win.\nObservation:\n"
    tail = "Please reason step by step, and put your final answer within \\\\boxed{}.\n"
    assert template == head + "{history}\n{current_observation}\n" + \
        tail.replace("{}", "{{}}")
    assert sent[0] == [{"role": "user", "content": f"{head}\n{obs[0]}\n{suffix}\n{tail}"}]
    assert sent[1] == [{"role": "user",
                        "content": f"{head}{obs[0]}\n{obs[1]}\n{suffix}\n{tail}"}]


# -- TrajEnvManager ----------------------------------------------------------------------------
@needs_gem
def test_traj_env_manager_fills_suffix_from_the_reset_and_each_step() -> None:
    """traj_envs_gem_games.yaml's game template `{observation}\\n{suffix}\\n`."""
    config = small_config(
        custom_envs={"Guess": {
            "env_type": "game:GuessTheNumber-v0", "max_steps": 5, "agent_system_template": "S",
            "agent_template": "{observation}\n{suffix}\n",
            "env_config": {"min_number": 1, "max_number": 20, "max_turns": 5}}},
        train_env_manager={"tags": ["Guess"]}, val_env_manager=None)
    traj, sent = play(config, "Guess", ["\\boxed{10}", "\\boxed{5}", "\\boxed{7}"])
    obs = [step["observation"] for step in traj["steps"]]
    suffix = "Enter your next guess."
    assert sent[1] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": f"{obs[0]}\n{suffix}\n"},  # GEM games: no instruction
        {"role": "assistant", "content": "\\boxed{10}"},
        {"role": "user", "content": f"{obs[1]}\n{suffix}\n"},
    ]


def test_traj_env_manager_with_a_null_system_template_sends_no_system_message() -> None:
    config = lake_config(agent_system_template=None,
                         agent_template="{turn_idx}/{actions_left}: {observation}")
    traj, sent = play(config, "Lake", LAKE_REPLIES, lake_seed(config, "Lake"))
    instruction = build_env(config, "Lake").unwrapped.instruction
    obs = [step["observation"] for step in traj["steps"]]
    assert sent[1] == [{"role": "user", "content": f"{instruction}\n1/10: {obs[0]}"},
                       {"role": "assistant", "content": VALID},
                       {"role": "user", "content": f"2/9: {obs[1]}"}]
