"""Reset time per seed tag, and FrozenLake steps per second under a random policy.

    python bench/bench_env_reset.py [--seeds N] [--step-seconds S]

Each of the four seed tags is built with its `DEFAULT_CUSTOM_ENVS` settings through
`make_env` (as a producer builds it) and reset with seeds 0..N-1; the p50/p99 of those reset
times are printed in milliseconds. Then FrozenLake is stepped with uniformly random actions
(reset on every episode end) for a few seconds and the rate printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from producers.envs import make_env  # noqa: E402
from schemas.envspec import DEFAULT_CUSTOM_ENVS, FROZENLAKE_ID  # noqa: E402


def reset_times_ms(tag: str, seeds: int) -> np.ndarray:
    """Wall time of `reset(seed=s)` for s in 0..seeds-1, in milliseconds."""
    spec = DEFAULT_CUSTOM_ENVS[tag]
    env = make_env(spec["env_id"], spec["env_config"])
    times = np.empty(seeds)
    for seed in range(seeds):
        start = time.perf_counter()
        env.reset(seed=seed)
        times[seed] = time.perf_counter() - start
    return times * 1000.0


def frozenlake_steps_per_s(seconds: float) -> tuple[float, int]:
    """Random-policy steps per second on the FrozenLake tag (at least 1000 steps), and the
    number of episodes."""
    env = make_env(FROZENLAKE_ID, DEFAULT_CUSTOM_ENVS["FrozenLake"]["env_config"])
    actions = np.random.default_rng(0).integers(0, 4, size=1 << 16).tolist()
    episodes = 0
    steps = 0
    env.reset(seed=0)
    start = time.perf_counter()
    deadline = start + seconds
    while steps == 0 or time.perf_counter() < deadline:
        for _ in range(1000):
            _, _, terminated, truncated, _ = env.step(actions[steps & 0xFFFF])
            steps += 1
            if terminated or truncated:
                episodes += 1
                env.reset(seed=episodes)
    return steps / (time.perf_counter() - start), episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=2000, help="resets per tag")
    parser.add_argument("--step-seconds", type=float, default=3.0, help="FrozenLake stepping")
    args = parser.parse_args()

    print(f"reset time over seeds 0..{args.seeds - 1} (ms)")
    for tag in DEFAULT_CUSTOM_ENVS:
        times = reset_times_ms(tag, args.seeds)
        p50, p99 = np.percentile(times, [50, 99])
        print(f"  {tag:<26} p50 {p50:7.3f}  p99 {p99:7.3f}  max {times.max():7.3f}")
    rate, episodes = frozenlake_steps_per_s(args.step_seconds)
    print(f"FrozenLake random policy: {rate:,.0f} steps/s (episodes reset included: {episodes:,})")


if __name__ == "__main__":
    main()
