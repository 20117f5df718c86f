"""The seed's val mix (three Sokoban tags and FrozenLake): speed per tag, bytes on the wire,
and whole val rounds through the pipeline against a plain loop over the same mix.

    python bench/bench_valmix.py [--seconds 4] [--rounds 5] [--producers 2]

The val block of `configs/seed_env_managers.yaml`: 1024 envs of group size 1, 256 per tag.
1. Per tag, one process, no queue: the producers' own episode code with the random policy
   (trajectories/s, steps per episode) and each trajectory message as it travels (msgpack
   bytes per trajectory, per step).
2. Val rounds through the pipeline: producer processes, an embedded Redis, a trainer asking
   for `get_batch("val")` (one round: all 1024 envs, one episode each) `--rounds` times; the
   train block is cut to one env so that only val runs. Against it: the plain loop's time for
   the same mix (256 episodes of each tag at its own speed), measured before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from consumer import Batcher  # noqa: E402
from producers.control import ControlState  # noqa: E402
from producers.envs import build_env  # noqa: E402
from producers.policies.random import RandomPolicy  # noqa: E402
from producers.rollout import EnvSlot, play_episode  # noqa: E402
from rollstream.embedded import EmbeddedRedis  # noqa: E402
from rollstream.launcher import start_producers, stop_processes  # noqa: E402
from schemas.codec import encode_trajectory  # noqa: E402
from schemas.config import RolloutConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def val_config() -> RolloutConfig:
    """The seed config with its train block cut to one env: the producers play val only."""
    seed = RolloutConfig.from_yaml(ROOT / "configs" / "seed_env_managers.yaml")
    data = seed.model_dump(mode="json", exclude_none=True)
    data["rollout_batch_size"] = 1
    data["train_env_manager"] = {"max_env_num_per_worker": 1, "num_env_groups": 1,
                                 "group_size": 1, "tags": ["FrozenLake"]}
    return RolloutConfig.from_dict(data)


async def _open_gate() -> bool:
    return True


def tag_loop(config: RolloutConfig, tag: str, seconds: float) -> dict[str, float]:
    """The producers' episode code on one env of `tag`: episodes/s, steps, wire bytes, over
    `seconds` and at least one episode."""
    env = build_env(config, tag)
    slot = EnvSlot(mode="val", env_id=0, group_id=0, member=0, shard=0, tag=tag, env=env)
    policy, control = RandomPolicy(), ControlState()

    async def loop() -> tuple[int, int, int, float]:
        trajs = steps = wire = 0
        started = time.perf_counter()
        while trajs == 0 or time.perf_counter() - started < seconds:
            # a val round replays episode 0 of each group, as the producers do (its seed
            # derived once, then cached)
            slot.group_id, slot.k = trajs % 256, 0
            traj = await play_episode(slot, seed=config.seed, producer_id="plain",
                                      policy=policy, control=control, gate=_open_gate)
            wire += len(encode_trajectory(traj))
            trajs += 1
            steps += traj["num_actions"]
        return trajs, steps, wire, time.perf_counter() - started

    trajs, steps, wire, elapsed = asyncio.run(loop())
    env.close()
    return {"traj_s": trajs / elapsed, "steps": steps / trajs, "bytes": wire / trajs,
            "bytes_step": wire / max(1, steps)}


def plain_mix_s(config: RolloutConfig, seconds: float) -> tuple[float, dict[str, dict]]:
    """Seconds one process needs for one val round of the mix, and the per-tag figures."""
    block = config.val_env_manager
    assert block is not None
    per_tag = {tag: tag_loop(config, tag, seconds) for tag in block.tags}
    groups = dict(zip(block.tags, block.partition, strict=True))
    round_s = sum(groups[tag] * block.group_size / per_tag[tag]["traj_s"] for tag in per_tag)
    return round_s, per_tag


def pipeline_rounds(config: RolloutConfig, url: str, producers: int, rounds: int,
                    warmup: int = 1) -> list[float]:
    """Seconds per val round through the pipeline (after `warmup` untimed rounds)."""
    client = redis.Redis.from_url(url, socket_timeout=60)
    batcher = Batcher(client, config, run=f"bench-valmix-{uuid.uuid4().hex[:8]}")
    procs = start_producers(url, batcher.keys.run, producers, "WARNING")
    try:
        times = []
        for i in range(warmup + rounds):
            started = time.perf_counter()
            batch = batcher.get_batch("val", timeout_s=300)
            assert len(batch) == config.batch_size("val")
            if i >= warmup:
                times.append(time.perf_counter() - started)
        return times
    finally:
        batcher.stop_run()
        stop_processes(procs)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="plain loop time per tag (at least one episode)")
    parser.add_argument("--rounds", type=int, default=5, help="timed val rounds")
    parser.add_argument("--warmup-rounds", type=int, default=1,
                        help="untimed val rounds first (the producers' start)")
    parser.add_argument("--producers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--redis-url", default=None, help="default: an embedded server")
    args = parser.parse_args()
    config = val_config()
    before, per_tag = plain_mix_s(config, args.seconds)
    print("| tag | plain episode code (traj/s) | steps/episode | bytes/trajectory | "
          "bytes/step |")
    print("| --- | --- | --- | --- | --- |")
    for tag, f in per_tag.items():
        print(f"| {tag} | {f['traj_s']:,.0f} | {f['steps']:.1f} | {f['bytes']:,.0f} | "
              f"{f['bytes_step']:.0f} |")
    with EmbeddedRedis() as server:
        times = pipeline_rounds(config, args.redis_url or server.url, args.producers,
                                args.rounds, args.warmup_rounds)
    after, _ = plain_mix_s(config, args.seconds / 2)
    plain = (before + after) / 2
    piped = statistics.median(times)
    print(f"val round of {config.batch_size('val')} (the mix), plain loop (1 process): "
          f"{plain:.2f} s (before {before:.2f}, after {after:.2f})")
    print(f"val round through the pipeline ({args.producers} producers), median of "
          f"{len(times)}: {piped:.2f} s; pipeline / plain: {plain / piped:.2f}x")


if __name__ == "__main__":
    main()
