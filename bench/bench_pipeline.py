"""Throughput of the whole pipeline against a plain loop over the same env.

    python bench/bench_pipeline.py [--seconds 20] [--producers 2] [--ratio 1] [--redis-url URL]
                                   [--metrics off|on|both] [--samples off|on|both]
                                   [--record off|both]

The pipeline: the seed's train block (128 groups x 8 FrozenLake envs, 16 per shard), random
policy, producer processes -> Redis Streams -> a Batcher handing 1024-trajectory batches in
complete groups to a trainer that acks and publishes a new version at once. Counted is what
the trainer receives. The plain loop: one process, the same env and the same seeds, random
actions, no queue (first the bare gymnasium loop, then the producers' own episode code). It
plays the block as the producers do: a group's members one after another with the episode's
seed, derived once per group episode (before 2026-11-24 it derived one per trajectory, ~7 us
of numpy `SeedSequence` that the producers do not pay, which made the loop ~19% slower).
Prints trajectories/s, env steps/s, batch wait and trajectory latency percentiles, memory.

`--metrics on`: every producer and the trainer serve /metrics and a scraper reads all pages
every `--scrape-s` (as Prometheus would, on the same machine); `both` runs the pipeline with
metrics off and on in each round (alternating which goes first) and prints on / off.

`--samples`: the producers' sample stream (`sample_rate`, what `rollstream ui` shows) at the
config's default rate (`on`, the default), off (`sample_rate: 0`), or `both`: off and on in
each round, alternating which goes first, printing on / off and the stream's size.

`--record both`: the trainer's Batcher with and without `record=DIR` (every batch kept as a
Parquet file, consumer/store.py) in each round, alternating which goes first; prints on / off
and the bytes written per trajectory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import redis

from consumer import Batcher
from producers.control import ControlState
from producers.envs import make_env
from producers.policies.random import RandomPolicy
from producers.rollout import EnvSlot, play_episode
from rollstream.embedded import EmbeddedRedis
from rollstream.launcher import start_producers, stop_processes
from schemas.config import RolloutConfig
from schemas.keys import Keys
from schemas.seeding import episode_seed

SEED_BLOCK = {
    "max_env_num_per_worker": 16, "num_env_groups": 128, "group_size": 8,
    "tags": ["FrozenLake"], "num_groups_partition": [128],
}


def bench_config(ratio: int, latency_s: float, samples: bool = True) -> RolloutConfig:
    return RolloutConfig.from_dict({
        "rollout_batch_size": 1024, "async_generation_ratio": ratio, "seed": 42,
        "train_env_manager": SEED_BLOCK,
        "policy": {"type": "random", "latency_s": latency_s},
        **({} if samples else {"sample_rate": 0.0}),  # on: the config's default rate
    })


def block_order(i: int, first_k: int = 0) -> tuple[int, int, int]:
    """(group, episode k, member) of the block's `i`-th trajectory (episodes from `first_k`),
    played as the producers play the block: the 8 members of a group's episode one after
    another, with one seed."""
    members = SEED_BLOCK["group_size"]
    groups = SEED_BLOCK["num_env_groups"]
    return (i // members) % groups, first_k + i // (members * groups), i % members


def plain_env_loop(config: RolloutConfig, seconds: float) -> tuple[float, float]:
    """Bare gymnasium loop over the block: reset with the episode seed, random actions (each
    member its own, as the random policy draws them), step to the end. At least one
    trajectory, however short `seconds`."""
    spec = config.env_spec("FrozenLake")
    env = make_env(spec.env_id, spec.env_config)
    trajs = steps = 0
    started = time.perf_counter()
    while trajs == 0 or time.perf_counter() - started < seconds:
        group, k, member = block_order(trajs)
        # derived once per group episode (`episode_seed` caches it), as in the producers
        seed = episode_seed(config.seed, "train", group, k)
        actions = random.Random(seed * 1_000_003 + member)
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(actions.randrange(4))
            steps += 1
            done = term or trunc
        trajs += 1
    elapsed = time.perf_counter() - started
    return trajs / elapsed, steps / elapsed


def plain_rollout_loop(config: RolloutConfig, seconds: float) -> tuple[float, float]:
    """The producers' episode code (trajectory messages built), in one process, no queue; at
    least one trajectory."""
    spec = config.env_spec("FrozenLake")
    slot = EnvSlot(mode="train", env_id=0, group_id=0, member=0, shard=0, tag="FrozenLake",
                   env=make_env(spec.env_id, spec.env_config))
    policy = RandomPolicy()
    control = ControlState()

    async def loop() -> tuple[int, int]:
        trajs = steps = 0
        started = time.perf_counter()
        while trajs == 0 or time.perf_counter() - started < seconds:
            slot.group_id, slot.k, slot.member = block_order(trajs)
            traj = await play_episode(slot, seed=config.seed, producer_id="plain", policy=policy,
                                      control=control, gate=_open_gate)
            trajs += 1
            steps += traj["num_actions"]
        return trajs, steps

    started = time.perf_counter()
    trajs, steps = asyncio.run(loop())
    elapsed = time.perf_counter() - started
    return trajs / elapsed, steps / elapsed


async def _open_gate() -> bool:
    return True


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def delete_run(client: redis.Redis, run: str) -> None:
    """Delete every key of `run` (a benchmark's run leaves nothing behind), 500 per call."""
    names = list(client.scan_iter(match=Keys(run).pattern(), count=1000))
    for at in range(0, len(names), 500):
        client.delete(*names[at:at + 500])


def wait_balanced(client: redis.Redis, config: RolloutConfig, run: str, producers: int,
                  timeout_s: float = 60.0) -> None:
    """Measure only once every producer holds its share of the shards."""
    keys = [f"{{{run}}}:lease:train:{s}" for s in range(config.train_env_manager.num_shards)]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        owners = client.mget(keys)
        if None not in owners and len(set(owners)) == min(producers, len(keys)):
            return
        time.sleep(0.1)
    raise SystemExit(f"producers did not share the shards within {timeout_s:.0f}s")


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class Scraper:
    """Reads every /metrics page every `interval_s` on a thread, as Prometheus would."""

    def __init__(self, urls: list[str], interval_s: float):
        self.urls, self.interval_s = urls, interval_s
        self.scrapes = self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url, timeout=5) as reply:
                        reply.read()
                    self.scrapes += 1
                except OSError:
                    self.failures += 1


