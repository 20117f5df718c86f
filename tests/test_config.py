"""Config loading and refusals (pure logic, no Redis)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from helpers import run_cli, run_cli_here

from schemas.config import RolloutConfig, resolve_redis_url, resolve_run
from schemas.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "tests" / "data" / "env_managers.yaml"  # the seed YAML, byte for byte


def manager(**overrides):
    base = {"max_env_num_per_worker": 4, "num_env_groups": 4, "group_size": 2,
            "tags": ["FrozenLake"]}
    base.update(overrides)
    return base


def load(**top):
    top.setdefault("train_env_manager", manager())
    return RolloutConfig.from_dict(top)


def test_seed_yaml_loads_unchanged_with_the_documented_layout():
    # the design document's file itself (its comments kept), not configs/' edited copy
    assert "num_groups_partition: [128] # " in SEED.read_text(encoding="utf-8")
    config = RolloutConfig.from_yaml(SEED)
    assert config.layout()["train"] == {
        "envs": 1024, "groups": 128, "shards": 64, "group_size": 8,
        "tags": {"FrozenLake": [0, 128]},
    }
    val = config.layout()["val"]
    assert (val["envs"], val["groups"], val["shards"], val["group_size"]) == (1024, 1024, 32, 1)
    assert val["tags"] == {"SimpleSokoban": [0, 256], "LargerSokoban": [256, 512],
                           "SokobanDifferentGridVocab": [512, 768], "FrozenLake": [768, 1024]}


def test_seed_config_in_configs_matches_the_seed_blocks():
    ours = yaml.safe_load((ROOT / "configs" / "seed_env_managers.yaml").read_text())
    seed = yaml.safe_load(SEED.read_text())
    for block in ("train_env_manager", "val_env_manager"):
        assert ours[block] == seed[block]


def test_env_ids_groups_and_shards_follow_the_layout():
    m = load(train_env_manager=manager(num_env_groups=6, group_size=3, max_env_num_per_worker=4,
                                       tags=["FrozenLake", "SimpleSokoban"])).train_env_manager
    assert m.num_envs == 18 and m.num_shards == 5
    assert [m.group_of_env(e) for e in (0, 2, 3, 17)] == [0, 0, 1, 5]
    assert [m.tag_of_group(g) for g in range(6)] == ["FrozenLake"] * 3 + ["SimpleSokoban"] * 3
    assert list(m.envs_of_shard(4)) == [16, 17]


def test_missing_partition_splits_evenly_with_the_remainder_first():
    m = load(train_env_manager=manager(num_env_groups=10, tags=["FrozenLake", "SimpleSokoban",
                                                                "LargerSokoban"])).train_env_manager
    assert m.partition == [4, 3, 3]
    assert m.tag_ranges == {"FrozenLake": (0, 4), "SimpleSokoban": (4, 7), "LargerSokoban": (7, 10)}


def test_batch_sizes_default_to_one_trajectory_per_env_group_member():
    config = RolloutConfig.from_yaml(SEED)
    assert config.rollout_batch_size == 1024 and config.val_batch_size == 1024
    assert config.episodes_per_step("train") == 1


@pytest.mark.parametrize(
    ("top", "needle"),
    [
        ({"train_env_manager": manager(num_groups_partition=[2, 2])},
         "num_groups_partition has 2 entries but tags has 1"),
        ({"train_env_manager": manager(num_groups_partition=[3])},
         "num_groups_partition sums to 3, not num_env_groups 4"),
        ({"train_env_manager": manager(tags=["FrozenLake", "NoSuchTag"],
                                       num_groups_partition=[2, 2])},
         "train_env_manager.tags: unknown env tag 'NoSuchTag'"),
        ({"train_env_manager": manager(num_env_groups=0)},
         "train_env_manager.num_env_groups"),
        ({"train_env_manager": manager(group_size=-1)}, "train_env_manager.group_size"),
        ({"train_env_manager": manager(max_env_num_per_worker=-1)},
         "train_env_manager.max_env_num_per_worker"),
        ({"train_env_manager": manager(num_groups_partition=[0])},
         "train_env_manager.num_groups_partition.0"),
        ({"rollout_batch_size": 5}, "rollout_batch_size 5 is not a multiple of "
                                    "train_env_manager.group_size 2"),
        ({"val_batch_size": 3, "val_env_manager": manager(group_size=2)},
         "val_batch_size 3 is not a multiple of val_env_manager.group_size 2"),
        ({"async_generation_ratio": -1}, "async_generation_ratio"),
        ({"async_generation_ratio": 0.5}, "async_generation_ratio"),
        ({"custom_envs": {"Mine": {"env_type": "chess"}},
          "train_env_manager": manager(tags=["Mine"])},
         "env type 'chess' (tag Mine): not supported: needs one of ROLL's env types"),
        ({"custom_envs": {"Mine": {"env_config": {}}}, "train_env_manager": manager(tags=["Mine"])},
         "custom_envs.Mine: needs env_id"),
        ({"policy": {"type": "telepathy"}}, "policy.type"),
    ],
)
def test_refusals_name_the_field(top, needle):
    with pytest.raises(ConfigError) as info:
        load(**top)
    assert needle in str(info.value)


def test_rolls_keys_are_set_aside_quietly_and_listed_at_debug(caplog):
    """ROLL's trainer and worker keys, its launcher's and its env managers' own: known, set
    aside without a warning, named once at DEBUG."""
    with caplog.at_level(logging.DEBUG, logger="schemas"):
        config = load(pipeline_cls="roll.Pipeline", actor_train={"lr": 1}, ppo_epochs=1,
                      train_env_manager=manager(worker_cls="X", format_penalty=-0.1),
                      custom_envs={"FrozenLake": {"env_type": "frozen_lake",
                                                  "use_thread_lock": True}})
    assert config.train_env_manager.num_env_groups == 4
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (line,) = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    for key in ("pipeline_cls", "actor_train", "ppo_epochs", "train_env_manager.worker_cls",
                "train_env_manager.format_penalty", "custom_envs.FrozenLake.use_thread_lock"):
        assert key in line
    assert "actor_train." not in line  # a section is set aside whole


@pytest.mark.parametrize(
    ("top", "needle"),
    [
        ({"rollout_batch_sise": 128}, "unknown config key rollout_batch_sise (did you mean "
                                      "rollout_batch_size?)"),
        ({"train_env_manager": manager(num_env_group=8)},
         "train_env_manager.num_env_group (did you mean num_env_groups?)"),
        ({"train_env_manager": {**manager(), "generating_args": {"temprature": 0.5}}},
         "train_env_manager.generating_args.temprature (did you mean temperature?)"),
        ({"actor_infer": {"generating_arg": {}}},
         "actor_infer.generating_arg (did you mean generating_args?)"),
        ({"custom_envs": {"FrozenLake": {"env_type": "frozen_lake", "max_step": 3}}},
         "custom_envs.FrozenLake.max_step (did you mean max_steps?)"),
        ({"policy": {"latency": 1}}, "policy.latency"),
        ({"what_is_this": 1, "seed": 3}, "unknown config key what_is_this"),
    ],
)
def test_an_unknown_key_is_refused_naming_the_key_it_is_a_typo_of(top, needle):
    """`rollout_batch_sise: 128` ran with the default batch size behind a warning that listed
    ~40 ignored keys; now nothing unknown passes, in any section rollstream reads."""
    with pytest.raises(ConfigError) as info:
        load(**top)
    assert needle in str(info.value)
    assert len(str(info.value).splitlines()) == 1


def test_rolls_own_names_are_no_typos_and_variables_are_set_aside():
    """ROLL's `custom_env` (the entries `custom_envs` interpolates) is one edit from
    `custom_envs` but never offered as a typo of it; its examples' variables are known."""
    with pytest.raises(ConfigError) as info:
        load(custom_env={"X": 1}, rollout_batch_sise=128)
    assert "custom_env," not in str(info.value) and "custom_env " not in str(info.value)
    config = load(custom_env={"X": 1}, max_actions_per_traj=10, env_manager_cls="x.Y")
    assert config.seed == 42


