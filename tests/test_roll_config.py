"""ROLL's pipeline YAML as ROLL reads it: Hydra composition, ROLL's keys, `config show`.

The fixture `tests/data/roll/` is a ROLL agentic pipeline config (Hydra `defaults` with
`@_here_`, interpolation, `custom_envs: X: ${custom_env.X}`, trainer and inference sections
a rollout service ignores), kept byte for byte with its `config/` folder.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from helpers import run_cli, run_cli_here, small_config

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


def set_aside_line(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The keys of the one DEBUG line naming what a file's load set aside."""
    found = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(found) == 1, found
    return found[0].split("does not use): ", 1)[1].split(", ")


# -- composition ----------------------------------------------------------------------------
def test_the_roll_pipeline_composes_as_roll_reads_it(caplog):
    with caplog.at_level(logging.DEBUG, logger="schemas"):
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
    # ${custom_env.X} resolved per tag; FrozenLakeThink, which no env manager uses, not built
    assert list(config.custom_envs) == ROLL_TAGS[:4]
    for tag in ROLL_TAGS[:4]:
        spec = config.custom_envs[tag]
        assert spec.max_steps == 10 and spec.env_config["max_steps"] == 10  # interpolated
        # the file's own max_tokens_per_step (64) beats its defaults file's (128): _self_ last
        assert spec.max_tokens_per_step == 64
        assert spec.agent_system_template.startswith("You play grid puzzle games")
        assert "Actions left: {actions_left}" in spec.agent_template
        assert spec.manager.name == "traj"
    vocab = config.env_spec("SokobanDifferentGridVocab").env_config
    assert vocab["grid_lookup"] == {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}
    # a full ROLL file's trainer keys: set aside quietly, each once, sections by name
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    listed = set_aside_line(caplog)
    assert len(listed) == len(set(listed))
    for key in ("actor_train", "pretrain", "deepspeed_zero", "custom_env",
                "actor_infer.model_args", "actor_infer.generating_args",
                "custom_envs.SimpleSokoban.use_thread_lock"):
        assert key in listed
    assert not [key for key in listed if key.startswith(("actor_train.", "custom_env."))]