def pipeline(config: RolloutConfig, url: str, producers: int, seconds: float,
             warmup_batches: int, metrics: bool = False,
             scrape_s: float = 1.0, record: str | None = None) -> dict[str, float]:
    client = redis.Redis.from_url(url, socket_timeout=30)
    run = f"bench-{os.getpid()}-{'m' if metrics else 'n'}-{int(time.time() * 1000) % 10**6}"
    batcher = Batcher(client, config, run=run, record=record)
    ports = free_ports(producers + 1) if metrics else []
    trainer_page = batcher.serve_metrics(ports[0], "127.0.0.1") if metrics else None
    procs = start_producers(url, run, producers, "WARNING", metrics_ports=ports[1:],
                            metrics_addr="127.0.0.1")
    scraper = Scraper([f"http://127.0.0.1:{p}/metrics" for p in ports], scrape_s)
    try:
        return _measure(client, batcher, config, run, procs, seconds, warmup_batches,
                        producers, scraper if metrics else None)
    finally:
        if trainer_page is not None:
            trainer_page.close()
        batcher.stop_run()
        stop_processes(procs)
        delete_run(client, run)
        client.close()


def _measure(client: redis.Redis, batcher: Batcher, config: RolloutConfig, run: str,
             procs: list, seconds: float, warmup_batches: int, producers: int,
             scraper: Scraper | None) -> dict[str, float]:
    """Once the producers share the shards: trajectories/s, waits, latency, memory, CPU over
    `seconds` and at least one batch (`--seconds 0`: exactly one, what the tests run); the
    scraper (if any) runs through the measured time."""
    wait_balanced(client, config, run, producers)
    for _ in range(warmup_batches):
        batch = batcher.get_batch("train", timeout_s=120)
        batcher.ack(batch)
        batcher.publish_version()
    trajs = steps = batches = 0
    waits: list[float] = []
    latencies: list[float] = []
    peak_rss = 0.0
    cpu0 = ([cpu_s(p.pid) for p in procs], time.process_time(), redis_cpu_s(client))
    started = time.perf_counter()
    with scraper or nullcontext():
        while batches == 0 or time.perf_counter() - started < seconds:
            batch = batcher.get_batch("train", timeout_s=120)
            now = time.time()
            waits.append(batch.metrics["time/get_batch_cost"])
            latencies += [now - t["finished_at"] for t in batch.trajectories]
            trajs += len(batch)
            steps += int(batch.num_actions.sum())
            batches += 1
            batcher.ack(batch)
            batcher.publish_version()
            peak_rss = max(peak_rss, sum(rss_mb(p.pid) for p in procs))
    elapsed = time.perf_counter() - started
    per_k = 1000 / max(1, trajs)
    producer_cpu = sum(cpu_s(p.pid) for p in procs) - sum(cpu0[0])
    memory = client.info("memory")
    samples = Keys(run).samples
    return {
        "samples": client.xlen(samples), "samples_kb": (client.memory_usage(samples) or 0) / 1024,
        "traj_s": trajs / elapsed, "steps_s": steps / elapsed, "batches": batches,
        "wait_p50": float(np.percentile(waits, 50)),
        "wait_p99": float(np.percentile(waits, 99)),
        "lat_p50": float(np.percentile(latencies, 50)),
        "lat_p99": float(np.percentile(latencies, 99)),
        "stale": batcher.totals.get("scheduler/stale_dropped", 0.0),
        "redis_mb": memory["used_memory_peak"] / 2**20,
        "producers_rss_mb": peak_rss, "trainer_rss_mb": rss_mb(os.getpid()),
        "cpu_producers": producer_cpu * per_k,
        "cpu_trainer": (time.process_time() - cpu0[1]) * per_k,
        "cpu_redis": (redis_cpu_s(client) - cpu0[2]) * per_k,
        "scrapes": scraper.scrapes if scraper else 0,
        "scrape_failures": scraper.failures if scraper else 0,
    }


