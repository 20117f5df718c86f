"""LLM turns through the pipeline: one producer process drives 1024 FrozenLake envs with the
openai policy against the stand-in server, and the CPU each turn costs the producer.

    python bench/bench_llm.py [--seconds 20] [--latency-s 1.0] [--latency-sigma 0.5]
                              [--redis-url URL] [--compare-clients]

The seed's train block (128 groups x 8 FrozenLake envs, batches of 1024, async ratio 1), one
`rollstream produce` process, a `rollstream fake-llm` process answering after a lognormal
latency (median `--latency-s`), an embedded Redis and a trainer that acks and publishes at
once. Printed: turns/s, the producer's CPU per turn (its user + system time over the turns the
server answered meanwhile: prompt building, HTTP, JSON, env steps, commits), the server's
and the trainer's, and the peak of requests in flight. Server, producer and Redis share this
machine's cores, so turns/s depends on the machine; CPU per turn is what transfers.

`--compare-clients`: the bare HTTP clients (aiohttp, httpx) posting the same chat request
with 1,000 and 100 in flight, CPU per request of this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import redis
from bench_pipeline import delete_run

from consumer import Batcher
from rollstream.embedded import EmbeddedRedis
from rollstream.launcher import start_producers, stop_processes
from schemas.config import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]
MODEL = "fake-model"
SEED_BLOCK = {
    "max_env_num_per_worker": 16, "num_env_groups": 128, "group_size": 8,
    "tags": ["FrozenLake"], "num_groups_partition": [128],
}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """A `rollstream fake-llm` process on a free port; (process, base URL)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "fake-llm", "--port", "0",
         "--latency-s", str(args.latency_s), "--latency-sigma", str(args.latency_sigma),
         "--p-good", "0.8"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("fake-llm: serving"):
        proc.kill()
        raise SystemExit(f"the stand-in server did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


def server_stats(base_url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/admin/stats") as resp:
        return json.loads(resp.read())


def bench_config(base_url: str, groups: int = 128) -> RolloutConfig:
    return RolloutConfig.from_dict({
        "rollout_batch_size": groups * 8, "async_generation_ratio": 1, "seed": 42,
        "train_env_manager": {**SEED_BLOCK, "num_env_groups": groups,
                              "num_groups_partition": [groups]},
        "policy": {"type": "openai", "base_urls": [base_url], "model": MODEL,
                   "max_tokens": 128, "max_inflight": 1024, "timeout_s": 120},
    })


def pipeline(args: argparse.Namespace, url: str) -> None:
    server, base_url = start_server(args)
    client = redis.Redis.from_url(url, socket_timeout=60)
    run = f"bench-llm-{os.getpid()}"
    batcher = Batcher(client, bench_config(base_url, args.groups), run=run)
    procs = start_producers(url, run, 1, "WARNING")
    producer = procs[0]
    try:
        for _ in range(args.warmup_batches):
            batcher.ack(batch := batcher.get_batch("train", timeout_s=300))
            batcher.publish_version()
        stats0 = server_stats(base_url)
        cpu0 = (cpu_s(producer.pid), cpu_s(server.pid), time.process_time())
        started = time.perf_counter()
        trajs = 0
        while trajs == 0 or time.perf_counter() - started < args.seconds:  # >= 1 batch
            batch = batcher.get_batch("train", timeout_s=300)
            trajs += len(batch)
            batcher.ack(batch)
            batcher.publish_version()
        elapsed = time.perf_counter() - started
        stats = server_stats(base_url)
        turns = max(1, stats.get("completed", 0) - stats0.get("completed", 0))
        producer_ms = (cpu_s(producer.pid) - cpu0[0]) / turns * 1000
        server_ms = (cpu_s(server.pid) - cpu0[1]) / turns * 1000
        trainer_ms = (time.process_time() - cpu0[2]) / turns * 1000
        tokens = batch.turn_tokens()
        print(f"openai policy, 1 producer, {args.groups * 8} envs, server latency median "
              f"{args.latency_s}s sigma {args.latency_sigma}: {turns / elapsed:.0f} turns/s, "
              f"{trajs / elapsed:.0f} traj/s delivered over {elapsed:.1f}s")
        print(f"  CPU per turn: producer {producer_ms:.3f} ms, stand-in server "
              f"{server_ms:.3f} ms, trainer (batcher) {trainer_ms:.3f} ms")
        print(f"  requests in flight at the server: peak {stats.get('max_in_flight', 0)}; "
              f"last batch {len(tokens)} turns, prompt p50 "
              f"{int(sorted(tokens.prompt_lengths)[len(tokens) // 2])} tokens, "
              f"response p50 {int(sorted(tokens.response_lengths)[len(tokens) // 2])} tokens",
              flush=True)
    finally:
        batcher.stop_run()
        stop_processes(procs)
        server.terminate()
        server.wait(10)
        delete_run(client, run)
        client.close()


# -- bare clients ----------------------------------------------------------------------------
def chat_body(seed: int) -> bytes:
    from producers.envs import make_env

    env = make_env("rollstream/FrozenLake-v0", {"is_slippery": False, "max_steps": 10})
    obs, _ = env.reset(seed=seed)
    return json.dumps({"model": MODEL, "messages": [
        {"role": "system", "content": "You play.\n" + env.unwrapped.instruction},
        {"role": "user", "content": f"Turn 1:\nState:\n{obs}\nYour next action:"}],
        "logprobs": True, "return_token_ids": True, "seed": seed}).encode()


async def bare_client(kind: str, url: str, requests: int, inflight: int) -> tuple[float, float]:
    """(requests/s, ms of this process's CPU per request) of a bare client."""
    bodies = [chat_body(i) for i in range(64)]
    slots = asyncio.Semaphore(inflight)
    headers = {"Content-Type": "application/json"}
    if kind == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=inflight),
            timeout=aiohttp.ClientTimeout(total=300), cookie_jar=aiohttp.DummyCookieJar())

        async def post(body: bytes) -> Any:
            async with slots, session.post(url, data=body, headers=headers) as resp:
                return json.loads(await resp.read())
    else:
        import httpx

        session = httpx.AsyncClient(limits=httpx.Limits(max_connections=inflight,
                                                        max_keepalive_connections=inflight),
                                    timeout=300)

        async def post(body: bytes) -> Any:
            async with slots:
                return json.loads((await session.post(url, content=body,
                                                      headers=headers)).content)
    try:
        await asyncio.gather(*(post(bodies[i % 64]) for i in range(min(requests, inflight))))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(post(bodies[i % 64]) for i in range(requests)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        await (session.close() if kind == "aiohttp" else session.aclose())  # type: ignore
    return requests / wall, cpu / requests * 1000


def compare_clients(args: argparse.Namespace) -> None:
    import gc

    server, base_url = start_server(args)
    try:
        url = f"{base_url}/chat/completions"
        for inflight in (1000, 100):
            for kind in ("aiohttp", "httpx"):
                try:
                    __import__(kind)
                except ImportError:
                    print(f"{kind}: not installed")
                    continue
                for threshold in (700, 50_000):  # the GC's default gen-0 threshold, ours
                    gc.set_threshold(threshold, 10, 10)
                    n = args.requests if kind == "aiohttp" else max(200, args.requests // 20)
                    rate, ms = asyncio.run(bare_client(kind, url, n, inflight))
                    print(f"{kind:8s} {inflight:5d} in flight, gc gen-0 threshold "
                          f"{threshold:6d}: {rate:6.0f} req/s, {ms:.3f} ms CPU per request "
                          f"({n} requests)", flush=True)
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="time measured (at least one batch)")
    parser.add_argument("--latency-s", type=float, default=1.0,
                        help="median latency of the stand-in server")
    parser.add_argument("--latency-sigma", type=float, default=0.5)
    parser.add_argument("--warmup-batches", type=int, default=2)
    parser.add_argument("--groups", type=int, default=128,
                        help="train groups of 8 envs, a batch of all of them (the tests: few)")
    parser.add_argument("--redis-url", default=None, help="default: an embedded server")
    parser.add_argument("--compare-clients", action="store_true",
                        help="measure the bare HTTP clients instead")
    parser.add_argument("--requests", type=int, default=10_000,
                        help="requests per bare-client measurement (httpx: a 20th)")
    args = parser.parse_args()
    if args.compare_clients:
        compare_clients(args)
        return
    with EmbeddedRedis() if args.redis_url is None else nullcontext() as redis_server:
        pipeline(args, args.redis_url or redis_server.url)


if __name__ == "__main__":
    main()
