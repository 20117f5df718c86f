"""Producers that scale: throughput against the number of producers, one producer holding
many envs, and Redis memory per trajectory waiting in the streams.

    python bench/bench_scale.py [--seconds 15] [--counts 1,2,4,8] [--big-envs 16384]

1. Trajectories/s delivered against 1, 2, 4, 8 producer processes: 4096 FrozenLake envs
   (512 groups x 8, 64 per shard), the random policy with a model latency (`latency_s *
   exp(latency_sigma * z)` per action), async ratio 2, batches of 2048 (the first half of the
   groups to finish). Producers waiting on a model scale out until the CPUs are busy.
2. One producer holding `--big-envs` envs with the same latency policy: its memory per env
   (RSS growth over an idle producer) and its event loop's lag (how late a 10 ms timer fires:
   p50/p99, what every env of the producer waits on top of its own work).
3. Redis memory per trajectory waiting in the streams (not yet read by a trainer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import redis  # noqa: E402
from bench_pipeline import delete_run  # noqa: E402

from consumer import Batcher  # noqa: E402
from producers.producer import Producer  # noqa: E402
from rollstream.embedded import EmbeddedRedis  # noqa: E402
from rollstream.launcher import start_producers, stop_processes  # noqa: E402
from schemas.config import RolloutConfig  # noqa: E402


def make_config(envs: int, args: argparse.Namespace, batch: int | None = None,
                ratio: int = 1) -> RolloutConfig:
    groups = envs // 8
    return RolloutConfig.from_dict({
        "rollout_batch_size": batch or envs, "async_generation_ratio": ratio, "seed": 42,
        "lease_ttl_s": 30,
        "train_env_manager": {"max_env_num_per_worker": 64, "num_env_groups": groups,
                              "group_size": 8, "tags": ["FrozenLake"]},
        "policy": {"type": "random", "latency_s": args.latency_s,
                   "latency_sigma": args.latency_sigma},
    })


def throughput(url: str, producers: int, args: argparse.Namespace) -> float:
    # batches of half the envs, ratio 2: the trainer never waits on the slowest episode of
    # all the envs, so what is measured is how fast the producers play
    config = make_config(args.envs, args, batch=args.envs // 2, ratio=2)
    run = f"bench-scale-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url, socket_timeout=60)
    batcher = Batcher(client, config, run=run)
    procs = start_producers(url, run, producers, "WARNING")
    try:
        for _ in range(2):  # warm up: producers started and sharing the shards
            batcher.ack(batch := batcher.get_batch("train", timeout_s=300))
            batcher.publish_version()
        delivered = 0
        started = time.perf_counter()
        while delivered == 0 or time.perf_counter() - started < args.seconds:  # >= 1 batch
            batch = batcher.get_batch("train", timeout_s=300)
            delivered += len(batch)
            batcher.ack(batch)
            batcher.publish_version()
        return delivered / (time.perf_counter() - started)
    finally:
        batcher.stop_run()
        stop_processes(procs)
        delete_run(client, run)
        client.close()


class LagProducer(Producer):
    """A producer that also measures its event loop's lag (bench only). It runs `seconds`
    and, however short that is, until it has committed a trajectory and taken `MIN_LAGS`
    lag samples (what the report needs)."""

    MIN_LAGS = 8  # the report drops the first quarter
    lags_ms: list[float]

    def __init__(self, redis_url: str, run: str, seconds: float) -> None:
        super().__init__(redis_url, run, handle_signals=False)
        self.run_s = seconds
        self.until = 0.0

    def run(self) -> int:
        self.until = time.monotonic() + self.run_s  # from here, as `Producer(seconds=)` counts
        return super().run()

    async def _serve(self, redis, config):  # type: ignore[no-untyped-def, override]
        self.lags_ms = []
        monitor = asyncio.create_task(self._monitor())
        try:
            await super()._serve(redis, config)
        finally:
            monitor.cancel()

    async def _monitor(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            self.lags_ms.append((loop.time() - due) * 1000)
            if (time.monotonic() >= self.until and self.committed
                    and len(self.lags_ms) >= self.MIN_LAGS):
                self.request_stop()


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def big_producer_child(url: str, run: str, seconds: float) -> None:
    """Runs in a child process: one producer, reports lag and memory as one JSON line."""
    idle_mb = rss_mb()
    producer = LagProducer(url, run, seconds)
    producer.run()
    lags = producer.lags_ms[len(producer.lags_ms) // 4:]  # once every env is running
    print(json.dumps({"idle_mb": idle_mb, "peak_mb": _peak_rss_mb(),
                      "lag_p50_ms": float(np.percentile(lags, 50)),
                      "lag_p99_ms": float(np.percentile(lags, 99)),
                      "committed": producer.committed}))


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def big_producer(url: str, args: argparse.Namespace) -> dict[str, float]:
    config = make_config(args.big_envs, args)
    run = f"bench-big-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url, socket_timeout=60)
    batcher = Batcher(client, config, run=run)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, __file__, "--child", url, run,
                              str(args.seconds * 2)], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        deadline = time.monotonic() + args.seconds * 2 + 60
        while child.poll() is None and time.monotonic() < deadline:
            try:  # short waits: the child's end is seen within a second, not a 5 s wait
                batch = batcher.get_batch("train", timeout_s=1)
                batcher.ack(batch)
                batcher.publish_version()
            except Exception:  # noqa: BLE001 - the child decides when the run ends
                pass
        out, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
        delete_run(client, run)
        client.close()
    report: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    report["kb_per_env"] = (report["peak_mb"] - report["idle_mb"]) * 1024 / args.big_envs
    return report


def redis_memory_per_trajectory(url: str, args: argparse.Namespace) -> tuple[float, int]:
    """Let producers fill the streams with nobody reading: bytes of Redis memory per
    trajectory waiting there."""
    config = make_config(args.envs, args, batch=args.envs)
    run = f"bench-mem-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url, socket_timeout=60)
    Batcher(client, config, run=run)
    before = int(client.info("memory")["used_memory"])
    procs = start_producers(url, run, 2, "WARNING")
    try:
        streams = [f"{{{run}}}:traj:train:{g}" for g in range(args.envs // 8)]
        entries = 0
        deadline = time.monotonic() + args.seconds * 2
        give_up = deadline + 300
        # async 1: 2 episodes per env; past the deadline only until the first entries land
        while entries < args.envs * 2 - 192 and (time.monotonic() < deadline or not entries):
            if time.monotonic() > give_up:
                raise SystemExit("the producers committed nothing")
            time.sleep(0.5)
            pipe = client.pipeline(transaction=False)
            for stream in streams:
                pipe.xlen(stream)
            entries = sum(pipe.execute())
        used = int(client.info("memory")["used_memory"]) - before
    finally:
        stop_processes(procs)
        delete_run(client, run)
        client.close()
    return used / max(1, entries), entries


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        big_producer_child(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0,
                        help="throughput time per producer count (at least one batch); twice "
                             "it: the big producer's run (at least until it committed) and the "
                             "most the streams fill (at least until the first entries)")
    parser.add_argument("--counts", default="1,2,4,8", help="producer counts to measure")
    parser.add_argument("--big-envs", type=int, default=16384)
    parser.add_argument("--envs", type=int, default=4096,
                        help="envs of parts 1 and 3 (a multiple of 64; the tests: few)")
    parser.add_argument("--latency-s", type=float, default=0.05)
    parser.add_argument("--latency-sigma", type=float, default=1.0)
    parser.add_argument("--redis-url", default=None, help="default: an embedded server")
    args = parser.parse_args()
    with EmbeddedRedis() as server:
        url = args.redis_url or server.url
        print(f"random policy, latency {args.latency_s} s x exp({args.latency_sigma} z) per "
              f"action, FrozenLake, {os.cpu_count()} CPUs; throughput: async ratio 2, batches "
              f"of {args.envs // 2}")
        base = None
        for count in [int(c) for c in args.counts.split(",") if c]:
            rate = throughput(url, count, args)
            base = base or rate
            print(f"  {args.envs} envs, {count} producer(s): {rate:8.0f} traj/s  "
                  f"({rate / base:.2f}x one producer)", flush=True)
        big = big_producer(url, args)
        print(f"  one producer, {args.big_envs} envs: {big['kb_per_env']:.1f} KB per env "
              f"(RSS {big['idle_mb']:.0f} -> {big['peak_mb']:.0f} MB), event-loop lag p50 "
              f"{big['lag_p50_ms']:.1f} ms, p99 {big['lag_p99_ms']:.1f} ms, "
              f"{big['committed']} committed", flush=True)
        per_traj, entries = redis_memory_per_trajectory(url, args)
        print(f"  Redis memory per trajectory waiting in the streams: {per_traj:.0f} bytes "
              f"({entries} entries)")


if __name__ == "__main__":
    main()
