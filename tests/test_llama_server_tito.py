"""`rollstream up` with `policy.tokenizer` against a real llama.cpp `llama-server` serving the
tiny model with its Qwen3-style template (which drops earlier thinking: not append-only):
the producers render the template themselves and send token ids to llama-server's own
`/completion` (`return_tokens`); the model is nudged (`logit_bias`) to write `</think>`, which
that template would strip from earlier replies. Every trajectory's ids are exactly what the
server sampled: each turn's prompt starts with the previous prompt and the sampled ids, the
trainer's `trajectory_tokens()` keeps every trajectory, and the server, given a turn's prompt
ids again, samples the recorded ids again (greedy).

Skips without the binary (scripts/build_llama_server.sh), fails instead when
ROLLSTREAM_REQUIRE_REAL_SERVERS=1 (CI).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, clean_env
from real_servers import (
    free_port,
    llama_server_argv,
    llama_server_binary,
    load_tiny_model_script,
    request,
    running,
)

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("gguf")
pytest.importorskip("jinja2")

N_CTX = 4096
MAX_TOKENS = 16
STEPS = 2


def run_config(base_url: str, tokenizer: Path, bias: dict[str, float]) -> dict:
    return {
        "rollout_batch_size": 8, "async_generation_ratio": 1, "seed": 5,
        "train_env_manager": {"max_env_num_per_worker": 8, "num_env_groups": 2,
                              "group_size": 4, "tags": ["FrozenLake"]},
        "val_env_manager": None,
        "policy": {"type": "openai", "base_urls": [f"{base_url}/v1"], "model": "tiny",
                   "max_tokens": MAX_TOKENS, "temperature": 0.0, "timeout_s": 60,
                   "max_retries": 2, "tokenizer": str(tokenizer), "extra_body": {
                       "logit_bias": bias}},
    }


@pytest.mark.slow
def test_token_in_token_out_against_a_real_llama_server(tmp_path: Path) -> None:
    binary = llama_server_binary()
    model = tmp_path / "model"
    model.mkdir()
    load_tiny_model_script().generate(model, seed=0)
    tokenizer = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    end = tokenizer.token_to_id("<|im_end|>")
    # the random model is nudged to write </think> (greedy: about half its tokens), so the
    # thinking template, which drops what comes before it in earlier replies, would rewrite
    # the conversation every turn
    bias = {str(tokenizer.token_to_id("</think>")): 1.5}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = llama_server_argv(binary, model / "tiny-thinking.gguf", port, n_ctx=N_CTX)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(url, model / "thinking", bias)))
    trainer = f"{ROOT / 'tests' / 'data' / 'tito_trainer.py'} {STEPS}"
    env = {**clean_env(), "LLAMA_RUN_DIR": str(tmp_path)}
    with running(argv, url, tmp_path / "server.log"):
        up = subprocess.run(
            [sys.executable, "-m", "rollstream", "--log-level", "WARNING", "up", "--config",
             str(config), "--run", "tito-run", "--producers", "1", "--trainer", trainer],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=300)
        assert up.returncode == 0, up.stdout
        assert "Traceback" not in up.stdout
        summary = json.loads((tmp_path / "summary.json").read_text())
        trajectories = summary["trajectories"]
        assert len(trajectories) == 8 * STEPS
        assert summary["non_extending"] == 0
        multi = [t for t in trajectories if len(t["steps"]) > 1]
        assert multi, "no episode had a second turn"
        # replies the template would have rewritten in the next prompt, kept as sampled
        rewritten = [t for t in multi if "</think>" in t["steps"][0]["response"]]
        assert rewritten, "no reply with </think> was followed by another turn"
        for traj in trajectories:
            steps = traj["steps"]
            for step in steps:
                assert step["source"] == "server"  # llama-server's own `tokens`
                assert step["finish_reason"] in ("stop", "length")
                n = len(step["response_ids"])
                assert n == MAX_TOKENS or step["response_ids"][-1] == end
            for before, after in zip(steps, steps[1:], strict=False):
                sent = before["prompt_ids"] + before["response_ids"]
                assert after["prompt_ids"][:len(sent)] == sent
            # the trainer's sequence: the last prompt and its reply, the replies masked in
            last = steps[-1]
            assert traj["flat"] == last["prompt_ids"] + last["response_ids"]
            assert sum(traj["loss_mask"]) == sum(len(s["response_ids"]) for s in steps)
        # the first prompt is the template's own rendering; later ones are not re-rendered
        first = trajectories[0]["steps"][0]["prompt_ids"]
        assert tokenizer.decode(first, skip_special_tokens=False).startswith(
            "<|im_start|>system\n")
        # what was sampled: the server, given a turn's prompt ids again, samples them again
        for traj in rewritten[:4]:
            for step in traj["steps"][:2]:
                status, again = request(url, "/completion", {
                    "prompt": step["prompt_ids"], "n_predict": MAX_TOKENS, "temperature": 0,
                    "return_tokens": True, "cache_prompt": False, "logit_bias": bias})
                assert status == 200, again
                assert again["tokens"] == step["response_ids"]
