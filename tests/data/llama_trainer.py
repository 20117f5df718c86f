"""A trainer script for `rollstream up --trainer`, run by tests/test_llama_server_run.py
against a real llama-server: takes `STEPS` batches, and after the first one writes the file
`$LLAMA_RUN_DIR/first-batch` and waits for `$LLAMA_RUN_DIR/restarted` (the test restarts the
server meanwhile, while the producers generate). Writes what the batches held to
`$LLAMA_RUN_DIR/summary.json`."""

import json
import os
import sys
import time
from pathlib import Path

import redis

from consumer import Batcher
from schemas.config import RolloutConfig

steps = int(sys.argv[1])
folder = Path(os.environ["LLAMA_RUN_DIR"])
client = redis.Redis.from_url(os.environ["ROLLSTREAM_REDIS_URL"])
batcher = Batcher(client, RolloutConfig.from_yaml(os.environ["ROLLSTREAM_CONFIG"]),
                  run=os.environ["ROLLSTREAM_RUN"])
summary = {"batches": [], "traj_ids": [], "steps": [], "context_full": []}
for step in range(steps):
    batch = batcher.get_batch(timeout_s=120)
    summary["batches"].append(len(batch))
    for traj in batch.trajectories:
        summary["traj_ids"].append(traj["traj_id"])
        if "context_full" in traj:
            summary["context_full"].append(traj["context_full"])
        for s in traj["steps"]:
            summary["steps"].append({
                "prompt_ids": None if s.get("prompt_ids") is None else len(s["prompt_ids"]),
                "response_ids": None if s.get("response_ids") is None
                else [int(i) for i in s["response_ids"]],
                "logprobs": None if s.get("logprobs") is None else len(s["logprobs"]),
                "response": s["response"], "finish_reason": s.get("finish_reason"),
                "version": s["version"], "server": s.get("server")})
    batcher.ack(batch)
    batcher.publish_version()
    if step == 0:
        (folder / "first-batch").write_text("1")
        deadline = time.monotonic() + 120
        while not (folder / "restarted").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
summary["failed_groups"] = batcher.totals.get("scheduler/failed_groups", 0)
(folder / "summary.json").write_text(json.dumps(summary))
batcher.stop_run()
