"""`rollstream/Gem-v0`: ROLL's gem env types through the env factory and the config check."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml
from helpers import run_cli_here, small_config

from producers.envs import build_env, env_kwargs, is_text_env, make_env
from producers.envs.roll_tasks import GEM_ID, is_gem_type
from schemas.config import RolloutConfig
from schemas.errors import ConfigError

MATH = Path(__file__).parent / "data" / "gem" / "math.jsonl"
QA = Path(__file__).parent / "data" / "gem" / "qa.jsonl"
needs_rg = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None,
                              reason="the reasoning extra (reasoning-gym) is not installed")


@pytest.mark.parametrize(("env_type", "expected"), [
    ("game:GuessTheNumber-v0", True), ("rg:letter_counting", True), ("math:GSM8K", True),
    ("qa:HotpotQA", True), ("logic:RuleTaker-d0", True), ("eval:AIME24", True),
    ("code:CodeContest", True), ("roll_math", True), ("roll_qa", True), ("roll_code", True),
    ("sokoban", False), ("frozen_lake", False), ("webshop", False), ("gamex:Foo", False),
])
def test_is_gem_type(env_type: str, expected: bool) -> None:
    assert is_gem_type(env_type) is expected


@pytest.mark.parametrize("task", ["webshop", None, 3])
def test_a_task_that_is_no_gem_type_is_refused(task) -> None:
    with pytest.raises(ConfigError, match="is not a ROLL gem env type"):
        make_env(GEM_ID, {"task": task})


def rg_data(max_steps: int | None = None, **env_config) -> dict:
    tag = {"env_id": GEM_ID, "env_config": {"task": "rg:letter_counting", "size": 50,
                                            "seed": 42, **env_config}}
    if max_steps is not None:
        tag["max_steps"] = max_steps
    manager = {"max_env_num_per_worker": 2, "num_env_groups": 2, "group_size": 1,
               "tags": ["Letters"]}
    return {"rollout_batch_size": 2, "custom_envs": {"Letters": tag},
            "train_env_manager": manager, "val_env_manager": manager}


def rg_config(max_steps: int | None = None, **env_config) -> RolloutConfig:
    return RolloutConfig.from_dict(rg_data(max_steps, **env_config))


@needs_rg
def test_a_tag_builds_a_text_env_with_the_tags_step_budget() -> None:
    config = rg_config(max_steps=3)
    assert env_kwargs(config.env_spec("Letters"))["max_steps"] == 3
    env = build_env(config, "Letters")
    assert is_text_env(env) and env.unwrapped.max_steps == 3
    assert env.unwrapped.render_mode == "ansi" and "PassiveEnvChecker" not in str(env)
    assert env.reset(seed=1)[0].startswith("How many times does the letter")


@needs_rg
def test_config_check_passes_and_refuses_as_a_user_would_see(tmp_path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(rg_data()))
    out = run_cli_here("config", "check", str(good))
    assert out.returncode == 0, out.stderr
    bad = tmp_path / "bad.yaml"
    data = rg_data(task="rg:leter_counting")
    bad.write_text(yaml.safe_dump(data))
    out = run_cli_here("config", "check", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "custom_envs.Letters" in out.stderr and "did you mean rg:letter_counting" in out.stderr


@pytest.mark.parametrize(("task", "module", "words"), [
    ("game:Mastermind-v0", "gem", "game: envs need gem-llm (pip install 'rollstream[gem]'"),
    ("rg:leg_counting", "reasoning_gym",
     "rg: tasks need reasoning-gym (pip install 'rollstream[reasoning]')"),
])
def test_a_missing_package_is_named_in_one_line(task, module, words, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError) as excinfo:
        make_env(GEM_ID, {"task": task, "size": 7} if task.startswith("rg:") else {"task": task})
    assert "\n" not in str(excinfo.value) and str(excinfo.value).startswith(words)


def test_math_without_math_verify_is_refused_in_one_line(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "math_verify" else real(name, *args))
    with pytest.raises(ConfigError, match="roll_math grades answers with math-verify, which is "
                                          "not installed \\(pip install 'rollstream\\[reasoning"):
        make_env(GEM_ID, {"task": "roll_math", "dataset_name": str(MATH)})


@needs_rg
def test_rg_and_math_tags_run_through_producers_and_the_batcher(r, run, producer_thread) -> None:
    """The real path, against Redis: a random policy's text replies (unparsable answers),
    committed and handed out; the batch keeps the text actions out of the integer array."""
    from consumer import Batcher

    tags = {"Letters": {"env_id": GEM_ID, "max_steps": 2,
                        "env_config": {"task": "rg:letter_counting", "size": 50}},
            "Quiz": {"env_id": GEM_ID, "env_config": {"task": "roll_qa",
                                                      "dataset_name": str(QA)}}}
    config = small_config(custom_envs=tags, train_env_manager={
        "tags": ["Letters", "Quiz"], "num_groups_partition": [2, 2]})
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch("train", timeout_s=60)
    assert {t["tag"] for t in batch.trajectories} == {"Letters", "Quiz"}
    for traj in batch.trajectories:
        assert traj["num_actions"] == 1 and traj["terminated"] and not traj["truncated"]
        assert traj["final_observation"] == "<\uff5cTERMINAL_STATE\uff5c>"
        assert traj["episode_score"] == 0.0 and traj["success"] is False
        step = traj["steps"][0]
        assert isinstance(step["action"], str) and step["info"]["action_is_valid"] is False
    letters = [t for t in batch.trajectories if t["tag"] == "Letters"]
    assert letters[0]["steps"][0]["observation"].startswith("How many times does the letter")
    assert batch.actions is None and batch.metrics["env/Letters/success"] == 0.0
