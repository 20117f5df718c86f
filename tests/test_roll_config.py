"""ROLL's pipeline YAML as ROLL reads it: Hydra composition, ROLL's keys, `config show`.

The fixture `tests/data/roll/` is a ROLL agentic pipeline config (Hydra `defaults` with
`@_here_`, interpolation, `custom_envs: X: ${custom_env.X}`, trainer and inference sections
a rollout service ignores), kept byte for byte with its `config/` folder.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from helpers import run_cli, small_config

from consumer import Batcher
from producers.envs import build_env, env_kwargs, make_env
from rollstream.cli import main as cli_main
from schemas.config import RolloutConfig
from schemas.envspec import SOKOBAN_ID, EnvSpec
from schemas.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
ROLL_DIR = ROOT / "tests" / "data" / "roll"
ROLL_FILE = ROLL_DIR / "agentic" / "agentic_val_sokoban.yaml"
FIXTURE = "tests/data/roll/agentic/agentic_val_sokoban.yaml"  # as a user types it
ROLL_TAGS = ["SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab", "FrozenLake",
             "FrozenLakeThink"]
ROLL_VOCAB = {"wall": "W", "empty": ".", "target": "G", "box_on_target": "C", "box": "B",
              "player": "A", "player_on_target": "@"}  # ROLL's codes 0..6, as the fixture has
PLAIN_VOCAB = {"wall": "#", "empty": "_", "target": "O", "box_on_target": "√", "box": "X",
               "player": "P", "player_on_target": "S"}


@pytest.fixture
def roll_copy(tmp_path: Path) -> Path:
    """A writable copy of the fixture tree; returns the pipeline file in it."""
    shutil.copytree(ROLL_DIR, tmp_path / "roll")
    for path in (tmp_path / "roll").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return tmp_path / "roll" / "agentic" / "agentic_val_sokoban.yaml"


def unknown_keys_warning(caplog: pytest.LogCaptureFixture) -> list[str]:
    found = [r.getMessage() for r in caplog.records if "unknown config keys" in r.getMessage()]
    assert len(found) == 1, found
    listed = found[0].split("unknown config keys: ", 1)[1].split(" (", 1)[0]
    return listed.split(", ")


# -- composition ----------------------------------------------------------------------------
def test_the_roll_pipeline_composes_as_roll_reads_it(caplog):
    with caplog.at_level(logging.WARNING):
        config = RolloutConfig.from_yaml(ROLL_FILE)
    layout = config.layout()
    assert layout["train"] == {"envs": 1024, "groups": 128, "shards": 64, "group_size": 8,
                               "tags": {"SimpleSokoban": [0, 128]}}
    assert layout["val"]["tags"] == {"SimpleSokoban": [0, 256], "LargerSokoban": [256, 512],
                                     "SokobanDifferentGridVocab": [512, 768],
                                     "FrozenLake": [768, 1024]}
    assert (config.seed, config.ratio, config.train_batch_size, config.val_batch) == \
        (42, 1, 1024, 1024)
    assert config.policy.type == "random"  # no policy block
    assert list(config.custom_envs) == ROLL_TAGS  # ${custom_env.X} resolved per tag
    for tag in ROLL_TAGS:
        spec = config.custom_envs[tag]
        assert spec.max_steps == 10 and spec.env_config["max_steps"] == 10  # interpolated
        # the file's own max_tokens_per_step (64) beats its defaults file's (128): _self_ last
        assert spec.max_tokens_per_step == 64
        assert spec.agent_system_template.startswith("You play grid puzzle games")
        assert "Actions left: {actions_left}" in spec.agent_template
    assert config.env_spec("FrozenLakeThink").env_config["action_pattern"].startswith("<think>")
    vocab = config.env_spec("SokobanDifferentGridVocab").env_config
    assert vocab["grid_lookup"] == {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}
    # a full ROLL file's ignored keys: each once, top-level sections by name, not by leaf
    listed = unknown_keys_warning(caplog)
    assert len(listed) == len(set(listed))
    for key in ("actor_train", "actor_infer", "pretrain", "deepspeed_zero", "custom_env",
                "custom_envs.*.use_thread_lock", "custom_envs.*.env_manager_cls"):
        assert key in listed
    assert not [key for key in listed if key.startswith(("actor_train.", "custom_env."))]


def test_compose_leaves_the_working_dir_logging_and_a_callers_hydra_alone(tmp_path):
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    (tmp_path / "app.yaml").write_text("x: 1\n")
    root = logging.getLogger()
    before = (os.getcwd(), list(root.handlers), root.level)
    initialize_config_dir(config_dir=str(tmp_path), version_base=None)  # the caller's Hydra
    theirs = GlobalHydra.instance().hydra
    try:
        config = RolloutConfig.from_yaml(ROLL_FILE)
        assert GlobalHydra.instance().hydra is theirs
    finally:
        GlobalHydra.instance().clear()
    assert config.train_batch_size == 1024
    assert (os.getcwd(), list(root.handlers), root.level) == before


def test_plain_files_load_as_plain_yaml_and_need_no_hydra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "hydra", None)  # as if the extra were not installed
    config = RolloutConfig.from_yaml(ROOT / "configs" / "frozenlake_sync.yaml")
    assert config.train_env_manager.tags == ["FrozenLake"]
    assert cli_main(["config", "check", str(ROLL_FILE)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "pip install 'rollstream[roll]'" in err and str(ROLL_FILE) in err


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("../config/envs@_here_", "../config/nothere@_here_",
         "defaults: could not load '../config/nothere'"),
        ("${custom_env.FrozenLake}", "${custom_env.NoSuchTag}",
         "custom_envs.FrozenLake: Interpolation key 'custom_env.NoSuchTag' not found"),
        ("top_p: 0.99", "top_p: ${missing_value}",
         "actor_infer.generating_args.top_p: Interpolation key 'missing_value' not found"),
    ],
    ids=["missing-defaults-file", "interpolation-to-nowhere", "interpolation-in-ignored-key"],
)
def test_a_broken_roll_file_fails_check_with_exit_2_and_the_key_named(roll_copy, old, new,
                                                                      needle):
    text = roll_copy.read_text(encoding="utf-8")
    assert old in text
    roll_copy.write_text(text.replace(old, new), encoding="utf-8")
    out = run_cli("config", "check", str(roll_copy))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


# -- the command line -----------------------------------------------------------------------
def test_config_check_prints_the_layout_of_the_roll_file():
    out = run_cli("config", "check", FIXTURE)
    assert out.returncode == 0, out.stderr
    assert f"{FIXTURE}: ok (async, ratio 1, train batch 1024" in out.stdout
    assert "train: 1024 envs, 128 groups of 8, 64 shards" in out.stdout
    assert "val: 1024 envs, 1024 groups of 1, 32 shards" in out.stdout
    assert "  SokobanDifferentGridVocab: groups [512, 768)" in out.stdout
    warnings = [line for line in out.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "actor_train" in warnings[0]


def test_config_show_round_trips_to_an_equal_plain_config(tmp_path):
    out = run_cli("config", "show", FIXTURE)
    assert out.returncode == 0, out.stderr
    assert "${" not in out.stdout and "defaults" not in out.stdout
    assert "deepspeed_zero" not in out.stdout and "actor_train" not in out.stdout
    shown = yaml.safe_load(out.stdout)
    # what the ROLL keys became, with every default spelled out
    frozen = shown["custom_envs"]["FrozenLake"]
    assert (frozen["env_id"], frozen["max_steps"]) == ("rollstream/FrozenLake-v0", 10)
    assert shown["policy"] == {"type": "random", "latency_s": 0.0, "latency_sigma": 0.0}
    assert shown["lease_ttl_s"] == 10.0 and shown["val_env_manager"]["group_size_redundancy"] == 0
    path = tmp_path / "shown.yaml"
    path.write_text(out.stdout, encoding="utf-8")
    assert RolloutConfig.from_yaml(path) == RolloutConfig.from_yaml(ROLL_FILE)


def test_an_openai_block_takes_pretrain_and_generating_args(roll_copy, caplog):
    """A user's file over the ROLL one: `defaults` pulls it in, the policy block adds URLs."""
    mine = roll_copy.parent / "with_llm.yaml"
    mine.write_text("defaults:\n  - agentic_val_sokoban@_here_\n  - _self_\n"
                    "policy:\n  type: openai\n  base_urls: [http://127.0.0.1:8000/v1]\n"
                    "  top_k: 20\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        policy = RolloutConfig.from_yaml(mine).policy
    assert policy.type == "openai"
    assert policy.model == "Qwen/Qwen2.5-0.5B-Instruct"  # pretrain
    assert policy.max_tokens == 64  # max_new_tokens: ${max_tokens_per_step}
    assert (policy.temperature, policy.top_p) == (0.99, 0.99)
    assert policy.top_k == 20  # the block's own value wins over generating_args' 100
    listed = unknown_keys_warning(caplog)
    assert "pretrain" not in listed and "actor_infer" not in listed
    assert {"actor_infer.model_args", "actor_infer.generating_args.num_beams"} <= set(listed)


def test_a_bad_value_from_generating_args_is_named_as_written(roll_copy):
    """The error names the ROLL key the user wrote, not the policy key it filled."""
    mine = roll_copy.parent / "bad_llm.yaml"
    mine.write_text("defaults:\n  - agentic_val_sokoban@_here_\n  - _self_\n"
                    "actor_infer:\n  generating_args:\n    max_new_tokens: 0\n"
                    "policy:\n  type: openai\n  base_urls: [http://127.0.0.1:8000/v1]\n",
                    encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(
            "actor_infer.generating_args.max_new_tokens (policy.max_tokens): Input should be "
            "greater than 0")):
        RolloutConfig.from_yaml(mine)


# -- ROLL's env keys ------------------------------------------------------------------------
def test_the_integer_keyed_vocabulary_renders_with_its_own_symbols():
    config = RolloutConfig.from_yaml(ROLL_FILE)
    published = RolloutConfig.from_json(config.to_json())  # what producers read: "0", "1", ...
    assert "0" in published.env_spec("SokobanDifferentGridVocab").env_config["grid_lookup"]
    variant = build_env(config, "SokobanDifferentGridVocab")
    from_json = build_env(published, "SokobanDifferentGridVocab")
    plain = make_env(SOKOBAN_ID, {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 30})
    to_roll = str.maketrans({PLAIN_VOCAB[k]: ROLL_VOCAB[k] for k in PLAIN_VOCAB})
    for seed in range(10):
        text = variant.reset(seed=seed)[0]
        assert set(text) <= set("W.GCBA@\n") and "W" in text and set(text) & {"A", "@"}
        assert from_json.reset(seed=seed)[0] == text
        assert plain.reset(seed=seed)[0].translate(to_roll) == text  # same room, its symbols
    instruction = variant.unwrapped.instruction
    assert "W: wall" in instruction and "C: box on target" in instruction
    assert "#: wall" not in instruction


def test_grid_vocab_is_the_meaning_the_agent_is_told():
    env = make_env(SOKOBAN_ID, {"grid_lookup": {5: "A", "6": "a"},
                                "grid_vocab": {"A": "you", "a": "you, on a target"}})
    assert env.unwrapped.vocab["player"] == "A" and env.unwrapped.vocab["player_on_target"] == "a"
    assert "\nA: you, a: you, on a target\n" in env.unwrapped.instruction
    assert "#: wall" not in env.unwrapped.instruction  # as in ROLL: the list is grid_vocab
    with pytest.raises(ValueError, match="grid_vocab has symbol 'Z'"):
        make_env(SOKOBAN_ID, {"grid_vocab": {"Z": "zebra"}})
    with pytest.raises(ValueError, match="grid_lookup has unknown key 7"):
        make_env(SOKOBAN_ID, {"grid_lookup": {7: "Z"}})
    with pytest.raises(ValueError, match="names wall twice"):
        make_env(SOKOBAN_ID, {"grid_lookup": {0: "W", "wall": "V"}})


def test_frozenlake_takes_roll_codes_zero_to_five():
    from producers.envs import FROZENLAKE_ID

    env = make_env(FROZENLAKE_ID, {"grid_lookup": {0: "@", 1: ".", 2: "#", 3: "$", 4: "x",
                                                   5: "!"}, "p": 1.0})
    assert env.unwrapped.vocab == {"player": "@", "empty": ".", "hole": "#", "goal": "$",
                                   "player_in_hole": "x", "player_on_goal": "!"}
    text = env.reset(seed=0)[0]
    assert sorted(text) == sorted("\n" * 3 + "@" + "$" + "." * 14)


def test_action_lookup_renames_actions_by_rolls_ids():
    names = {1: "North", 2: "South", 3: "West", 4: "East"}  # ROLL's Sokoban ids: 1 is Up
    renamed = make_env(SOKOBAN_ID, {"action_lookup": names})
    plain = make_env(SOKOBAN_ID, {})
    assert renamed.unwrapped.action_names == ("North", "South", "West", "East")
    assert renamed.unwrapped.instruction.endswith(
        "Your available actions are:\nNorth, South, West, East")
    for reply, action in (("<answer>west</answer>", 2), ("<answer>North</answer>", 0)):
        renamed.reset(seed=3)
        plain.reset(seed=3)
        assert renamed.unwrapped.step_text(reply)[:4] == plain.step(action)[:4]
    renamed.reset(seed=3)
    assert renamed.unwrapped.step_text("<answer>Left</answer>")[4]["action_is_valid"] is False
    with pytest.raises(ValueError, match=r"unknown action id 0 \(ids: 1 Up, 2 Down"):
        make_env(SOKOBAN_ID, {"action_lookup": {0: "None"}})


def test_env_instruction_replaces_the_rules_and_keeps_symbols_and_actions():
    env = make_env(SOKOBAN_ID, {"env_instruction": "Solve the puzzle. Answer <answer>Up</answer>."})
    assert env.unwrapped.instruction == (
        "Solve the puzzle. Answer <answer>Up</answer>.\n"
        "The meaning of each symbol in the state is:\n"
        "#: wall, _: empty, O: target, √: box on target, X: box, P: player, "
        "S: player on target\n"
        "Your available actions are:\nUp, Down, Left, Right")


# -- per-tag max_steps ----------------------------------------------------------------------
def test_a_tags_max_steps_is_the_step_budget_of_any_env():
    ours = EnvSpec(env_type="frozen_lake", max_steps=3)
    assert env_kwargs(ours) == {"max_steps": 3}
    both = EnvSpec(env_type="sokoban", max_steps=5, env_config={"max_steps": 8})
    assert env_kwargs(both)["max_steps"] == 5  # ROLL stops at whichever comes first
    assert env_kwargs(EnvSpec(env_type="sokoban", max_steps=9, env_config={"max_steps": 4})) \
        == {"max_steps": 4}
    pole = gym.make("CartPole-v1", **env_kwargs(EnvSpec(env_id="CartPole-v1", max_steps=4)))
    pole.reset(seed=0)
    flags = [pole.step(0)[3] for _ in range(4)]
    assert flags == [False, False, False, True]


def test_frozenlake_plays_at_most_the_tags_max_steps(r, run, producer_thread):
    """A tag-level `max_steps` (ROLL's place for it) with none in env_config: every episode
    ends there at the latest (with no holes, only a goal reached sooner ends one earlier),
    terminated and truncated as ROLL records it."""
    config = small_config(custom_envs={"FrozenLake": {
        "env_type": "frozen_lake", "max_steps": 3,
        "env_config": {"p": 1.0, "is_slippery": False}}})
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch("train", timeout_s=20)
    assert len(batch) == 16
    assert max(t["num_actions"] for t in batch.trajectories) == 3
    for t in batch.trajectories:
        assert t["num_actions"] == 3 or t["success"]
        assert t["terminated"] and t["truncated"] == (not t["success"])


@pytest.mark.slow
def test_rollstream_up_runs_the_roll_file(redis_url, run):
    """Both env managers of the ROLL file (1024 train, 1024 val envs, every tag) for two
    steps and a val round, on one producer: about 4 s here."""
    out = run_cli("up", "--config", FIXTURE, "--steps", "2", "--val-every", "2",
                  "--producers", "1", "--redis-url", redis_url, "--run", run)
    assert out.returncode == 0, out.stderr
    steps = [line for line in out.stdout.splitlines() if line.startswith("step")]
    assert len(steps) == 2 and all("trajs  1024" in line for line in steps), out.stdout
    val = [line for line in out.stdout.splitlines() if line.lstrip().startswith("val")]
    assert len(val) == 1 and "trajs  1024" in val[0]
    for tag in ("SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab", "FrozenLake"):
        assert f"{tag}=" in val[0]