def test_unused_custom_envs_entries_are_neither_built_nor_checked(roll_copy):
    """ROLL builds only the tags its env managers use: an unused entry of an env type
    rollstream does not have, with keys it does not know, is no reason to refuse a file."""
    text = roll_copy.read_text(encoding="utf-8")
    roll_copy.write_text(text + "  WebShopEnv:\n    env_type: webshop\n    no_such_key: 1\n"
                         "    env_manager_cls: my.own.Manager\n", encoding="utf-8")
    config = RolloutConfig.from_yaml(roll_copy)
    assert "WebShopEnv" not in config.custom_envs
    # the same entry used: refused, one line naming the env type and what it needs
    roll_copy.write_text(roll_copy.read_text(encoding="utf-8").replace(
        "tags: [SimpleSokoban]", "tags: [WebShopEnv]"), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        RolloutConfig.from_yaml(roll_copy)
    assert str(info.value) == (f"{roll_copy}: env type 'webshop' (tag WebShopEnv): not "
                               "supported: needs the WebShop server and its product data "
                               "(webshop-minimal)")


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
    out = run_cli_here("config", "check", str(roll_copy))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


# -- the command line -----------------------------------------------------------------------
def test_config_check_prints_the_layout_of_the_roll_file():
    out = run_cli_here("config", "check", FIXTURE)
    assert out.returncode == 0, out.stderr
    assert f"{FIXTURE}: ok (async, ratio 1, train batch 1024" in out.stdout
    assert "train: 1024 envs, 128 groups of 8, 64 shards" in out.stdout
    assert "val: 1024 envs, 1024 groups of 1, 32 shards" in out.stdout
    assert "  SokobanDifferentGridVocab: groups [512, 768)" in out.stdout
    assert "WARNING" not in out.stderr  # ROLL's trainer keys are set aside quietly


def test_config_show_round_trips_to_an_equal_plain_config(tmp_path):
    out = run_cli_here("config", "show", FIXTURE)
    assert out.returncode == 0, out.stderr
    assert "${" not in out.stdout and "defaults" not in out.stdout
    assert "deepspeed_zero" not in out.stdout and "actor_train" not in out.stdout
    shown = yaml.safe_load(out.stdout)
    # what the ROLL keys became, with every default spelled out
    frozen = shown["custom_envs"]["FrozenLake"]
    assert (frozen["env_id"], frozen["max_steps"]) == ("rollstream/FrozenLake-v0", 10)
    assert shown["policy"] == {"type": "random", "latency_s": 0.0, "latency_sigma": 0.0,
                               "partial_rollout": {"in_flight": "keep",
                                                   "sync_carry_over": False,
                                                   "async_carry_over": 0}}
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
    with caplog.at_level(logging.DEBUG, logger="schemas"):
        policy = RolloutConfig.from_yaml(mine).policy
    assert policy.type == "openai"
    assert policy.model == "Qwen/Qwen2.5-0.5B-Instruct"  # pretrain
    sampling = policy.sampling
    for mode in ("train", "val"):  # actor_infer's block samples both modes, as in ROLL
        args = sampling.mode(mode)
        assert args.max_new_tokens == 64  # max_new_tokens: ${max_tokens_per_step}
        assert (args.temperature, args.top_p) == (0.99, 0.99)
        assert args.top_k == 20  # the block's own value wins over generating_args' 100
        assert args.include_stop_str_in_output is True  # ROLL's engines keep stop strings
    assert sampling.source("val.temperature") == "actor_infer.generating_args.temperature"
    assert sampling.source("train.top_k") == "policy.top_k"
    assert sampling.sequence_length == 8192
    assert sampling.source("sequence_length") == "sequence_length"
    assert policy.val_temperature == 0.99  # ROLL samples val as the file says, not greedily
    listed = set_aside_line(caplog)
    assert "pretrain" not in listed and "actor_infer.generating_args" not in listed
    assert {"actor_infer.model_args", "actor_infer.generating_args.num_return_sequences"} <= \
        set(listed)


def test_a_bad_value_from_generating_args_is_named_as_written(roll_copy):
    """The error names the ROLL key the user wrote, once, not the policy keys it filled."""
    mine = roll_copy.parent / "bad_llm.yaml"
    mine.write_text("defaults:\n  - agentic_val_sokoban@_here_\n  - _self_\n"
                    "actor_infer:\n  generating_args:\n    max_new_tokens: 0\n"
                    "policy:\n  type: openai\n  base_urls: [http://127.0.0.1:8000/v1]\n",
                    encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        RolloutConfig.from_yaml(mine)
    assert str(info.value) == (f"{mine}: actor_infer.generating_args.max_new_tokens: Input "
                               "should be greater than 0")


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


# -- ROLL's env managers and their templates -------------------------------------------------
STEP_MANAGER = "roll.pipeline.agentic.env_manager.step_env_manager.StepEnvManager"
CONCAT_MANAGER = "roll.pipeline.agentic.env_manager.step_concat_env_manager.StepConcatEnvManager"
NATIVE_MANAGER = ("roll.pipeline.agentic.env_manager.agent_native_env_manager."
                  "AgentNativeStepEnvManager")
STEP_TEMPLATE = ("## Env Instruction: {env_instruction}\nPrior to this step, you have completed "
                 "{step_count} steps. The last {history_length} steps: [{history}]\nYou are at "
                 "step {current_step}: [{current_observation}]\nAt most "
                 "{max_response_length} tokens.")


def lake(**entry):
    return small_config(custom_envs={"Lake": {"env_type": "frozen_lake", **entry}},
                        train_env_manager={"tags": ["Lake"]})


@pytest.mark.parametrize(
    ("manager", "template"),
    [
        (STEP_MANAGER, STEP_TEMPLATE),
        (CONCAT_MANAGER, "Observation:\n{history}\n{current_observation}\n\\boxed{{}}"),
        (None, "{observation}\n{suffix}"),  # TrajEnvManager fills `suffix` too
        (NATIVE_MANAGER, "agent_template placeholder {anything}"),  # the env gives the prompt
    ],
    ids=["step", "step-concat", "traj-suffix", "agent-native"],
)
def test_each_env_manager_takes_the_placeholders_rolls_fills(manager, template):
    entry = {"agent_template": template, "history_length": 5}
    if manager:
        entry["env_manager_cls"] = manager
    spec = lake(**entry).env_spec("Lake")
    assert spec.agent_template == template and spec.history_length == 5
    assert spec.manager.name == {STEP_MANAGER: "step", CONCAT_MANAGER: "step_concat",
                                 NATIVE_MANAGER: "agent_native", None: "traj"}[manager]


@pytest.mark.parametrize(
    ("manager", "template", "unknown"),
    [
        (STEP_MANAGER, "{observation} {history}", "['observation']"),  # a traj field
        (CONCAT_MANAGER, "{env_instruction}\n{history}", "['env_instruction']"),
        (None, "Turn {turn_idx}: {current_observation}", "['current_observation']"),
        (None, "{} {observation}", "['{}']"),  # positional: ROLL's format(**fields) fails
    ],
)
def test_a_placeholder_the_manager_does_not_fill_is_refused(manager, template, unknown):
    entry = {"agent_template": template}
    if manager:
        entry["env_manager_cls"] = manager
    with pytest.raises(ConfigError) as info:
        lake(**entry)
    assert f"custom_envs.Lake: agent_template has unknown placeholders {unknown}" in \
        str(info.value)


def test_a_null_system_template_means_no_system_message_and_survives_publishing():
    """ROLL's step managers send no system message when the template is null (gem_game,
    gem_rg examples: `agent_system_template: ~`)."""
    config = lake(agent_system_template=None, env_manager_cls=CONCAT_MANAGER,
                  agent_template="{history}\n{current_observation}")
    assert config.env_spec("Lake").agent_system_template is None
    assert config.env_spec("Lake").agent_prompt.system_template is None
    published = RolloutConfig.from_json(config.to_json())
    assert published == config
    assert lake().env_spec("Lake").agent_system_template  # left out: rollstream's default


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"env_manager_cls": "my.pkg.Manager"},
         "env manager 'Manager' (tag Lake): not supported: needs one of ROLL's env managers "
         "rollstream renders (TrajEnvManager, StepEnvManager, StepConcatEnvManager, "
         "AgentNativeStepEnvManager)"),
        ({"tool_wrapper": {"tool_configs": [{"tool_id": "mcp"}]}},
         "tool 'mcp' (tag Lake): not supported: needs an MCP server"),
        ({"history_length": 0}, "custom_envs.Lake.history_length"),
        ({"tool_wrapper": {"tool_configs": []}}, "custom_envs.Lake.tool_wrapper.tool_configs"),
    ],
)
def test_a_tags_manager_and_tools_are_checked(entry, needle):
    with pytest.raises(ConfigError) as info:
        lake(**entry)
    assert needle in str(info.value)


