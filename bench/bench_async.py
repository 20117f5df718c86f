"""What async rollout pays against the most it could pay.

    python bench/bench_async.py [--steps 8] [--table] [--producers 2]

Producers play FrozenLake with the random policy and a heavy-tailed model latency
(`latency_s * exp(latency_sigma * z)` per action); a stand-in trainer "trains" for T seconds
per step. The same number of steps runs in sync mode and with `async_generation_ratio` r.

- `R_sync`: a sync step's rollout wait (the mean get_batch wait with T = 0);
- `R_free`: batch size over the free-running throughput (ratio 4, T = 0: producers never
  wait on the trainer);
- the bound on the speedup: `(R_sync + T) / max(T, R_free)` (sync pays rollout plus training
  per step; async at best pays the longer of the two);
- the speedup: sync wall time over async wall time, for the same steps.

Default: one row at T = R_sync, r = 1, a batch of every train env. `--table`: T in
{0.5, 1, 2} x R_sync, r in {1, 2}, for a batch of every train env and of half of them. Each
row's sync and async runs go back to back (this machine's speed drifts).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
from bench_pipeline import delete_run  # noqa: E402

from consumer import Batcher  # noqa: E402
from rollstream.embedded import EmbeddedRedis  # noqa: E402
from rollstream.launcher import start_producers, stop_processes  # noqa: E402
from schemas.config import RolloutConfig  # noqa: E402


@dataclass
class Run:
    wall_s: float  # the timed steps, from the first batch (warm-up) to the last
    waits_s: list[float]
    staleness_max: int
    stale_dropped: float


def make_config(args: argparse.Namespace, ratio: int, batch: int) -> RolloutConfig:
    return RolloutConfig.from_dict({
        "rollout_batch_size": batch, "async_generation_ratio": ratio, "seed": 42,
        "train_env_manager": {"max_env_num_per_worker": args.envs_per_shard,
                              "num_env_groups": args.groups, "group_size": args.group_size,
                              "tags": ["FrozenLake"]},
        "policy": {"type": "random", "latency_s": args.latency_s,
                   "latency_sigma": args.latency_sigma},
    })


def run_steps(url: str, config: RolloutConfig, args: argparse.Namespace, train_s: float,
              steps: int) -> Run:
    """Producers for a fresh run, one warm-up batch, then `steps` timed trainer steps."""
    name = f"bench-async-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url, socket_timeout=60)
    batcher = Batcher(client, config, run=name)
    procs = start_producers(url, name, args.producers, "WARNING")
    try:
        return timed_steps(batcher, steps, lambda: time.sleep(train_s) if train_s else None)
    finally:
        batcher.stop_run()
        stop_processes(procs)
        delete_run(client, name)
        client.close()


def timed_steps(batcher: Any, steps: int, train: Callable[[], None],
                clock: Callable[[], float] = time.perf_counter) -> Run:
    """`steps` trainer steps, each the stand-in update on the batch in hand (`train`), its
    ack and version publish, then the wait for the next batch. The clock runs from the first
    batch (the producers' warm-up is not timed) to the last: `steps` updates and `steps`
    rollout waits, what the bound `(R_sync + T) / max(T, R_free)` counts per step. The last
    batch is acked untrained."""
    batch = batcher.get_batch("train", timeout_s=120)
    started = clock()
    waits: list[float] = []
    staleness = 0
    dropped = 0.0
    for _ in range(steps):
        train()
        batcher.ack(batch)
        batcher.publish_version()
        batch = batcher.get_batch("train", timeout_s=120)
        waits.append(batch.metrics["time/get_batch_cost"])
        staleness = max(staleness, int(batch.metrics["scheduler/staleness/max"]))
        dropped += batch.metrics["scheduler/stale_dropped"]
    wall = clock() - started
    batcher.ack(batch)
    return Run(wall, waits, staleness, dropped)


def calibrate(url: str, args: argparse.Namespace, batch: int) -> tuple[float, float]:
    """(R_sync, R_free) for this batch size."""
    sync = run_steps(url, make_config(args, 0, batch), args, 0.0, args.steps)
    free = run_steps(url, make_config(args, 4, batch), args, 0.0, args.steps)
    r_sync = statistics.mean(sync.waits_s)
    r_free = free.wall_s / args.steps  # batch / throughput, with nothing waiting on training
    return r_sync, r_free


def row(url: str, args: argparse.Namespace, batch: int, ratio: int, train_s: float,
        r_sync: float, r_free: float) -> str:
    sync = run_steps(url, make_config(args, 0, batch), args, train_s, args.steps)
    fast = run_steps(url, make_config(args, ratio, batch), args, train_s, args.steps)
    speedup = sync.wall_s / fast.wall_s
    bound = (r_sync + train_s) / max(train_s, r_free)
    return (f"| {batch} | {ratio} | {train_s:.2f} ({train_s / r_sync:.1f}x R_sync) | "
            f"{sync.wall_s:.2f} | {fast.wall_s:.2f} | {speedup:.2f}x | {bound:.2f}x | "
            f"{speedup / bound:.2f} | {fast.staleness_max} | {int(fast.stale_dropped)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--envs-per-shard", type=int, default=32)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--latency-s", type=float, default=0.02)
    parser.add_argument("--latency-sigma", type=float, default=1.0)
    parser.add_argument("--table", action="store_true",
                        help="T in {0.5, 1, 2} x R_sync, ratio in {1, 2}, full and half batch")
    parser.add_argument("--redis-url", default=None, help="default: an embedded server")
    args = parser.parse_args()

    envs = args.groups * args.group_size
    batches = [envs, envs // 2] if args.table else [envs]
    with EmbeddedRedis() if args.redis_url is None else _given(args.redis_url) as server:
        url = server.url
        print(f"FrozenLake, {args.groups} groups x {args.group_size}, latency "
              f"{args.latency_s} s x exp({args.latency_sigma} z) per action, {args.producers} "
              f"producer(s), {args.steps} timed steps per run")
        print("| batch | ratio | T s | sync wall s | async wall s | speedup | bound | "
              "speedup/bound | staleness max | stale dropped |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for batch in batches:
            r_sync, r_free = calibrate(url, args, batch)
            print(f"| {batch} | R_sync {r_sync:.2f} s, R_free {r_free:.2f} s | | | | | | | | |",
                  flush=True)
            ratios = [1, 2] if args.table else [1]
            factors = [0.5, 1.0, 2.0] if args.table else [1.0]
            for ratio in ratios:
                for factor in factors:
                    print(row(url, args, batch, ratio, factor * r_sync, r_sync, r_free),
                          flush=True)


class _given:
    """A Redis URL given on the command line, as a context manager like EmbeddedRedis."""

    def __init__(self, url: str):
        self.url = url

    def __enter__(self) -> _given:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


if __name__ == "__main__":
    main()
