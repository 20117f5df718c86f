"""Sticky sessions against least-loaded routing: prefix-cache hit rate and turns/s with 4
stand-in servers on multi-turn Sokoban, both in one run.

    python bench/bench_sticky.py [--groups 16] [--members 4] [--episodes 2] [--max-steps 20]
                                 [--cache-tokens 65536] [--prefill-s-per-token 0.0005]
                                 [--load-factor 2.0]

Four stand-in servers (`rollstream.fake_llm`, each on a thread of this process with its own
prefix cache of `--cache-tokens` prompt tokens, an LRU of 16-token blocks as vLLM's; a turn
takes `--latency-s` plus `--prefill-s-per-token` per prompt token not cached there). The
openai policy plays `--groups` groups of `--members` Sokoban episodes at once (each member
plays `--episodes` episodes one after another; a group's members start from the same prompt,
as ROLL's groups do), first with `routing: sticky`, then with `routing: least_loaded`, each
against fresh servers. Printed per routing: turns, turns/s, the prefix-cache hit rate (cached
prompt tokens / prompt tokens, summed over the servers) and the share of sticky requests that
went to their own server; then the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from producers.envs import build_env
from producers.policies import StepContext, make_policy
from rollstream.fake_llm import FakeLLMOptions, FakeLLMServer
from schemas.config import RolloutConfig

MODEL = "fake-model"


def config(urls: list[str], routing: str, args: argparse.Namespace) -> RolloutConfig:
    return RolloutConfig.from_dict({
        "rollout_batch_size": args.groups * args.members, "async_generation_ratio": 0,
        "seed": 42,
        "train_env_manager": {"max_env_num_per_worker": args.groups * args.members,
                              "num_env_groups": args.groups, "group_size": args.members,
                              "tags": ["Box"]},
        "custom_envs": {"Box": {"env_type": "sokoban", "env_config": {
            "dim_room": [6, 6], "num_boxes": 1, "search_depth": 30,
            "max_steps": args.max_steps}}},
        "policy": {"type": "openai", "base_urls": urls, "model": MODEL, "max_tokens": 128,
                   "timeout_s": 120, "routing": routing,
                   "session_load_factor": args.load_factor},
    })


async def play(policy: Any, cfg: RolloutConfig, group: int, member: int,
               episodes: int) -> int:
    """One member's episodes one after another; its turns."""
    turns = 0
    for k in range(episodes):
        env = build_env(cfg, "Box")
        seed = 1000 * group + k  # the group's episode k: one seed for every member
        obs, _ = env.reset(seed=seed)
        ctx = StepContext(env=env, seed=seed, version=0, mode="train", group_id=group,
                          episode_id=k, member=member, tag="Box")
        done = False
        while not done:
            action, _ = await policy.act(obs, ctx)
            obs, _, terminated, truncated, _ = env.step(action)
            ctx.turn += 1
            turns += 1
            done = terminated or truncated
    return turns


def run(routing: str, args: argparse.Namespace) -> dict[str, float]:
    from producers.metrics import LLM

    options = FakeLLMOptions(latency_s=args.latency_s, prefix_cache_tokens=args.cache_tokens,
                             prefill_s_per_token=args.prefill_s_per_token, p_good=args.p_good)
    servers = [FakeLLMServer(options).start() for _ in range(4)]
    cfg = config([s.base_url for s in servers], routing, args)
    LLM.sessions.clear()

    async def main() -> tuple[int, float]:
        policy = make_policy(cfg.policy)
        await policy.start()
        try:
            t0 = time.perf_counter()
            counts = await asyncio.gather(*(
                play(policy, cfg, g, m, args.episodes)
                for g in range(args.groups) for m in range(args.members)))
            return sum(counts), time.perf_counter() - t0
        finally:
            await policy.close()

    try:
        turns, seconds = asyncio.run(main())
    finally:
        for server in servers:
            server.stop()
    prompt = sum(s.prefix_cache.prompt_tokens for s in servers)
    cached = sum(s.prefix_cache.cached_tokens for s in servers)
    sticky = sum(LLM.sessions.values())
    return {"turns": turns, "seconds": seconds, "turns_per_s": turns / seconds,
            "hit_rate": cached / prompt if prompt else 0.0, "prompt_per_turn": prompt / turns,
            "affinity": LLM.sessions["preferred"] / sticky if sticky else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=2, help="per member, one after another")
    parser.add_argument("--p-good", type=float, default=0.5, help="the stand-in's good moves")
    parser.add_argument("--max-steps", type=int, default=20, help="Sokoban turns per episode")
    parser.add_argument("--latency-s", type=float, default=0.02, help="per turn, cached or not")
    parser.add_argument("--cache-tokens", type=int, default=65536,
                        help="each server's prefix cache, in prompt tokens")
    parser.add_argument("--load-factor", type=float, default=2.0,
                        help="sticky: policy.session_load_factor")
    parser.add_argument("--prefill-s-per-token", type=float, default=0.0005,
                        help="seconds per prompt token not cached on the server")
    args = parser.parse_args()
    results = {routing: run(routing, args) for routing in ("sticky", "least_loaded")}
    for routing, r in results.items():
        print(f"{routing:13} {r['turns']:6d} turns in {r['seconds']:6.2f}s: "
              f"{r['turns_per_s']:7.1f} turns/s, prefix-cache hit rate {100 * r['hit_rate']:5.1f}%"
              + (f", on their own server {100 * r['affinity']:5.1f}%" if routing == "sticky"
                 else "") + ", "
              f"{r['prompt_per_turn']:.0f} prompt tokens per turn")
    s, ll = results["sticky"], results["least_loaded"]
    print(f"sticky / least_loaded: turns/s x{s['turns_per_s'] / ll['turns_per_s']:.2f}, "
          f"hit rate {100 * s['hit_rate']:.1f}% vs {100 * ll['hit_rate']:.1f}%")


if __name__ == "__main__":
    main()
