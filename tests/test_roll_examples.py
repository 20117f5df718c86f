"""ROLL's own agentic example configs, unchanged: each accepted, or refused with one line.

`tests/data/roll/examples/` holds every agentic pipeline YAML of ROLL's `examples/` (alibaba/
ROLL 8eb27cc2) with the files they compose, in ROLL's layout. A ROLL user points
`rollstream config check` at one: it is accepted (the tags it uses are ones rollstream has
or is to have: `PENDING` says what the producers still lack) and its check builds and resets
one env of each tag (or says in one line which dataset is missing: `MISSING`), or it is
refused with one line naming the env type, env manager or tool and what it would need.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import yaml

from rollstream.cli import main as cli_main
from schemas.config import RolloutConfig
from schemas.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "tests" / "data" / "roll" / "examples"

# file -> the one line that refuses it (after "PATH: ")
REFUSED = {
    "agentic_deepeyes/deepeyes.yaml":
        "env type 'deepeyes' (tag deepeyes): not supported: needs a vision-language model, "
        "image observations and DeepEyes' data",
    "agentic_demo/agent_rollout_rock_swe.yaml":
        "env type 'rock_tb_native_env' (tag swebench_native_verified): not supported: needs "
        "ROCK sandboxes (the rock SDK and its sandbox service)",
    "agentic_demo/agent_val_rock_swe.yaml":
        "env type 'rock_tb_native_env' (tag RockTBNativeEnvTrain): not supported: needs ROCK "
        "sandboxes (the rock SDK and its sandbox service)",
    "agentic_demo/agent_val_rock_swe_qwen35_2b.yaml":
        "env type 'rock_tb_native_env' (tag RockTBNativeEnvTrain): not supported: needs ROCK "
        "sandboxes (the rock SDK and its sandbox service)",
    "agentic_demo/agent_val_sokoban_sandbox.yaml":
        "env type 'sokoban_sandbox' (tag SokobanSandbox): not supported: needs a ROCK sandbox "
        "service (the rock SDK, base_url)",
    # ROLL's own tree lacks the file it composes: ROLL fails on it the same way
    "agentic_demo/atropos_gsm8k_grpo_qwen25_0.5b.yaml":
        "defaults: could not load '../config/deepspeed_zero2' (listed in "
        "'atropos_gsm8k_grpo_qwen25_0.5b'; paths are relative to ",
    "agentic_demo/openreward_endless_terminals_reinforce_qwen35_2b.yaml":
        "env type 'openreward_env' (tag OpenRewardEndlessTerminalsTrain): not supported: needs "
        "the OpenReward SDK and its hosted environments (an API key)",
    "qwen2.5-0.5B-agentic/agentic_val_sokoban_agent_runner.yaml":
        "env manager 'ProxyEnvManager' (tag SimpleSokoban): not supported: needs an agent "
        "runner (agent_runner_cls) driving the env through ROLL's OpenAI-compatible LLM proxy",
    "qwen2.5-0.5B-agentic/agentic_val_sokoban_sandbox.yaml":
        "env type 'sokoban_sandbox' (tag SokobanSandbox): not supported: needs a ROCK sandbox "
        "service (the rock SDK, base_url)",
    "qwen2.5-0.5B-agentic/agentic_val_webshop.yaml": "the config is empty",  # 0 bytes in ROLL
    "qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml":
        "env type 'webshop' (tag WebShopEnv): not supported: needs the WebShop server and its "
        "product data (webshop-minimal)",
    "qwen2.5-7B-agentic_megatron/agentic_val_webshop_amd.yaml":
        "env type 'webshop' (tag WebShopEnv): not supported: needs the WebShop server and its "
        "product data (webshop-minimal)",
    "qwen2.5-7B-agentic_megatron/agentic_val_webshop_gigpo.yaml":
        "env type 'webshop' (tag WebShopEnv): not supported: needs the WebShop server and its "
        "product data (webshop-minimal)",
    "qwen2.5-vl-3B-agentic/agentic_val_sokoban.yaml":
        "env manager 'VLTrajEnvManager' (tag SimpleSokoban): not supported: needs a "
        "vision-language model and image observations",
    "qwen3_agentic_gem/gem_math_hotpotqa_search.yaml":
        "tool 'search' (tag HotpotQA_with_search): not supported: needs a retrieval server "
        "(tool_args.search_url: a dense index of Wikipedia, ROLL's "
        "examples/qwen3_agentic_gem/start_retrieval_server.sh)",
}

# accepted file -> what of it the producers do not run yet: (what, name) pairs
SUPPORTED_NOW: tuple[tuple[str, str], ...] = ()
PENDING: dict[str, tuple[tuple[str, str], ...]] = {
    "agentic_demo/agent_val_frozen_lake_multi_nodes_demo.yaml": SUPPORTED_NOW,
    "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agent_val_frozen_lake-pg_var.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agent_val_frozen_lake-pg_var_is_correct.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agent_val_frozen_lake.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agent_val_frozen_lake_amd.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agent_val_frozen_lake_async.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agent_val_frozen_lake_async_amd.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agent_val_frozen_lake_gigpo.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agentic_rollout_sokoban.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agentic_sokoban_rollout_mock_dump.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agentic_val_sokoban.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agentic_val_sokoban_dynamic_batching.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agentic_val_sokoban_gigpo.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agentic_val_sokoban_lora.yaml": SUPPORTED_NOW,
    "qwen2.5-0.5B-agentic/agentic_val_sokoban_native.yaml": SUPPORTED_NOW,
    "qwen3-30BA3B-agentic_fsdp2/agentic_val_sokoban_30a3.yaml": SUPPORTED_NOW,
    "qwen3_agentic_gem/gem_game_guess_the_number.yaml": SUPPORTED_NOW,
    "qwen3_agentic_gem/gem_math_dapo.yaml": SUPPORTED_NOW,
    "qwen3_agentic_gem/gem_math_dapo_python_code.yaml": (("tool", "python_code"),),
    "qwen3_agentic_gem/gem_math_hotpotqa.yaml": SUPPORTED_NOW,
    "qwen3_agentic_gem/gem_rg_letter_counting.yaml": SUPPORTED_NOW,
}

# accepted file -> what `config check` says is missing here (its dataset is not on disk):
# the start of its one line after "PATH: "; every other accepted file passes the check
DAPO = ("env type 'roll_math': roll_math needs the dataset 'open-r1/DAPO-Math-17k-Processed' "
        "on disk, and it is neither a path nor in the Hugging Face cache")
MISSING = {
    "qwen3_agentic_gem/gem_math_dapo.yaml": "custom_envs.dapo_17k: " + DAPO,
    "qwen3_agentic_gem/gem_math_dapo_python_code.yaml":
        "custom_envs.dapo_17k_with_python_code: " + DAPO,
    "qwen3_agentic_gem/gem_math_hotpotqa.yaml":
        "custom_envs.HotpotQA: env type 'roll_qa': roll_qa needs the dataset "
        "'axon-rl/HotpotQA' on disk, and it is neither a path nor in the Hugging Face cache",
}


def example_files() -> list[str]:
    return sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")
                  if p.parent.name != "config")


@pytest.fixture(autouse=True)
def _wandb_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # the OpenReward example resolves ${oc.env:WANDB_API_KEY} in its tracker settings, as
    # ROLL's launcher does; a ROLL user running it has one
    monkeypatch.setenv("WANDB_API_KEY", "test-key-not-a-secret")


def test_every_example_is_in_one_table():
    """36 agentic pipeline files and one empty one, each accepted or refused on purpose."""
    files = example_files()
    assert len(files) == 37
    assert sorted([*REFUSED, *PENDING]) == files
    assert not set(REFUSED) & set(PENDING)


@pytest.mark.parametrize("name", sorted(PENDING))
def test_an_accepted_example_loads_and_says_what_producers_lack(name, caplog):
    with caplog.at_level(logging.WARNING, logger="schemas"):
        config = RolloutConfig.from_yaml(EXAMPLES / name)
    pending = [(r.getMessage().split(" '", 1)[0].split(": ")[-1],
                r.getMessage().split("'")[1]) for r in caplog.records]
    assert tuple(pending) == PENDING[name]
    assert len(config.pending()) == len(PENDING[name])
    assert config.train_env_manager.tags  # ROLL's layout, composed


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_example_is_one_line_exit_2(name, capsys):
    path = EXAMPLES / name
    assert cli_main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"rollstream: error: {path}: {REFUSED[name]}"), err


def test_an_example_whose_tags_producers_run_passes_the_cli_check(capsys):
    """`config check` also builds and resets one env of each tag."""
    path = EXAMPLES / "qwen2.5-0.5B-agentic" / "agent_val_frozen_lake.yaml"
    assert cli_main(["config", "check", str(path)]) == 0
    out = capsys.readouterr()
    assert f"{path}: ok (sync, ratio 0, train batch 1024" in out.out


@pytest.fixture
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face cache of this test's own (empty unless the test fills it)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


@pytest.mark.parametrize("name", sorted(PENDING))
def test_every_accepted_example_passes_the_cli_check_or_names_what_is_missing(
        name, capsys, empty_hub_cache):
    """ROLL's examples whose env types rollstream has build and reset one env of every tag
    (GEM games, reasoning-gym, sokoban_native_env, the step managers' tags); one whose
    dataset is not on disk says so in one line, exit 2."""
    path = EXAMPLES / name
    code = cli_main(["config", "check", str(path)])
    out, err = capsys.readouterr()
    if name in MISSING:
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"rollstream: error: {path}: {MISSING[name]}"), err
    else:
        assert code == 0, err
        assert out.startswith(f"{path}: ok (")


def hub_dataset(cache: Path, name: str, filename: str, rows: list[dict]) -> None:
    """`rows` as the hub's copy of dataset `name` in the cache, as huggingface-cli leaves it."""
    snapshot = cache / ("datasets--" + name.replace("/", "--")) / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / filename).write_text("".join(json.dumps(row) + "\n" for row in rows),
                                     encoding="utf-8")