def test_a_tool_the_producers_lack_is_accepted_and_said(caplog):
    with caplog.at_level(logging.WARNING, logger="schemas"):
        config = lake(tool_wrapper={"wrapper_args": {"max_tool_uses": 1},
                                    "tool_configs": [{"tool_id": "python_code",
                                                      "tool_args": {"timeout": 5}}]})
    assert config.env_spec("Lake").tool_wrapper.tool_configs[0].tool_args == {"timeout": 5}
    (note,) = config.pending()
    assert note.startswith("tool 'python_code' (python tool; tag Lake): accepted by the "
                           "config, not run by producers yet")
    assert [r.getMessage() for r in caplog.records] == [f"config: {note}"]


# -- env managers: ROLL's defaults and the group filter -------------------------------------
def test_max_env_num_per_worker_zero_or_left_out_puts_every_env_in_one_shard():
    """ROLL's EnvManagerConfig: max_env_num_per_worker <= 0 means all envs in one worker."""
    for manager in ({"max_env_num_per_worker": 0}, {"max_env_num_per_worker": None}):
        data = {"train_env_manager": {"num_env_groups": 4, "group_size": 4,
                                      "tags": ["FrozenLake"], **manager}}
        if manager["max_env_num_per_worker"] is None:
            del data["train_env_manager"]["max_env_num_per_worker"]
        train = RolloutConfig.from_dict(data).train_env_manager
        assert (train.max_env_num_per_worker, train.num_shards) == (16, 1)


