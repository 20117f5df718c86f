"""The compose `llm` profile: a vLLM server on the GPUs that the producers' config points at."""

from __future__ import annotations

from pathlib import Path

import yaml

from schemas.config import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]


def test_the_llm_profile_serves_the_model_the_config_names() -> None:
    services = yaml.safe_load((ROOT / "compose" / "compose.yaml").read_text())["services"]
    vllm = services["vllm"]
    assert vllm["profiles"] == ["llm"]
    assert "profiles" not in services["producer"]  # producers run in every profile
    command = vllm["command"]
    assert command[command.index("--model") + 1].startswith("${VLLM_MODEL")
    served = command[command.index("--served-model-name") + 1]
    port = command[command.index("--port") + 1]
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"

    config = RolloutConfig.from_yaml(ROOT / "configs" / "frozenlake_llm.yaml")
    assert config.policy.type == "openai"
    assert config.policy.base_urls == [f"http://vllm:{port}/v1"]
    assert config.policy.model == served
    assert config.env_spec("FrozenLake").max_tokens_per_step == 128
