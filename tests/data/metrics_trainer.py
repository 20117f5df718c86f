"""A trainer script for `rollstream up --trainer ... --metrics-port P`: serves its Batcher's
metrics with the one line a user adds, takes one batch, then prints what its own page and
the first producer's page (P+1) say."""

import os
import time
import urllib.request

import redis

from consumer import Batcher
from schemas.config import RolloutConfig

port = int(os.environ["ROLLSTREAM_METRICS_PORT"])
config = RolloutConfig.from_yaml(os.environ["ROLLSTREAM_CONFIG"])
client = redis.Redis.from_url(os.environ["ROLLSTREAM_REDIS_URL"], socket_timeout=30)
batcher = Batcher(client, config, run=os.environ["ROLLSTREAM_RUN"])
page = batcher.serve_metrics(port, "127.0.0.1")  # the one line
batcher.ack(batcher.get_batch("train", timeout_s=60))


def read(url: str) -> str:
    for _ in range(100):
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return reply.read().decode()
        except OSError:
            time.sleep(0.1)
    return ""


for line in (read(f"http://127.0.0.1:{port}/metrics")
             + read(f"http://127.0.0.1:{port + 1}/metrics")).splitlines():
    if line.startswith(("rollstream_trajectories_delivered_total",
                        "rollstream_shards_held")):
        print(line)
page.close()
batcher.stop_run()