def test_the_group_filter_takes_rolls_names():
    config = small_config(train_env_manager={
        "group_filter_cls": "my_filters.DropEasy",
        "group_filter_config": {"type": "std_filter", "filter_args": {"std_threshold": 0.01}}})
    train = config.train_env_manager
    assert train.group_filter_cls == "my_filters.DropEasy"
    assert train.group_filter_config.active
    assert train.group_filter_config.filter_args.std_threshold == 0.01
    assert RolloutConfig.from_json(config.to_json()) == config
    # ROLL's default class keeps every group: no filter
    roll_default = "roll.pipeline.agentic.agentic_pipeline.GroupFilter"
    plain = small_config(train_env_manager={"group_filter_cls": roll_default})
    assert plain.train_env_manager.group_filter_cls is None
    assert not plain.train_env_manager.group_filter_config.active


@pytest.mark.parametrize(
    ("manager", "needle"),
    [
        ({"group_filter_cls": "not a path"}, "is not an import path"),
        ({"group_filter_cls": "roll.pipeline.agentic.env_manager.agent_native_env_manager."
                               "GroupFilter"}, "is ROLL's own class"),
        ({"group_filter_config": {"type": "mean_filter"}}, "group_filter_config.type"),
        ({"group_filter_config": {"type": "std_filter", "filter_args": {"std": 1}}},
         "group_filter_config.filter_args.std"),
        ({"group_filter_config": {"type": "std_filter", "filter_args": {"std_threshold": -1}}},
         "std_threshold"),
    ],
)
def test_a_bad_group_filter_is_refused_naming_the_field(manager, needle):
    with pytest.raises(ConfigError) as info:
        small_config(train_env_manager=manager)
    assert f"train_env_manager.{needle}" in str(info.value) or needle in str(info.value)


def test_a_variable_the_file_interpolates_is_set_aside_an_unused_one_refused(roll_copy):
    """ROLL files keep values in top-level variables (`max_actions_per_traj: 10` ...
    `${max_actions_per_traj}`): one the file refers to is known; one nothing refers to and
    ROLL does not define is an unknown key like any other."""
    from schemas.roll import referenced_keys

    assert referenced_keys({"a": "${x.y}", "b": ["${oc.env:HOME}", "${.sib} ${z}"],
                            "c": {"d": "${w[0]}"}}) == {"x", "z", "w"}
    mine = roll_copy.parent / "vars.yaml"
    mine.write_text("defaults:\n  - agentic_val_sokoban@_here_\n  - _self_\n"
                    "my_seed: 7\nseed: ${my_seed}\n", encoding="utf-8")
    assert RolloutConfig.from_yaml(mine).seed == 7
    mine.write_text("defaults:\n  - agentic_val_sokoban@_here_\n  - _self_\n"
                    "my_sed: 7\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"vars.yaml: unknown config key my_sed$"):
        RolloutConfig.from_yaml(mine)
