"""Hand-off latency: from the moment the last trajectory a batch needs lands in Redis to
`get_batch` returning it.

    python bench/bench_handoff.py [--batches 40] [--producers 2] [--ratio 0]

The seed's train block (128 groups x 8 FrozenLake envs, batches of 1024), random policy,
producer processes and an embedded Redis. For each batch: the newest entry id among the
batch's entries is the Redis server's clock (ms) when its last trajectory was XADDed; right
after `get_batch` returns, the trainer reads the server's clock (`TIME`, us). The difference
is the hand-off: the blocking read waking up, decoding and grouping what arrived last, the
hand-out's Redis write. Entry ids have millisecond resolution, so each figure is good to
about 1 ms. Sync mode (the default) makes every batch complete at once when its last group
lands, which is the hand-off a sync trainer waits for.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import redis  # noqa: E402

from consumer import Batcher  # noqa: E402
from rollstream.embedded import EmbeddedRedis  # noqa: E402
from rollstream.launcher import start_producers, stop_processes  # noqa: E402
from schemas.config import RolloutConfig  # noqa: E402


def handoff_ms(client: redis.Redis, batch) -> float:  # type: ignore[no-untyped-def]
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros / 1000
    landed_ms = max(int(entry.entry_id.split("-")[0]) for entry in batch.entries)
    return now_ms - landed_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--warmup-batches", type=int, default=2,
                        help="batches first, not counted (they include the producers' start)")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--ratio", type=int, default=0, help="async_generation_ratio")
    parser.add_argument("--redis-url", default=None, help="default: an embedded server")
    args = parser.parse_args()
    config = RolloutConfig.from_dict({
        "rollout_batch_size": 1024, "async_generation_ratio": args.ratio, "seed": 42,
        "train_env_manager": {"max_env_num_per_worker": 16, "num_env_groups": 128,
                              "group_size": 8, "tags": ["FrozenLake"]},
    })
    run = f"bench-handoff-{uuid.uuid4().hex[:8]}"
    with EmbeddedRedis() as server:
        url = args.redis_url or server.url
        client = redis.Redis.from_url(url, socket_timeout=60)
        batcher = Batcher(client, config, run=run)
        procs = start_producers(url, run, args.producers, "WARNING")
        figures: list[float] = []
        try:
            for step in range(args.warmup_batches + args.batches):
                batch = batcher.get_batch("train", timeout_s=120)
                if step >= args.warmup_batches:
                    figures.append(handoff_ms(client, batch))
                batcher.ack(batch)
                batcher.publish_version()
        finally:
            batcher.stop_run()
            stop_processes(procs)
            client.close()
    mode = "sync" if args.ratio == 0 else f"async ratio {args.ratio}"
    print(f"hand-off, batch 1024, {mode}, {args.producers} producers, {len(figures)} batches: "
          f"p50 {np.percentile(figures, 50):.1f} ms, p99 {np.percentile(figures, 99):.1f} ms, "
          f"max {max(figures):.1f} ms")


if __name__ == "__main__":
    started = time.monotonic()
    main()
