"""Remote envs (`env_type: openenv`): the producer's CPU per remote env step, and many remote
envs on one producer, against local OpenEnv env servers.

    python bench/bench_openenv.py [--servers 4] [--envs 1000] [--seconds 5]

Starts `--servers` real OpenEnv servers (tests/openenv_server.py, built with openenv-core's
server API; needs the openenv-server extra), each allowing `envs / servers` sessions. Then,
in this process, on one event loop as a producer runs them:

1. `--few` envs (default 16) play episodes back to back for `--seconds`: the process CPU
   time per remote step (the client's share: JSON, WebSocket frames, the pool), beside the
   CPU per step of a local FrozenLake env in the same run (the ratio is the figure);
2. `--envs` envs at once (one session each, all open together): steps per second, CPU per
   step, and the peak of sessions open.

The servers run on the same machine, so the step rates say what the machine's cores give
both sides; the client's CPU per step is this process's alone (`time.process_time`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(ROOT / "tests"))

from helpers import free_port  # noqa: E402
from openenv_servers import EnvServer  # noqa: E402

from producers.envs import make_env  # noqa: E402
from producers.envs.openenv import OpenEnvEnv  # noqa: E402
from schemas.envspec import DEFAULT_CUSTOM_ENVS, FROZENLAKE_ID  # noqa: E402


async def play(envs: list[OpenEnvEnv], seconds: float) -> tuple[int, float, float, int]:
    """Every env plays episodes back to back for `seconds`, at least one each: (steps, wall s,
    CPU s, peak of sessions open at once)."""
    steps = 0
    open_now = peak = 0
    stop_at = time.perf_counter() + seconds

    async def loop(i: int, env: OpenEnvEnv) -> None:
        nonlocal steps, open_now, peak
        k = 0
        while k == 0 or time.perf_counter() < stop_at:
            await env.areset(seed=i * 1_000_003 + k)
            open_now += 1
            peak = max(peak, open_now)
            done = False
            while not done:
                _, _, terminated, truncated, _ = await env.astep("x")
                steps += 1
                done = terminated or truncated
            open_now -= 1
            k += 1

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(loop(i, env) for i, env in enumerate(envs)))
    return steps, time.perf_counter() - wall, time.process_time() - cpu, peak


def local_cpu_per_step(seconds: float) -> float:
    """CPU seconds per step of a local FrozenLake env (random actions), at least 1000."""
    env = make_env(FROZENLAKE_ID, DEFAULT_CUSTOM_ENVS["FrozenLake"]["env_config"])
    env.reset(seed=0)
    steps, episodes = 0, 0
    cpu = time.process_time()
    stop_at = time.perf_counter() + seconds
    while steps == 0 or time.perf_counter() < stop_at:
        for _ in range(1000):
            _, _, terminated, truncated, _ = env.step(steps & 3)
            steps += 1
            if terminated or truncated:
                episodes += 1
                env.reset(seed=episodes)
    return (time.process_time() - cpu) / steps


async def run(urls: list[str], per_server: int, args: argparse.Namespace) -> None:
    few = [OpenEnvEnv(base_urls=urls, max_sessions=per_server) for _ in range(args.few)]
    await play(few[:1], args.warmup_seconds)  # warm: the schema read, connections
    steps, wall, cpu, _ = await play(few, args.seconds)
    for env in few:
        env.close()
    remote_us = cpu / steps * 1e6
    local_us = local_cpu_per_step(args.local_seconds) * 1e6
    print(f"{args.few} remote envs: {steps / wall:,.0f} steps/s, producer CPU "
          f"{remote_us:.0f} us per remote step; a local FrozenLake step {local_us:.1f} us "
          f"(remote/local {remote_us / local_us:,.0f}x)")
    many = [OpenEnvEnv(base_urls=urls, max_sessions=per_server) for _ in range(args.envs)]
    steps, wall, cpu, peak = await play(many, args.seconds)
    for env in many:
        env.close()
    print(f"{args.envs} remote envs on one producer ({len(urls)} servers x {per_server} "
          f"sessions): {steps / wall:,.0f} steps/s, producer CPU {cpu / steps * 1e6:.0f} us "
          f"per step ({cpu / wall:.0%} of a core), peak {peak} sessions open")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--envs", type=int, default=1000)
    parser.add_argument("--few", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="each remote part's time (at least an episode per env)")
    parser.add_argument("--warmup-seconds", type=float, default=0.5,
                        help="one env plays first, untimed (at least an episode)")
    parser.add_argument("--local-seconds", type=float, default=1.0,
                        help="the local FrozenLake loop's time (at least 1000 steps)")
    args = parser.parse_args()
    per_server = -(-args.envs // args.servers)
    servers = [EnvServer(free_port(), per_server) for _ in range(args.servers)]
    try:
        for server in servers:
            server.start()
        asyncio.run(run([s.url for s in servers], per_server, args))
    finally:
        for server in servers:
            server.kill()


if __name__ == "__main__":
    main()
