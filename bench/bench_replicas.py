"""What `min_replicas: 1` costs: the same work against a primary with one replica, with and
without the WAIT for it.

    python bench/bench_replicas.py [--seconds 16] [--repeat 2] [--producers 2] [--commits 2000]

Starts a redis-server primary and one replica on loopback (the redis-server on PATH; both
stopped at the end), then:
- commit round trip: one producer's commits awaited one after another, one trajectory per
  flush (the worst case for WAIT: nothing shares its round trip), p50/p99 per commit;
- pipeline: bench_pipeline's whole pipeline (seed train block, 1024-trajectory batches,
  async ratio 1), rounds alternating min_replicas 0 and 1 on the same servers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import redis
from bench_pipeline import bench_config, pipeline

from producers.commit import Committer
from rollstream.embedded import find_redis_server, spawn
from schemas.backoff import Backoff
from schemas.keys import Keys
from schemas.redisconn import ReplicaWait, async_client


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def primary_with_replica() -> Iterator[str]:
    """A primary and one replica in sync on loopback; yields the primary's URL."""
    binary = find_redis_server()
    folder = tempfile.mkdtemp(prefix="rollstream-bench-")
    procs: list[subprocess.Popen] = []
    try:
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            extra = ["--replicaof", "127.0.0.1", str(ports[0])] if i else []
            path = os.path.join(folder, str(port))
            os.makedirs(path)
            procs.append(spawn([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", path,
                                "--save", "", "--appendonly", "no",
                                "--repl-diskless-sync-delay", "0", *extra],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        client = redis.Redis(port=ports[0], socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                client.set("ready", 1)
                if client.execute_command("WAIT", 1, 100) == 1:
                    break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise SystemExit("the replica did not get in sync")
        client.close()
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


async def commit_round_trips(url: str, replicas: int, commits: int) -> list[float]:
    """Seconds per commit, one trajectory per flush, each awaited before the next."""
    client = await async_client(url, socket_timeout=10)
    keys = Keys(f"bench-commit-{os.getpid()}-{replicas}")
    await client.set(keys.lease("train", 0), "bench")
    committer = Committer(client, keys, "bench",
                          replicas=ReplicaWait(client, keys, replicas, 1000))
    stop = asyncio.Event()
    runner = asyncio.create_task(committer.run(stop, Backoff(name="bench")))
    data = os.urandom(1500)  # about one FrozenLake trajectory
    times = []
    for k in range(commits):
        started = time.perf_counter()
        await committer.commit(mode="train", shard=0, round=0, env_id=0, episode_id=k,
                               stream=keys.stream("train", 0), data=data)
        times.append(time.perf_counter() - started)
    stop.set()
    await runner
    await client.delete(*[key async for key in client.scan_iter(match=keys.pattern())])
    await client.aclose()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=16.0, help="pipeline time per round")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each setting")
    parser.add_argument("--producers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--warmup-batches", type=int, default=2)
    args = parser.parse_args()
    with primary_with_replica() as url:
        print(f"primary {url} with one replica (loopback)")
        for replicas in (0, 1, 0, 1):
            times = asyncio.run(commit_round_trips(url, replicas, args.commits))
            print(f"commit round trip, min_replicas {replicas}: p50 "
                  f"{np.percentile(times, 50) * 1e3:.3f} ms  p99 "
                  f"{np.percentile(times, 99) * 1e3:.3f} ms  ({args.commits} commits)",
                  flush=True)
        figures: dict[int, list[float]] = {0: [], 1: []}
        for _ in range(args.repeat):
            for replicas in (0, 1):
                config = bench_config(1, 0.0).model_copy(update={"min_replicas": replicas})
                result = pipeline(config, url, args.producers, args.seconds,
                                  args.warmup_batches)
                figures[replicas].append(result["traj_s"])
                print(f"pipeline, min_replicas {replicas}: {result['traj_s']:.0f} traj/s, "
                      f"batch wait p50 {result['wait_p50'] * 1000:.0f} ms, commit->trainer "
                      f"p50 {result['lat_p50'] * 1000:.0f} ms p99 "
                      f"{result['lat_p99'] * 1000:.0f} ms, redis CPU "
                      f"{result['cpu_redis']:.3f} s per 1000 trajectories", flush=True)
        zero, one = np.median(figures[0]), np.median(figures[1])
        print(f"median pipeline: min_replicas 0 {zero:.0f} traj/s, min_replicas 1 {one:.0f} "
              f"traj/s ({(one / zero - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