def test_a_key_given_as_null_is_a_key_left_out():
    config = RolloutConfig.from_dict({"seed": None, "val_env_manager": None, "policy": None,
                                      "train_env_manager": manager()})
    assert (config.seed, config.val_env_manager, config.policy.type) == (42, None, "random")
    with pytest.raises(ConfigError, match="^config: train_env_manager: Field required$"):
        RolloutConfig.from_dict({"seed": 3})


def test_a_typo_in_the_cli_is_exit_2_with_one_line(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("rollout_batch_sise: 16\ntrain_env_manager:\n  max_env_num_per_worker: 4\n"
                    "  num_env_groups: 4\n  group_size: 2\n  tags: [FrozenLake]\n")
    out = run_cli_here("config", "check", str(path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == (f"rollstream: error: {path}: unknown config key "
                                  "rollout_batch_sise (did you mean rollout_batch_size?)")


def test_val_group_size_above_one_is_allowed_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        config = load(val_env_manager=manager(group_size=2))
    assert config.val_env_manager.group_size == 2
    assert any("val_env_manager.group_size" in r.getMessage() for r in caplog.records)


def test_custom_env_tag_and_gymnasium_id_tag():
    config = load(custom_envs={"Pole": {"env_id": "CartPole-v1"}},
                  train_env_manager=manager(tags=["Pole", "CartPole-v1"],
                                            num_groups_partition=[2, 2]))
    assert config.env_spec("Pole").env_id == "CartPole-v1"
    assert config.env_spec("CartPole-v1").env_id == "CartPole-v1"
    assert config.env_spec("FrozenLake").env_id == "rollstream/FrozenLake-v0"


def test_published_json_round_trips():
    config = load(async_generation_ratio=2, seed=3)
    assert RolloutConfig.from_json(config.to_json()) == config


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train_env_manager: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        RolloutConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read config"):
        RolloutConfig.from_yaml(tmp_path / "missing.yaml")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        RolloutConfig.from_yaml(scalar)


def test_a_key_twice_is_refused_but_a_merge_may_override(tmp_path):
    manager = ("  max_env_num_per_worker: 8\n  num_env_groups: 4\n  group_size: 4\n"
               "  tags: [FrozenLake]\n")
    twice = tmp_path / "twice.yaml"
    twice.write_text(f"seed: 1\ntrain_env_manager:\n{manager}seed: 2\n")
    with pytest.raises(ConfigError, match=r"key 'seed' given twice \(first at line 1\)"):
        RolloutConfig.from_yaml(twice)
    merged = tmp_path / "merged.yaml"  # YAML's merge key: the keys after it win, as designed
    merged.write_text(f"train_env_manager: &base\n{manager}"
                      "val_env_manager:\n  <<: *base\n  group_size: 1\n")
    config = RolloutConfig.from_yaml(merged)
    assert config.val_env_manager is not None
    assert (config.val_env_manager.group_size, config.val_env_manager.num_env_groups) == (1, 4)


def test_redis_url_and_run_resolution(monkeypatch):
    monkeypatch.delenv("ROLLSTREAM_REDIS_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://fallback:6379/0")
    assert resolve_redis_url(None) == "redis://fallback:6379/0"
    monkeypatch.setenv("ROLLSTREAM_REDIS_URL", "redis://first:6379/0")
    assert resolve_redis_url(None) == "redis://first:6379/0"
    assert resolve_redis_url("redis://flag:1/0") == "redis://flag:1/0"
    monkeypatch.setenv("ROLLSTREAM_RUN", "exp9")
    assert resolve_run(None) == "exp9"
    assert resolve_run("given") == "given"


def test_redis_url_and_run_fall_back_to_the_config(monkeypatch):
    for name in ("ROLLSTREAM_REDIS_URL", "REDIS_URL", "ROLLSTREAM_RUN"):
        monkeypatch.delenv(name, raising=False)
    config = load(redis_url="redis://from-config:6379/3", run="cfgrun")
    assert resolve_redis_url(None, config) == "redis://from-config:6379/3"
    assert resolve_run(None, config) == "cfgrun"
    assert resolve_redis_url(None) is None
    assert resolve_redis_url(None, load()) is None
    assert resolve_run(None) == "rollstream" == resolve_run(None, load())
    monkeypatch.setenv("ROLLSTREAM_REDIS_URL", "")  # empty is unset
    assert resolve_redis_url(None, config) == "redis://from-config:6379/3"
    # anything earlier in the chain wins over the config
    monkeypatch.setenv("REDIS_URL", "redis://env:1/0")
    assert resolve_redis_url(None, config) == "redis://env:1/0"
    monkeypatch.setenv("ROLLSTREAM_RUN", "envrun")
    assert resolve_run(None, config) == "envrun"
    assert resolve_redis_url("redis://flag:1/0", config) == "redis://flag:1/0"
    assert resolve_run("flag", config) == "flag"


def test_cli_config_check_json_prints_the_exact_layout():
    out = run_cli_here("config", "check", str(SEED), "--json")
    assert out.returncode == 0, out.stderr
    layout = json.loads(out.stdout)
    assert layout["train"] == {"envs": 1024, "groups": 128, "shards": 64, "group_size": 8,
                               "tags": {"FrozenLake": [0, 128]}}
    assert layout["val"]["tags"]["FrozenLake"] == [768, 1024]


def test_cli_bad_file_and_bad_command_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"train_env_manager": manager(tags=["Nope"])}))
    out = run_cli("config", "check", str(bad))
    assert out.returncode == 2
    assert "train_env_manager.tags: unknown env tag 'Nope'" in out.stderr
    assert run_cli("config", "check").returncode == 2
    assert run_cli("up", "--config", str(bad), "--steps", "0").returncode == 2
    assert run_cli("produce", "--redis-url", "bogus://x", "--run", "x").returncode == 2
    missing = run_cli("produce", "--run", "x")
    assert missing.returncode == 2 and "no Redis URL" in missing.stderr
    assert "REDIS_URL, or give the --config file a redis_url" in missing.stderr