def metrics_round(config: RolloutConfig, args: argparse.Namespace, url: str,
                  index: int) -> float:
    """`--metrics both`: the pipeline with metrics off and on, the order alternating by round;
    prints both and returns on / off trajectories/s."""
    order = [False, True] if index % 2 == 0 else [True, False]
    results = {on: pipeline(config, url, args.producers, args.seconds, args.warmup_batches,
                            metrics=on, scrape_s=args.scrape_s) for on in order}
    for on in order:
        r = results[on]
        print(f"metrics {'on ' if on else 'off'}: {r['traj_s']:8.0f} traj/s  batch wait p50 "
              f"{r['wait_p50'] * 1000:.0f} ms  CPU s/1000 traj: producers "
              f"{r['cpu_producers']:.3f}, trainer {r['cpu_trainer']:.3f}"
              + (f"  ({r['scrapes']:.0f} scrapes, {r['scrape_failures']:.0f} failed)"
                 if on else ""), flush=True)
    ratio = results[True]["traj_s"] / results[False]["traj_s"]
    cpu = {on: results[on]["cpu_producers"] + results[on]["cpu_trainer"] for on in order}
    print(f"  metrics on / off: {ratio:.3f}x trajectories/s, {cpu[True] / cpu[False]:.3f}x "
          "CPU per trajectory (producers + trainer)", flush=True)
    return ratio


def samples_round(args: argparse.Namespace, url: str, index: int) -> float:
    """`--samples both`: the pipeline with the sample stream off and on (the config's default
    rate), the order alternating by round; prints both and returns on / off trajectories/s."""
    order = [False, True] if index % 2 == 0 else [True, False]
    results = {on: pipeline(bench_config(args.ratio, args.latency_s, samples=on), url,
                            args.producers, args.seconds, args.warmup_batches)
               for on in order}
    for on in order:
        r = results[on]
        print(f"samples {'on ' if on else 'off'}: {r['traj_s']:8.0f} traj/s  batch wait p50 "
              f"{r['wait_p50'] * 1000:.0f} ms  CPU s/1000 traj: producers "
              f"{r['cpu_producers']:.3f}, redis {r['cpu_redis']:.3f}"
              + (f"  (sample stream: {r['samples']:.0f} entries, {r['samples_kb']:.0f} KiB)"
                 if on else ""), flush=True)
    ratio = results[True]["traj_s"] / results[False]["traj_s"]
    cpu = {on: results[on]["cpu_producers"] + results[on]["cpu_redis"] for on in order}
    print(f"  samples on / off: {ratio:.3f}x trajectories/s, {cpu[True] / cpu[False]:.3f}x "
          "CPU per trajectory (producers + redis)", flush=True)
    return ratio


