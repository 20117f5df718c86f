"""A trainer script for `rollstream up --trainer`, run by tests/test_llama_server_tito.py
against a real llama-server with `policy.tokenizer` set: takes `STEPS` batches and writes
every step's ids, and what `trajectory_tokens()` made of them, to
`$LLAMA_RUN_DIR/summary.json`."""

import json
import os
import sys
from pathlib import Path

import redis

from consumer import Batcher
from schemas.config import RolloutConfig

steps = int(sys.argv[1])
folder = Path(os.environ["LLAMA_RUN_DIR"])
client = redis.Redis.from_url(os.environ["ROLLSTREAM_REDIS_URL"])
batcher = Batcher(client, RolloutConfig.from_yaml(os.environ["ROLLSTREAM_CONFIG"]),
                  run=os.environ["ROLLSTREAM_RUN"])
summary = {"trajectories": [], "non_extending": 0}


def ids(value):
    return None if value is None else [int(i) for i in value]


for _ in range(steps):
    batch = batcher.get_batch(timeout_s=120)
    tokens = batch.trajectory_tokens()
    summary["non_extending"] += tokens.non_extending
    rows = {int(t): m for m, t in enumerate(tokens.traj_index)}
    for i, traj in enumerate(batch.trajectories):
        m = rows.get(i)
        summary["trajectories"].append({
            "flat": None if m is None else ids(tokens.input_ids[m][:int(tokens.lengths[m])]),
            "loss_mask": None if m is None
            else ids(tokens.loss_mask[m][:int(tokens.lengths[m])]),
            "steps": [{"prompt_ids": ids(s.get("prompt_ids")),
                       "response_ids": ids(s.get("response_ids")),
                       "logprobs": None if s.get("logprobs") is None else len(s["logprobs"]),
                       "source": s.get("response_ids_source"),
                       "finish_reason": s.get("finish_reason"), "response": s["response"]}
                      for s in traj["steps"]]})
    batcher.ack(batch)
    batcher.publish_version()
(folder / "summary.json").write_text(json.dumps(summary))
batcher.stop_run()
