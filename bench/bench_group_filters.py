"""How full the batches are under the built-in group filter as a step's groups grow
(over-sampling), and how many groups it judges.

    python bench/bench_group_filters.py [--steps 40] [--groups 4 16 64 128] [--producers 1]

Sync mode, FrozenLake with the random policy (most of its groups of 4 fail together, so
`std_filter` with threshold 0 drops them), batches of 4 groups of 4 (`rollout_batch_size`
16), each row a run of its own with `num_env_groups` groups a step. Per row: batches that
came full, short, or not at all (`StepExhausted`: every group of the step filtered; the
trainer publishes and goes on), the mean groups a batch, and the groups judged a step (the
filtered ones from the batches' `scheduler/group_filter_count`, plus those handed out; a
step with no batch carries its count to the next batch, so the last skipped steps' counts
are not in it).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from consumer import Batcher  # noqa: E402
from rollstream.embedded import EmbeddedRedis  # noqa: E402
from rollstream.launcher import start_producers, stop_processes  # noqa: E402
from schemas.config import RolloutConfig  # noqa: E402
from schemas.errors import StepExhausted  # noqa: E402

GROUP_SIZE = 4
BATCH_GROUPS = 4


def config(groups: int) -> RolloutConfig:
    return RolloutConfig.from_dict({
        "rollout_batch_size": BATCH_GROUPS * GROUP_SIZE, "async_generation_ratio": 0,
        "seed": 3,
        "train_env_manager": {"num_env_groups": groups, "group_size": GROUP_SIZE,
                              "tags": ["FrozenLake"],
                              "group_filter_config": {"type": "std_filter"}}})


def run_row(url: str, groups: int, steps: int, producers: int) -> dict[str, float]:
    client = redis.Redis.from_url(url, socket_timeout=60)
    batcher = Batcher(client, config(groups), run=f"bench-filters-{uuid.uuid4().hex[:8]}")
    procs = start_producers(url, batcher.keys.run, producers, "WARNING")
    sizes: list[int] = []
    exhausted = 0
    filtered = 0.0
    started = time.perf_counter()
    try:
        for _ in range(steps):
            try:
                batch = batcher.get_batch("train", timeout_s=120)
            except StepExhausted:
                exhausted += 1
                batcher.publish_version()
                continue
            sizes.append(len(batch) // GROUP_SIZE)
            filtered += batch.metrics["scheduler/group_filter_count"]
            batcher.ack(batch)
            batcher.publish_version()
        took = time.perf_counter() - started
    finally:
        batcher.stop_run()
        stop_processes(procs)
        batcher.close()
        client.close()
    full = sum(1 for size in sizes if size == BATCH_GROUPS)
    return {"full": full, "short": len(sizes) - full, "none": exhausted,
            "mean": sum(sizes) / steps, "judged": (filtered + sum(sizes)) / steps,
            "seconds": took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 16, 64, 128])
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--redis-url", default=None, help="default: an embedded server")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # a short batch's warning each step: not here
    print(f"sync, random policy on FrozenLake, std_filter 0, batches of {BATCH_GROUPS} "
          f"groups of {GROUP_SIZE}, {args.steps} steps a row")
    print("| groups a step | full batches | short | none (`StepExhausted`) | groups a batch "
          "| judged a step | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with EmbeddedRedis() as server:
        url = args.redis_url or server.url
        for groups in args.groups:
            row = run_row(url, groups, args.steps, args.producers)
            print(f"| {groups} ({groups // BATCH_GROUPS}x) | {row['full']} | {row['short']} | "
                  f"{row['none']} | {row['mean']:.2f} | {row['judged']:.1f} | "
                  f"{row['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