def record_round(config: RolloutConfig, args: argparse.Namespace, url: str,
                 index: int) -> float:
    """`--record both`: the trainer records every batch (a fresh folder) or not, the order
    alternating by round; prints both and returns on / off trajectories/s."""
    order = [False, True] if index % 2 == 0 else [True, False]
    results: dict[bool, dict[str, float]] = {}
    for on in order:
        folder = tempfile.mkdtemp(prefix="bench-record-") if on else None
        try:
            results[on] = pipeline(config, url, args.producers, args.seconds,
                                   args.warmup_batches, record=folder)
            if folder is not None:
                files = list(Path(folder).iterdir())
                kept = results[on]["batches"] + args.warmup_batches
                results[on]["bytes_traj"] = sum(f.stat().st_size for f in files) / max(
                    1, kept * config.batch_size("train"))
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    for on in order:
        r = results[on]
        print(f"record {'on ' if on else 'off'}: {r['traj_s']:8.0f} traj/s  batch wait p50 "
              f"{r['wait_p50'] * 1000:.0f} ms  CPU s/1000 traj: trainer {r['cpu_trainer']:.3f}"
              + (f"  ({r['bytes_traj']:.0f} bytes of Parquet per trajectory)" if on else ""),
              flush=True)
    ratio = results[True]["traj_s"] / results[False]["traj_s"]
    print(f"  record on / off: {ratio:.3f}x trajectories/s, "
          f"{results[True]['cpu_trainer'] / results[False]['cpu_trainer']:.3f}x trainer CPU "
          "per trajectory", flush=True)
    return ratio


def cpu_budget(pipeline_traj_s: float, plain_traj_s: float, cpu_s_per_k: float, cores: int,
               target: float = 0.8) -> tuple[float, float, float]:
    """What the CPU per trajectory allows: (cores the pipeline kept busy, the ratio it would
    reach with all `cores` busy, the CPU seconds per 1000 trajectories at which it would reach
    `target` x the plain loop while keeping as many cores busy as it did)."""
    busy = pipeline_traj_s * cpu_s_per_k / 1000
    cap = cores * 1000 / cpu_s_per_k / plain_traj_s
    budget = busy * 1000 / (target * plain_traj_s)
    return busy, cap, budget


def drift_note(before: float, after: float, limit: float = 0.1) -> str | None:
    """A warning when the plain loop's speed before and after the pipeline differs by more
    than `limit` of their mean: the machine's speed moved within the round, and the ratio
    (against the mean) is only as good as that."""
    drift = abs(after - before) / ((after + before) / 2)
    if drift <= limit:
        return None
    return (f"  the plain loop moved {drift:.0%} between before and after: this round's "
            "ratio is unreliable")