@pytest.mark.parametrize("name", sorted(MISSING))
def test_with_its_dataset_on_disk_a_math_or_qa_example_passes_the_cli_check(
        name, capsys, empty_hub_cache):
    hub_dataset(empty_hub_cache, "open-r1/DAPO-Math-17k-Processed", "train.jsonl",
                [{"prompt": "What is 1 + 1?", "solution": "2"}])
    hub_dataset(empty_hub_cache, "axon-rl/HotpotQA", "train.jsonl",
                [{"problem": "Which city is the capital of France?", "answer": "Paris"}])
    path = EXAMPLES / name
    assert cli_main(["config", "check", str(path)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"{path}: ok (")


def test_an_unset_environment_variable_is_one_line_naming_the_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY")
    path = EXAMPLES / "agentic_demo" / "openreward_endless_terminals_reinforce_qwen35_2b.yaml"
    with pytest.raises(ConfigError) as info:
        RolloutConfig.from_yaml(path)
    assert str(info.value) == (f"{path}: tracker_kwargs.api_key: KeyError raised while "
                               "resolving interpolation: \"Environment variable "
                               "'WANDB_API_KEY' not found\"")


# -- sampling, as ROLL samples each example ------------------------------------------------
@pytest.fixture(scope="module")
def examples_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("roll") / "examples"
    shutil.copytree(EXAMPLES, root)
    return root


def with_server(examples_copy: Path, name: str, block: str = "") -> RolloutConfig:
    """The example under a user's file that adds an openai policy block."""
    example = examples_copy / name
    mine = example.with_name(f"mine_{example.name}")
    mine.write_text(f"defaults:\n  - {example.stem}@_here_\n  - _self_\npolicy:\n"
                    f"  type: openai\n  base_urls: [http://127.0.0.1:8000/v1]\n{block}",
                    encoding="utf-8")
    return RolloutConfig.from_yaml(mine)


@pytest.mark.parametrize("name", sorted(PENDING))
def test_every_accepted_example_gives_both_modes_their_sampling(examples_copy, name):
    sampling = with_server(examples_copy, name).policy.sampling
    assert sampling.sequence_length is not None
    assert sampling.source("sequence_length") == "sequence_length"
    for mode in ("train", "val"):
        source = sampling.source(f"{mode}.temperature")
        assert source.endswith("generating_args.temperature"), source


def test_the_val_manager_samples_val_when_actor_infer_has_no_block(examples_copy):
    """agent_val_frozen_lake.yaml: no actor_infer.generating_args, 0.99 for train, 0.2 val."""
    policy = with_server(examples_copy, "qwen2.5-0.5B-agentic/agent_val_frozen_lake.yaml").policy
    assert (policy.sampling.train.temperature, policy.sampling.val.temperature) == (0.99, 0.2)
    assert policy.sampling.source("val.temperature") == \
        "val_env_manager.generating_args.temperature"
    assert policy.sampling.describe()[7] == \
        "val temperature 0.2 (val_env_manager.generating_args.temperature)"
    assert policy.val_temperature == 0.2 and policy.temperature == 0.99


def test_actor_infers_block_overrides_the_managers_as_in_roll(examples_copy):
    """agentic_val_sokoban.yaml: actor_infer's 0.99 samples val too."""
    policy = with_server(examples_copy, "qwen2.5-0.5B-agentic/agentic_val_sokoban.yaml").policy
    assert policy.sampling.val.temperature == 0.99
    assert policy.sampling.val.top_k == 100 and policy.sampling.val.max_new_tokens == 128
    assert policy.sampling.source("val.repetition_penalty") == \
        "ROLL default: actor_infer.generating_args leaves it out"
    assert policy.sampling.sequence_length == 8192
    policy = with_server(examples_copy, "qwen2.5-0.5B-agentic/agentic_val_sokoban.yaml",
                         "  val_temperature: 0\n").policy
    assert policy.sampling.val.temperature == 0.0  # the block's own key wins
    assert policy.sampling.source("val.temperature") == "policy.val_temperature"


def test_config_show_says_where_each_sampling_value_came_from(examples_copy, capsys):
    """`rollstream config show` prints, for train and val, each sampling value and its
    source: here each manager's own generating_args, ROLL's defaults for what they leave
    out, and the top-level sequence_length."""
    example = examples_copy / "qwen2.5-0.5B-agentic" / "agent_val_frozen_lake.yaml"
    mine = example.with_name("shown_agent_val_frozen_lake.yaml")
    mine.write_text("defaults:\n  - agent_val_frozen_lake@_here_\n  - _self_\npolicy:\n"
                    "  type: openai\n  base_urls: [http://127.0.0.1:8000/v1]\n",
                    encoding="utf-8")
    assert cli_main(["config", "show", str(mine)]) == 0
    sampling = yaml.safe_load(capsys.readouterr().out)["policy"]["sampling"]
    fields = ("temperature", "top_p", "top_k", "max_new_tokens", "stop",
              "include_stop_str_in_output", "repetition_penalty")
    for mode in ("train", "val"):
        assert set(sampling[mode]) == set(fields)
        for name in ("temperature", "top_p", "top_k", "max_new_tokens"):
            assert sampling["sources"][f"{mode}.{name}"] == \
                f"{mode}_env_manager.generating_args.{name}"
        for name in ("stop", "include_stop_str_in_output", "repetition_penalty"):
            assert sampling["sources"][f"{mode}.{name}"] == \
                f"ROLL default: {mode}_env_manager.generating_args leaves it out"
    assert (sampling["train"]["temperature"], sampling["val"]["temperature"]) == (0.99, 0.2)
    assert sampling["sequence_length"] == 8192
    assert sampling["sources"]["sequence_length"] == "sequence_length"
