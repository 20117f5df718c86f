"""Sampling per mode: ROLL's generating_args precedence, sequence_length, and the sources.

ROLL's rule (AgenticConfig.__post_init__, 8eb27cc2): `actor_infer.generating_args`, when
given, samples both env managers; otherwise each manager samples with its own. Fields a block
leaves out take GeneratingArguments' defaults. The policy block's own keys win over all.
"""

from __future__ import annotations

import logging

import pytest
import yaml

from schemas.config import RolloutConfig
from schemas.errors import ConfigError
from schemas.policy import OpenAIPolicyConfig
from schemas.sampling import SamplingConfig

OPENAI = {"type": "openai", "base_urls": ["http://127.0.0.1:8000/v1"], "model": "m"}


def manager(**extra):
    return {"max_env_num_per_worker": 4, "num_env_groups": 2, "group_size": 2,
            "tags": ["FrozenLake"], **extra}


def load(policy=None, train=None, val=None, **top) -> RolloutConfig:
    data = {"train_env_manager": manager(**({"generating_args": train} if train else {})),
            "val_env_manager": manager(**({"generating_args": val} if val else {})),
            "policy": {**OPENAI, **(policy or {})}, **top}
    return RolloutConfig.from_dict(data)


def sampling(**kwargs) -> SamplingConfig:
    policy = load(**kwargs).policy
    assert isinstance(policy, OpenAIPolicyConfig)
    return policy.sampling


def test_actor_infer_samples_both_modes_over_the_managers_blocks():
    s = sampling(actor_infer={"generating_args": {"temperature": 0.7, "max_new_tokens": 32}},
                 train={"temperature": 0.1}, val={"temperature": 0.2})
    assert (s.train.temperature, s.val.temperature) == (0.7, 0.7)
    assert s.source("val.temperature") == "actor_infer.generating_args.temperature"
    # what actor_infer's block leaves out is GeneratingArguments' default, not the managers'
    assert (s.val.top_p, s.val.top_k, s.val.max_new_tokens) == (0.7, 50, 32)
    assert s.source("train.top_p") == "ROLL default: actor_infer.generating_args leaves it out"


def test_without_actor_infer_each_manager_samples_with_its_own():
    s = sampling(train={"temperature": 0.99, "top_p": 0.99, "stop_strings": ["</answer>"]},
                 val={"temperature": 0.2})
    assert (s.train.temperature, s.val.temperature) == (0.99, 0.2)
    assert s.train.stop == ["</answer>"] and s.val.stop == []
    assert s.val.top_p == 0.7  # the val block leaves it out: ROLL's default
    assert s.source("train.stop") == "train_env_manager.generating_args.stop_strings"


def test_a_val_manager_without_a_block_samples_with_the_train_managers():
    """ROLL itself fails at the first val turn here (its val manager has no generating_args):
    rollstream samples val as train, and says so."""
    s = sampling(train={"temperature": 0.9})
    assert s.val.temperature == 0.9
    assert s.source("val.temperature") == \
        "train_env_manager.generating_args.temperature (val_env_manager has none)"


def test_without_rolls_blocks_rollstreams_defaults_and_shorthands_apply():
    s = sampling()
    assert (s.train.temperature, s.val.temperature, s.train.top_k) == (1.0, 0.0, -1)
    assert s.train.max_new_tokens == 512 and s.sequence_length is None
    assert s.source("val.temperature") == "rollstream default (val_temperature)"
    s = sampling(policy={"temperature": 0.5, "val_temperature": 0.1, "max_tokens": 64})
    assert (s.train.temperature, s.val.temperature) == (0.5, 0.1)
    assert s.train.max_new_tokens == s.val.max_new_tokens == 64
    assert s.source("val.max_new_tokens") == "policy.max_tokens"


def test_the_blocks_own_keys_win_over_rolls():
    s = sampling(policy={"top_k": 20, "val_temperature": 0.0},
                 actor_infer={"generating_args": {"top_k": 100, "temperature": 0.99}})
    assert (s.train.top_k, s.val.top_k, s.train.temperature, s.val.temperature) == \
        (20, 20, 0.99, 0.0)


@pytest.mark.parametrize(
    ("top", "length", "source"),
    [
        ({"sequence_length": 4096}, 4096, "sequence_length"),
        ({"response_length": 512}, 1536, "ROLL's prompt_length 1024 + response_length"),
        ({"response_length": 512, "prompt_length": 256}, 768, "prompt_length + response_length"),
        ({"sequence_length": 2048, "response_length": 512}, 2048, "sequence_length"),
    ],
)
def test_sequence_length_as_roll_derives_it(top, length, source):
    s = sampling(**top)
    assert s.sequence_length == length and s.source("sequence_length") == source


def test_the_show_output_keeps_values_and_sources(tmp_path):
    config = load(actor_infer={"generating_args": {"temperature": 0.99}}, sequence_length=1024,
                  val={"temperature": 0.3})
    path = tmp_path / "shown.yaml"
    path.write_text(config.to_yaml(), encoding="utf-8")
    again = RolloutConfig.from_yaml(path)
    assert again == config
    assert RolloutConfig.from_json(config.to_json()) == config
    assert again.policy.sampling.source("val.temperature") == \
        "actor_infer.generating_args.temperature"
    shown = yaml.safe_load(config.to_yaml())["policy"]
    assert "temperature" not in shown and shown["sampling"]["val"]["temperature"] == 0.99


def test_a_policy_built_in_code_takes_the_shorthands():
    policy = OpenAIPolicyConfig(**OPENAI, temperature=0.4, val_temperature=0.2, top_p=0.9)
    assert (policy.temperature, policy.val_temperature, policy.top_p, policy.max_tokens) == \
        (0.4, 0.2, 0.9, 512)
    assert policy.sampling.mode("val").top_p == 0.9


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"actor_infer": {"generating_args": {"num_beams": 4}}},
         "actor_infer.generating_args.num_beams 4: beam search is not available"),
        ({"train": {"temprature": 1.0}},
         "train_env_manager.generating_args.temprature (did you mean temperature?)"),
        ({"val": {"top_p": 1.5}}, "val_env_manager.generating_args.top_p: Input should be less "
                                  "than or equal to 1"),
        ({"actor_infer": {"generating_args": [1]}},
         "actor_infer.generating_args: expected a mapping"),
        ({"sequence_length": 0}, "sequence_length: Input should be greater than 0"),
    ],
)
def test_bad_sampling_is_one_line_naming_the_key_as_written(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        load(**kwargs)
    assert needle in str(info.value)
    assert len(str(info.value).splitlines()) == 1


def test_rolls_sampling_with_a_policy_that_does_not_sample_is_set_aside(caplog):
    data = {"train_env_manager": manager(generating_args={"temperature": 0.5}),
            "pretrain": "Qwen/Qwen2.5-0.5B-Instruct", "sequence_length": 1024}
    with caplog.at_level(logging.DEBUG, logger="schemas"):
        config = RolloutConfig.from_dict(data)
    assert config.policy.type == "random"
    (line,) = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    for key in ("pretrain", "sequence_length", "train_env_manager.generating_args"):
        assert key in line