def one_round(config: RolloutConfig, args: argparse.Namespace, url: str) -> float:
    """Plain loop, pipeline, plain loop again (the machine's speed drifts): prints the
    figures and returns pipeline / mean plain trajectories/s."""
    before = plain_env_loop(config, args.seconds / 4)
    roll_traj, roll_steps = plain_rollout_loop(config, args.seconds / 4)
    result = pipeline(config, url, args.producers, args.seconds, args.warmup_batches,
                      metrics=args.metrics == "on", scrape_s=args.scrape_s)
    after = plain_env_loop(config, args.seconds / 4)
    env_traj = (before[0] + after[0]) / 2
    env_steps = (before[1] + after[1]) / 2
    ratio = result["traj_s"] / env_traj
    mode = "sync" if args.ratio == 0 else f"async ratio {args.ratio}"
    print(f"plain env loop (1 process, no queue):     {env_traj:9.0f} traj/s "
          f"{env_steps:9.0f} steps/s  (before {before[0]:.0f}, after {after[0]:.0f})")
    print(f"plain rollout code (1 process, no queue): {roll_traj:9.0f} traj/s "
          f"{roll_steps:9.0f} steps/s")
    print(f"pipeline ({args.producers} producers, {mode}):      {result['traj_s']:9.0f} traj/s "
          f"{result['steps_s']:9.0f} steps/s  ({result['batches']:.0f} batches of 1024)")
    print(f"  pipeline / plain env loop: {ratio:.2f}x trajectories/s")
    note = drift_note(before[0], after[0])
    if note is not None:
        print(note)
    print(f"  batch wait p50 {result['wait_p50'] * 1000:.0f} ms  p99 "
          f"{result['wait_p99'] * 1000:.0f} ms; trajectory commit->trainer p50 "
          f"{result['lat_p50'] * 1000:.0f} ms  p99 {result['lat_p99'] * 1000:.0f} ms")
    print(f"  stale dropped {result['stale']:.0f}; memory: redis peak "
          f"{result['redis_mb']:.1f} MB, producers RSS {result['producers_rss_mb']:.0f} MB, "
          f"trainer RSS {result['trainer_rss_mb']:.0f} MB")
    print(f"  CPU seconds per 1000 trajectories: producers {result['cpu_producers']:.3f}, "
          f"trainer (batcher) {result['cpu_trainer']:.3f}, redis {result['cpu_redis']:.3f}")
    spent = result["cpu_producers"] + result["cpu_trainer"] + result["cpu_redis"]
    cores = os.cpu_count() or 1
    busy, cap, budget = cpu_budget(result["traj_s"], env_traj, spent, cores)
    print(f"  cores busy {busy:.2f} of {cores}: with all busy the ratio would be {cap:.2f}x; "
          f"0.8x needs {budget:.3f} s of CPU per 1000 trajectories at this use "
          f"(spent {spent:.3f})", flush=True)
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="pipeline time per round (at least one batch; the plain loops "
                             "a quarter of it each, at least one trajectory)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; the median is printed")
    parser.add_argument("--producers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--ratio", type=int, default=1, help="async_generation_ratio")
    parser.add_argument("--latency-s", type=float, default=0.0,
                        help="simulated model latency per action")
    parser.add_argument("--warmup-batches", type=int, default=2)
    parser.add_argument("--redis-url", default=None, help="default: an embedded server")
    parser.add_argument("--metrics", choices=["off", "on", "both"], default="off",
                        help="serve and scrape /metrics (both: off and on, compared)")
    parser.add_argument("--scrape-s", type=float, default=1.0,
                        help="with metrics: seconds between scrapes of every page")
    parser.add_argument("--samples", choices=["off", "on", "both"], default="on",
                        help="the sample stream at the default rate (on), off, or both "
                             "compared")
    parser.add_argument("--record", choices=["off", "both"], default="off",
                        help="both: the trainer with and without record=DIR, compared")
    args = parser.parse_args()
    if [args.metrics, args.samples, args.record].count("both") > 1:
        parser.error("more than one of --metrics/--samples/--record both: compare one at "
                     "a time")
    config = bench_config(args.ratio, args.latency_s, samples=args.samples != "off")
    with EmbeddedRedis() if args.redis_url is None else nullcontext() as server:
        url = args.redis_url or server.url
        if args.metrics == "both":
            ratios = [metrics_round(config, args, url, i) for i in range(args.repeat)]
        elif args.samples == "both":
            ratios = [samples_round(args, url, i) for i in range(args.repeat)]
        elif args.record == "both":
            ratios = [record_round(config, args, url, i) for i in range(args.repeat)]
        else:
            ratios = [one_round(config, args, url) for _ in range(args.repeat)]
    what = ("metrics on / off" if args.metrics == "both" else "samples on / off"
            if args.samples == "both" else "record on / off" if args.record == "both"
            else "pipeline / plain env loop")
    if args.repeat > 1:
        print(f"median {what} over {args.repeat} rounds: "
              f"{float(np.median(ratios)):.3f}x (all: {', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
