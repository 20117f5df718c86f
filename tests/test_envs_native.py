"""`sokoban_native_env`: ROLL's Sokoban with its own chat (native_env.py), built from ROLL's
example config entry, its defaults and prompts word for word, and the conversation an LLM
policy sends with it."""

from __future__ import annotations

import random

import pytest
from gymnasium.utils.env_checker import check_env
from helpers import small_config

from producers.envs import SOKOBAN_NATIVE_ID, SokobanNativeEnv, build_env, make_env
from producers.llm.chat import messages_for_turn
from producers.policies import StepContext
from rollstream.fake_llm import good_move, read_board

SYSTEM = ("You're a helpful assistant. You are a good game player. You are aiming to get high "
          "reward in the game.")
SUFFIX = ("\n\n<system-reminder>\nIMPORTANT: Ensure that your response is the format of "
          "'<answer> [your answer] </answer>',  with no extra text, eg. <answer>Right</answer>."
          "\nYour available actions are:\nUp, Down, Left, Right\n. </system-reminder>\n\n"
          "Decide the next action:\n")
# the custom_envs entry of ROLL's examples/qwen2.5-0.5B-agentic/agentic_val_sokoban_native.yaml
ROLL_ENTRY = {
    "env_type": "sokoban_native_env",
    "max_steps": 10,
    "max_tokens_per_step": 128,
    "env_manager_cls": "roll.pipeline.agentic.env_manager.agent_native_env_manager."
                       "AgentNativeStepEnvManager",
    "agent_system_template": "agent_system_template placeholder",
    "agent_template": "agent_template placeholder",
    "env_config": {"max_steps": 10, "format_penalty": -0.15},
}


def native_env(**env_config):
    config = small_config(custom_envs={"SokobanNativeEnv": {
        **ROLL_ENTRY, "env_config": {**ROLL_ENTRY["env_config"], **env_config}}},
        train_env_manager={"tags": ["SokobanNativeEnv"]})
    return build_env(config, "SokobanNativeEnv")


def test_built_from_rolls_example_entry() -> None:
    env = native_env()
    native = env.unwrapped
    assert isinstance(native, SokobanNativeEnv) and env.spec.id == SOKOBAN_NATIVE_ID
    assert (native.max_steps, native.format_penalty) == (10, -0.15)
    check_env(make_env(SOKOBAN_NATIVE_ID, {"disable_env_checker": False}).unwrapped)


def test_defaults_are_rolls_native_env() -> None:
    env = SokobanNativeEnv(group_id=3, num_env_groups=8, mode="val", debug=True)
    assert (env.dim_room, env.num_boxes, env.max_steps, env.search_depth,
            env.format_penalty) == ((6, 6), 1, 10, 300, -0.1)
    assert env.system_template == SYSTEM and env.observation_suffix == SUFFIX


def test_prompts_word_for_word() -> None:
    env = native_env().unwrapped
    grid, _ = env.reset(seed=4)
    assert env.system_prompt() == f"{SYSTEM}\n\n{env.instruction}"
    assert env.instruction.startswith("You are solving the Sokoban puzzle.")
    assert env.user_prompt(grid, 0) == f"Here is the current state:\n{grid}\n\n{SUFFIX}"
    assert env.user_prompt(grid, 3) == f"Current state:\n{grid}\n\n{SUFFIX}"
    custom = native_env(system_template="S", observation_suffix="Go:").unwrapped
    assert custom.system_prompt().startswith("S\n\nYou are solving")
    assert custom.user_prompt("##", 1) == "Current state:\n##\n\nGo:"
    with pytest.raises(ValueError, match="system_template must be a text"):
        SokobanNativeEnv(system_template=3)


def test_the_policy_sends_the_envs_own_chat_not_the_templates() -> None:
    env = native_env()
    grid, _ = env.reset(seed=4)
    ctx = StepContext(env=env, seed=4, version=0, mode="train", group_id=0, episode_id=0,
                      member=0, tag="SokobanNativeEnv")
    prompt = env.unwrapped.agent_prompt
    messages = messages_for_turn(ctx, grid, prompt, 128)
    assert messages == [
        {"role": "system", "content": env.unwrapped.system_prompt()},
        {"role": "user", "content": env.unwrapped.user_prompt(grid, 0)},
    ]
    assert "placeholder" not in str(messages)
    messages.append({"role": "assistant", "content": "<answer>Up</answer>"})
    after, *_ = env.unwrapped.step_text("<answer>Up</answer>")
    ctx.turn = 1
    assert messages_for_turn(ctx, after, prompt, 128)[-1] == {
        "role": "user", "content": f"Current state:\n{after}\n\n{SUFFIX}"}
    # a first turn sent again (the request failed and its message was taken back) gets the
    # same messages, not a second system message
    retry = StepContext(env=env, seed=4, version=0, mode="train", group_id=0, episode_id=0,
                        member=0, tag="SokobanNativeEnv")
    first = messages_for_turn(retry, grid, prompt, 128)
    del first[-1]
    assert messages_for_turn(retry, grid, prompt, 128) == messages[:2]


def test_rewards_and_end_are_sokobans() -> None:
    env = native_env(max_steps=2)
    env.reset(seed=1)
    _, reward, terminated, _, info = env.unwrapped.step_text("no answer")
    assert reward == pytest.approx(-0.25) and not terminated and not info["action_is_valid"]
    _, _, terminated, truncated, _ = env.unwrapped.step_text("<answer>Up</answer>")
    assert terminated and truncated


def test_the_stand_in_model_reads_the_native_chat() -> None:
    env = native_env()
    grid, _ = env.reset(seed=2)
    messages = [{"role": "system", "content": env.unwrapped.system_prompt()},
                {"role": "user", "content": env.unwrapped.user_prompt(grid, 0)}]
    board = read_board(messages)
    assert board.game == "sokoban" and board.actions == ["Up", "Down", "Left", "Right"]
    assert board.symbols["player"] == "P" and board.symbols["box_on_target"] == "√"
    assert "\n".join(board.grid) == grid
    move = good_move(board, random.Random(0))
    assert move is not None
    assert env.unwrapped.step_text(f"<answer>{move}</answer>")[4]["action_is_effective"]
