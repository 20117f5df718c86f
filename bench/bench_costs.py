"""Where a trajectory's CPU goes, part by part, on the seed's train block (FrozenLake, random
policy): what `bench/bench_pipeline.py` measures as a whole, taken apart.

    python bench/bench_costs.py [--rounds 5] [--seconds 5] [--redis-url URL]
    python bench/bench_costs.py --samples [--rounds 5] [--seconds 5]

- `episode code`: the producers' `play_episode` in one process against the bare gymnasium
  loop over the same envs and seeds (the plain loop of bench_pipeline), rounds interleaved;
  the difference is what recording an episode costs beyond playing it.
- `producer alone`: one `Producer` in this process holding every shard, admission never
  waiting (a large ratio), no trainer (streams trimmed on the side): its CPU and the Redis
  server's CPU per committed trajectory.
- `trainer alone`: a `Batcher` handing out batches of 1024 from streams filled beforehand
  with real messages (get_batch, ack, publish_version): its CPU per trajectory.
- `decode`: `decode_trajectory` per message.
- `parts alone`: what producer, Redis and trainer together allow. With every core busy and
  nothing lost to sharing them, the pipeline delivers at most cores x bare / (their sum) of
  the bare loop; bench_pipeline's 0.8x target needs their sum at most cores x bare / 0.8.

`--samples` measures one thing instead: the producer alone with the sample stream at the
config's default `sample_rate` and with it off (rounds interleaved, which goes first
alternating): producer and Redis CPU per trajectory, and the difference.

Each part prints the median over its rounds in microseconds per trajectory; compare parts
within one run (this machine's speed drifts).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import sys
import threading
import time
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
from bench_pipeline import (  # noqa: E402
    SEED_BLOCK,
    bench_config,
    block_order,
    cpu_budget,
    delete_run,
    redis_cpu_s,
)

from consumer import Batcher  # noqa: E402
from producers.control import ControlState  # noqa: E402
from producers.envs import make_env  # noqa: E402
from producers.policies.random import RandomPolicy  # noqa: E402
from producers.producer import Producer, tune_gc  # noqa: E402
from producers.rollout import EnvSlot, play_episode  # noqa: E402
from rollstream.embedded import EmbeddedRedis  # noqa: E402
from schemas.codec import decode_trajectory, encode_trajectory  # noqa: E402
from schemas.config import RolloutConfig  # noqa: E402
from schemas.keys import Keys  # noqa: E402
from schemas.samples import Sampler, encode_sample, sample_of  # noqa: E402
from schemas.seeding import episode_seed  # noqa: E402

# the seed's train block, as bench_pipeline runs it: 1024 envs, 16 per shard
GROUPS, MEMBERS = SEED_BLOCK["num_env_groups"], SEED_BLOCK["group_size"]


def seed_config(ratio: int, samples: bool = True) -> RolloutConfig:
    return bench_config(ratio, latency_s=0.0, samples=samples)


def median_us(samples: list[float]) -> str:
    return f"{statistics.median(samples):7.1f} us"


# -- episode code ----------------------------------------------------------------------------
def bare_loop(config: RolloutConfig, envs: list[Any], episodes: int, first_k: int) -> float:
    """CPU seconds per episode of the bare loop: reset with the episode seed, random actions
    (the member's own, as the random policy draws them)."""
    started = time.process_time()
    for i in range(episodes):
        env = envs[i % len(envs)]
        group, k, member = block_order(i, first_k)
        seed = episode_seed(config.seed, "train", group, k)  # cached: once per group episode
        actions = random.Random(seed * 1_000_003 + member)
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(actions.randrange(4))
            done = terminated or truncated
    return (time.process_time() - started) / episodes


def episode_code(config: RolloutConfig, envs: list[Any], episodes: int, first_k: int) -> float:
    """CPU seconds per episode of `play_episode` (trajectory messages built) on the same envs."""
    slots = [EnvSlot(mode="train", env_id=i, group_id=0, member=0, shard=0,
                     tag="FrozenLake", env=env) for i, env in enumerate(envs)]
    policy, control = RandomPolicy(), ControlState()

    async def open_gate() -> bool:
        return True

    async def loop() -> None:
        for i in range(episodes):
            slot = slots[i % len(slots)]
            slot.group_id, slot.k, slot.member = block_order(i, first_k)
            await play_episode(slot, seed=config.seed, producer_id="bench", policy=policy,
                               control=control, gate=open_gate)

    started = time.process_time()
    asyncio.run(loop())
    return (time.process_time() - started) / episodes


def part_episode_code(config: RolloutConfig, rounds: int, episodes: int) -> float:
    """Prints both loops; returns the bare loop's median, us per episode."""
    spec = config.env_spec("FrozenLake")
    envs = [make_env(spec.env_id, spec.env_config) for _ in range(16)]
    bare: list[float] = []
    code: list[float] = []
    episode_code(config, envs, episodes // 4, 10**6)  # warm-up, not counted
    for r in range(rounds):  # interleaved; every episode a fresh seed for both
        bare.append(bare_loop(config, envs, episodes, 2000 * r) * 1e6)
        code.append(episode_code(config, envs, episodes, 2000 * r + 1000) * 1e6)
    extra = [c - b for b, c in zip(bare, code, strict=True)]
    print(f"episode code: bare gymnasium loop {median_us(bare)}, play_episode "
          f"{median_us(code)}, recording an episode costs {median_us(extra)} more", flush=True)
    return statistics.median(bare)


# -- producer alone --------------------------------------------------------------------------
def producer_alone(url: str, seconds: float, samples: bool = True) -> tuple[float, float]:
    """(producer CPU, Redis CPU) seconds per committed trajectory."""
    config = seed_config(ratio=1_000_000, samples=samples)  # admission never waits
    client = redis.Redis.from_url(url, socket_timeout=30)
    run = f"bench-costs-{uuid.uuid4().hex[:8]}"
    Batcher(client, config, run=run)  # publishes the config
    keys = Keys(run)
    stop = threading.Event()

    def trim() -> None:  # keep the streams short, as a trainer's acks would
        while not stop.wait(0.5):
            pipe = client.pipeline(transaction=False)
            for g in range(GROUPS):
                pipe.xtrim(keys.stream("train", g), maxlen=100, approximate=True)
            pipe.execute()

    trimmer = threading.Thread(target=trim, daemon=True)
    trimmer.start()
    producer = Producer(url, run, handle_signals=False, seconds=seconds)
    threshold = gc.get_threshold()
    tune_gc()  # as `rollstream produce` does in its process
    redis0, cpu0 = redis_cpu_s(client), time.thread_time()
    try:
        producer.run()
        cpu = time.thread_time() - cpu0  # this thread's: the trimmer is not the producer
        redis_used = redis_cpu_s(client) - redis0
    finally:
        gc.unfreeze()  # the trainer part runs with the collector as a trainer has it
        gc.set_threshold(*threshold)
        stop.set()
        trimmer.join(5)
        delete_run(client, run)
        client.close()
    committed = max(1, producer.committed)
    return cpu / committed, redis_used / committed


def part_producer(url: str, rounds: int, seconds: float) -> tuple[float, float]:
    """Prints and returns the medians (producer, Redis), us per trajectory."""
    runs = [producer_alone(url, seconds) for _ in range(rounds)]
    producer = [p * 1e6 for p, _ in runs]
    server = [r * 1e6 for _, r in runs]
    print(f"producer alone: CPU {median_us(producer)} per trajectory, "
          f"Redis {median_us(server)}", flush=True)
    return statistics.median(producer), statistics.median(server)


def sample_parts(config: RolloutConfig, episodes: int = 2000) -> tuple[float, float]:
    """(CPU seconds of the sampler's answer per trajectory, of building and encoding one
    sample) on the block's trajectories, asked in the producers' order (members in turn)."""
    spec = config.env_spec("FrozenLake")
    env = make_env(spec.env_id, spec.env_config)
    policy, control = RandomPolicy(), ControlState()
    trajs: list[dict[str, Any]] = []

    async def open_gate() -> bool:
        return True

    async def build() -> None:
        for i in range(episodes):
            group, k, member = block_order(i)
            slot = EnvSlot(mode="train", env_id=group * MEMBERS + member, group_id=group,
                           member=member, shard=0, tag="FrozenLake", env=env, k=k)
            trajs.append(await play_episode(slot, seed=config.seed, producer_id="bench",
                                            policy=policy, control=control, gate=open_gate))

    asyncio.run(build())
    sampler = Sampler(config.sample_rate, config.seed)
    names = env.unwrapped.action_names
    started = time.process_time()
    for traj in trajs:
        sampler(traj["mode"], traj["group_id"], traj["episode_id"])
    asked = (time.process_time() - started) / len(trajs)
    started = time.process_time()
    for traj in trajs:
        encode_sample(sample_of(traj, run_version=0, action_names=names))
    built = (time.process_time() - started) / len(trajs)
    return asked, built


def part_samples(url: str, rounds: int, seconds: float) -> None:
    """The producer alone with the sample stream on (the default rate) and off; and the
    producer's parts of it alone."""
    config = seed_config(ratio=1)
    runs = [sample_parts(config) for _ in range(rounds)]
    asked = statistics.median(a for a, _ in runs) * 1e6
    built = statistics.median(b for _, b in runs) * 1e6
    print(f"samples, the producer's parts: the sampler's answer {asked:.2f} us per trajectory, "
          f"a sample built and encoded {built:.1f} us; at sample_rate {config.sample_rate:g}: "
          f"{asked + config.sample_rate * built:.2f} us per trajectory", flush=True)
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    for r in range(rounds):
        for samples in ((True, False) if r % 2 == 0 else (False, True)):
            (on if samples else off).append(producer_alone(url, seconds, samples=samples))
    rate = seed_config(ratio=1).sample_rate
    for name, runs in ((f"on ({rate:g})", on), ("off", off)):
        print(f"samples {name}: producer CPU {median_us([p * 1e6 for p, _ in runs])}, Redis "
              f"{median_us([s * 1e6 for _, s in runs])} per trajectory", flush=True)
    producer = [(a[0] - b[0]) * 1e6 for a, b in zip(on, off, strict=True)]
    server = [(a[1] - b[1]) * 1e6 for a, b in zip(on, off, strict=True)]
    print(f"  the sample stream costs {median_us(producer)} of producer CPU and "
          f"{median_us(server)} of Redis CPU per trajectory (median of paired rounds; "
          f"all: {', '.join(f'{x:.1f}' for x in producer)})", flush=True)


# -- trainer alone ---------------------------------------------------------------------------
def messages(config: RolloutConfig, batches: int) -> list[tuple[int, bytes]]:
    """(group, encoded message) for `batches` episodes of every env of the block."""
    spec = config.env_spec("FrozenLake")
    env = make_env(spec.env_id, spec.env_config)
    policy, control = RandomPolicy(), ControlState()
    out: list[tuple[int, bytes]] = []

    async def open_gate() -> bool:
        return True

    async def build() -> None:
        for k in range(batches):
            for env_id in range(GROUPS * MEMBERS):
                slot = EnvSlot(mode="train", env_id=env_id, group_id=env_id // MEMBERS,
                               member=env_id % MEMBERS, shard=env_id // 16, tag="FrozenLake",
                               env=env, k=k)
                traj = await play_episode(slot, seed=config.seed, producer_id="bench",
                                          policy=policy, control=control, gate=open_gate)
                out.append((slot.group_id, encode_trajectory(traj)))

    asyncio.run(build())
    return out


def trainer_alone(url: str, config: RolloutConfig, filled: list[tuple[int, bytes]],
                  batches: int) -> float:
    """Trainer CPU seconds per trajectory over `batches` batches of streams filled first."""
    client = redis.Redis.from_url(url, socket_timeout=30)
    run = f"bench-costs-{uuid.uuid4().hex[:8]}"
    try:
        batcher = Batcher(client, config, run=run)
        keys = Keys(run)
        pipe = client.pipeline(transaction=False)
        for group, data in filled:
            pipe.xadd(keys.stream("train", group), {"data": data})
        pipe.execute()
        handed = 0
        started = time.process_time()
        for _ in range(batches):
            batch = batcher.get_batch("train", timeout_s=30)
            handed += len(batch)
            batcher.ack(batch)
            batcher.publish_version()
            del batch  # freeing a batch is part of a trainer's cost
        return (time.process_time() - started) / handed
    finally:
        delete_run(client, run)
        client.close()


def part_trainer(url: str, rounds: int, batches: int) -> tuple[list[tuple[int, bytes]], float]:
    """Prints the median; returns the messages it filled the streams with and the median
    (us per trajectory)."""
    config = seed_config(ratio=4)  # nothing filled beforehand goes stale
    filled = messages(config, batches=batches)
    runs = [trainer_alone(url, config, filled, batches=batches) * 1e6 for _ in range(rounds)]
    print(f"trainer alone: CPU {median_us(runs)} per trajectory (batches of 1024: get_batch, "
          "ack, publish_version)", flush=True)
    return filled, statistics.median(runs)


def part_decode(filled: list[tuple[int, bytes]], rounds: int) -> None:
    """As the Batcher decodes: with the collector paused."""
    datas = [data for _, data in filled]
    runs: list[float] = []
    gc.disable()
    try:
        for _ in range(rounds):
            started = time.process_time()
            for data in datas:
                decode_trajectory(data)
            runs.append((time.process_time() - started) / len(datas) * 1e6)
    finally:
        gc.enable()
    size = sum(map(len, datas)) / len(datas)
    print(f"decode: {median_us(runs)} per message ({size:.0f} bytes)", flush=True)


def parts_cap(bare_us: float, parts_us: float, cores: int,
              target: float = 0.8) -> tuple[float, float]:
    """(the most the pipeline can deliver as a ratio to the bare loop when its parts cost
    `parts_us` per trajectory and all `cores` stay busy, the `parts_us` at which that most
    is `target`): bench_pipeline's `cpu_budget` with every core busy, in us per trajectory."""
    plain_traj_s, spent = 1e6 / bare_us, parts_us / 1000  # traj/s; CPU s per 1000 traj
    all_busy_traj_s = cores * 1000 / spent
    _, cap, budget = cpu_budget(all_busy_traj_s, plain_traj_s, spent, cores, target)
    return cap, budget * 1000


def part_cap(bare_us: float, producer_us: float, redis_us: float, trainer_us: float) -> None:
    cores = os.cpu_count() or 1
    parts = producer_us + redis_us + trainer_us
    cap, needed = parts_cap(bare_us, parts, cores)
    print(f"parts alone: producer + Redis + trainer {parts:.1f} us per trajectory; on "
          f"{cores} busy cores, nothing lost to sharing them: at most {cap:.2f}x the bare "
          f"loop (0.8x needs at most {needed:.1f} us)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0, help="per producer-alone round")
    parser.add_argument("--episodes", type=int, default=3000, help="per episode-code round")
    parser.add_argument("--trainer-batches", type=int, default=3,
                        help="batches of 1024 per trainer-alone round")
    parser.add_argument("--redis-url", default=None, help="default: an embedded server")
    parser.add_argument("--samples", action="store_true",
                        help="only: the producer with the sample stream on and off")
    args = parser.parse_args()
    if args.samples:
        with EmbeddedRedis() if args.redis_url is None else nullcontext() as server:
            part_samples(args.redis_url or server.url, args.rounds, args.seconds)
        return
    bare = part_episode_code(seed_config(ratio=1), args.rounds, args.episodes)
    with EmbeddedRedis() if args.redis_url is None else nullcontext() as server:
        url = args.redis_url or server.url
        producer, server_us = part_producer(url, args.rounds, args.seconds)
        filled, trainer = part_trainer(url, args.rounds, args.trainer_batches)
    part_decode(filled, args.rounds)
    part_cap(bare, producer, server_us, trainer)


if __name__ == "__main__":
    main()
