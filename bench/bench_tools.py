"""Tool calls: what a tool call costs the producer, and what the python sandbox costs to start.

    python bench/bench_tools.py [--episodes 200] [--calls 40] [--concurrency 16]

1. Producer CPU per tool call. The openai policy answers `--episodes` rg:basic_arithmetic
   questions against a `rollstream fake-llm` process (no latency), `--concurrency` at a time,
   three ways: without tools (one reply each); with an in-process env tool (`call_tool`: a
   call, its tool message, a second reply); with the python tool (the same, the call run in
   the sandbox). This process's CPU (`time.process_time`: the sandbox's own CPU is the
   child's and not counted; spawning it is) per episode each way; the difference to the
   no-tool run is the producer's CPU per tool call.
2. The sandbox's start cost per call: `run_python("pass")` one at a time, with `unshare -rnp --fork`
   and without (`network: true`), against a bare `python -I -c pass` subprocess: wall time and
   CPU (this process's and its children's) per call.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from producers.envs import build_env  # noqa: E402
from producers.envs.reasoning import reasoning_gym  # noqa: E402
from producers.policies import StepContext, make_policy  # noqa: E402
from producers.tools.sandbox import network_isolation, run_python  # noqa: E402
from schemas.config import RolloutConfig  # noqa: E402
from schemas.tools import PYTHON_SCHEMA, PythonLimits  # noqa: E402


def start_server() -> tuple[subprocess.Popen, str]:
    """A `rollstream fake-llm` process; (process, base URL). While it starts, this process
    imports reasoning_gym (a second or so, which the first env built would take)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "fake-llm", "--port", "0", "--latency-s", "0",
         "--malformed-share", "0"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        reasoning_gym()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    line = proc.stdout.readline()
    if not line.startswith("fake-llm: serving"):
        proc.kill()
        raise SystemExit(f"the stand-in server did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


def config(base_url: str, tools: dict[str, Any] | None) -> RolloutConfig:
    tag: dict[str, Any] = {"env_type": "rg:basic_arithmetic", "env_config": {"size": 500}}
    if tools is not None:
        tag["tools"] = tools
    return RolloutConfig.model_validate({
        "rollout_batch_size": 8, "async_generation_ratio": 0, "seed": 7,
        "train_env_manager": {"num_env_groups": 8, "group_size": 1, "tags": ["Math"]},
        "val_env_manager": {"num_env_groups": 8, "group_size": 1, "tags": ["Math"]},
        "custom_envs": {"Math": tag},
        "policy": {"type": "openai", "base_urls": [base_url], "model": "fake-model",
                   "max_tokens": 256}})


async def play(cfg: RolloutConfig, episodes: int, concurrency: int,
               env_tool: bool) -> tuple[float, int, float]:
    """(CPU seconds, tool calls, wall seconds) of `episodes` questions."""
    policy = make_policy(cfg.policy)
    await policy.start()
    envs = [build_env(cfg, "Math") for _ in range(concurrency)]
    if env_tool:
        for env in envs:
            env.unwrapped.call_tool = lambda name, arguments: "4\n"
    calls = 0

    async def one(env: Any, k: int) -> None:
        nonlocal calls
        obs, _ = env.reset(seed=k)
        ctx = StepContext(env=env, seed=k, version=0, mode="train", group_id=k, episode_id=k,
                          member=0, tag="Math")
        _, turn = await policy.act(obs, ctx)
        calls += turn.extra.get("tool_calls", 0)

    await one(envs[0], 10**6)  # warm: the first request, the dataset, the first sandbox
    calls = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for start in range(0, episodes, concurrency):
        await asyncio.gather(*(one(envs[i], start + i)
                               for i in range(min(concurrency, episodes - start))))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await policy.close()
    return cpu, calls, wall


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def sandbox_starts(calls: int, network: bool) -> tuple[float, float]:
    """(wall ms, CPU ms incl. children) per `run_python("pass")`."""
    limits = PythonLimits(network=network)
    await run_python("pass", limits)
    cpu0, kids0, wall0 = time.process_time(), children_cpu(), time.perf_counter()
    for _ in range(calls):
        await run_python("pass", limits)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0 + children_cpu() - kids0
    return wall / calls * 1000, cpu / calls * 1000


def bare_starts(calls: int) -> tuple[float, float]:
    subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
    cpu0, kids0, wall0 = time.process_time(), children_cpu(), time.perf_counter()
    for _ in range(calls):
        subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
    wall = time.perf_counter() - wall0
    return wall / calls * 1000, (time.process_time() - cpu0 + children_cpu() - kids0) / calls \
        * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--calls", type=int, default=40, help="sandbox starts per variant")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if args.episodes < 1 or args.calls < 1 or args.concurrency < 1:
        parser.error("--episodes, --calls and --concurrency must be >= 1")
    proc, base_url = start_server()
    try:
        runs = {
            "no tools": play(config(base_url, None), args.episodes, args.concurrency, False),
            "env tool (in process)": play(config(base_url, {"functions": [PYTHON_SCHEMA]}),
                                          args.episodes, args.concurrency, True),
            "python tool (sandbox)": play(config(base_url, {"functions": ["python"]}),
                                          args.episodes, args.concurrency, False),
        }
        print(f"producer CPU, {args.episodes} questions, {args.concurrency} at a time "
              "(fake-llm in its own process):")
        print("| variant | tool calls | CPU ms / episode | CPU ms / tool call (over no tools) "
              "| wall s |")
        print("|---|---|---|---|---|")
        base = 0.0
        for name, coro in runs.items():
            cpu, calls, wall = asyncio.run(coro)
            per_episode = cpu / args.episodes * 1000
            if not calls:
                base = per_episode
                extra = "-"
            else:
                extra = f"{(cpu / args.episodes * 1000 - base) * args.episodes / calls:.2f} " \
                        f"({per_episode / base:.2f}x an episode without)"
            print(f"| {name} | {calls} | {per_episode:.2f} | {extra} | {wall:.2f} |")
    finally:
        proc.terminate()
        proc.wait(10)
    why = asyncio.run(network_isolation())
    print(f"\nsandbox start cost per call ({args.calls} calls, one at a time; unshare -rnp: "
          f"{'works' if not why else 'unavailable: ' + why}):")
    print("| variant | wall ms / call | CPU ms / call (incl. children) | wall vs bare python |")
    print("|---|---|---|---|")
    bare_wall, bare_cpu = bare_starts(args.calls)
    rows = [("bare python -I -c pass", bare_wall, bare_cpu)]
    rows.append(("run_python, network: true", *asyncio.run(sandbox_starts(args.calls, True))))
    if not why:
        rows.append(("run_python, unshare -rnp --fork", *asyncio.run(sandbox_starts(args.calls,
                                                                             False))))
    for name, wall, cpu in rows:
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {wall / bare_wall:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
