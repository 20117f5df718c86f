"""`rollstream up` against a real llama.cpp `llama-server` serving the tiny generated model,
end to end: the producers' model check, turns whose token ids come from the server's logprob
entries (decoded with the model's own tokenizer they give the reply), logprobs, episodes that
outgrow `-c` ending truncated (`context_full`, naming `n_ctx`), and the server stopped and
started again while the producers generate: no trajectory lost or doubled.

Skips without the binary (scripts/build_llama_server.sh), fails instead when
ROLLSTREAM_REQUIRE_REAL_SERVERS=1 (CI).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, clean_env
from real_servers import (
    free_port,
    llama_server_argv,
    llama_server_binary,
    load_tiny_model_script,
    running,
)

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

N_CTX = 768  # the first FrozenLake prompt is ~320 tokens of the tiny model, each turn ~130:
# episodes reach the end of the context at their third or fourth turn
MAX_TOKENS = 32
STEPS = 3
BATCH = 8  # two groups of four: the server has one slot, so each turn waits its turn


def run_config(base_url: str) -> dict:
    return {
        "rollout_batch_size": BATCH, "async_generation_ratio": 1, "seed": 3,
        "train_env_manager": {"max_env_num_per_worker": 8, "num_env_groups": BATCH // 4,
                              "group_size": 4, "tags": ["FrozenLake"]},
        "val_env_manager": None,
        "policy": {"type": "openai", "base_urls": [f"{base_url}/v1"], "model": "tiny",
                   "max_tokens": MAX_TOKENS, "temperature": 1.0, "timeout_s": 60,
                   "max_retries": 2},
    }


@pytest.mark.slow
def test_up_against_a_real_llama_server_restarted_mid_run(tmp_path: Path) -> None:
    binary = llama_server_binary()
    model = tmp_path / "model"
    model.mkdir()
    load_tiny_model_script().generate(model, seed=0)
    tokenizer = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = llama_server_argv(binary, model / "tiny.gguf", port, n_ctx=N_CTX)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(url)))
    trainer = f"{ROOT / 'tests' / 'data' / 'llama_trainer.py'} {STEPS}"
    env = {**clean_env(), "LLAMA_RUN_DIR": str(tmp_path)}
    with running(argv, url, tmp_path / "server-1.log") as server:
        up = subprocess.Popen(
            [sys.executable, "-m", "rollstream", "--log-level", "WARNING", "up", "--config",
             str(config), "--run", "llama-run", "--producers", "1", "--trainer", trainer],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        down = threading.Event()

        def read() -> None:  # up's output as it comes: the producer's line that the server
            assert up.stdout is not None  # is down is what the restart waits for
            for line in up.stdout:
                lines.append(line)
                if "model server" in line and "is down" in line:
                    down.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 240
            while not (tmp_path / "first-batch").exists():
                assert up.poll() is None, "".join(lines)
                assert time.monotonic() < deadline, "no first batch"
                time.sleep(0.1)
            server.kill()  # while the producers generate (async): their requests fail
            server.wait(10)
            assert down.wait(120), "".join(lines)  # a request failed: the restart was seen
            with running(argv, url, tmp_path / "server-2.log"):
                (tmp_path / "restarted").write_text("1")
                up.wait(timeout=300)
        finally:
            if up.poll() is None:
                up.kill()
                up.wait()
            reader.join(30)
    out = "".join(lines)
    assert up.returncode == 0, out
    assert "Traceback" not in out
    summary = json.loads((tmp_path / "summary.json").read_text())

    # nothing lost, nothing doubled, across the restart
    assert summary["batches"] == [BATCH] * STEPS
    assert len(set(summary["traj_ids"])) == len(summary["traj_ids"]) == BATCH * STEPS
    assert summary["failed_groups"] == 0

    # what llama-server gives: ids in the logprob entries, logprobs, no prompt ids; a reply
    # whose character was split across tokens has merged entries: no ids or logprobs then
    steps = summary["steps"]
    with_ids = [step for step in steps if step["response_ids"] is not None]
    assert with_ids, "no turn carried ids"
    for step in steps:
        assert step["prompt_ids"] is None
        assert step["finish_reason"] in ("length", "stop") and step["server"] == f"{url}/v1"
        if step["response_ids"] is None:
            assert step["logprobs"] is None
            continue
        assert len(step["response_ids"]) == step["logprobs"]
        assert step["finish_reason"] == "stop" or step["logprobs"] == MAX_TOKENS
        assert tokenizer.decode(step["response_ids"], skip_special_tokens=True) == \
            step["response"]
    if len(with_ids) < len(steps):
        assert out.count("logprob entries for") == 1  # said once
    # episodes outgrew -c: ended truncated, with the server's own setting named
    assert summary["context_full"], "no episode reached the context's end"
    assert all("-c / --ctx-size (n_ctx)" in why for why in summary["context_full"])
    assert any("cut the turn to fit its context window" in why or
               "exceeds the available context size" in why for why in summary["context_full"])
    assert "returns no token ids" not in out
