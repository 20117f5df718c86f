"""Helpers for the LLM tests: stand-in servers on loopback, plain HTTP calls, configs."""

from __future__ import annotations

import errno
import json
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from helpers import PORT_TRIES, free_port, small_config

from consumer import Batcher, ModelServers
from producers.llm.chat import turn_seed
from producers.policies import StepContext
from rollstream.fake_llm import FakeLLMOptions, FakeLLMServer
from schemas.config import RolloutConfig

MODEL = "fake-model"


def fake_llm_factory() -> Iterator[Callable[..., FakeLLMServer]]:
    """Fixture body: `start(**options)` starts a stand-in server on a thread; all are
    stopped at teardown. Use as `fake_llm = pytest.fixture(fake_llm_factory)`.

    Each listens on a `free_port()`, not on port 0: a test stops a server and starts it
    again on its port (a server that comes back), or keeps its URL as one that refuses, and
    a port from the kernel's ephemeral range is another process's for the taking meanwhile."""
    started: list[FakeLLMServer] = []

    def start(**options: Any) -> FakeLLMServer:
        for _ in range(PORT_TRIES - 1):
            try:
                server = FakeLLMServer(FakeLLMOptions(**options), port=free_port()).start()
                break
            except OSError as exc:  # the port was taken after free_port() looked
                if exc.errno != errno.EADDRINUSE:
                    raise
        else:
            server = FakeLLMServer(FakeLLMOptions(**options), port=free_port()).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def http(url: str, body: Any = None, *, headers: dict[str, str] | None = None,
         timeout_s: float = 10.0) -> tuple[int, Any]:
    """(status, decoded JSON or text) of a GET (no body) or a JSON POST."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def llm_config(base_urls: list[str], *, policy: dict[str, Any] | None = None,
               **overrides: Any) -> RolloutConfig:
    """`small_config` driven by the openai policy (short timeouts, few tokens)."""
    block = {"type": "openai", "base_urls": base_urls, "model": MODEL, "max_tokens": 64,
             "timeout_s": 5.0, "max_retries": 2, **(policy or {})}
    return small_config(policy=block, **overrides)


# -- runs against stand-in servers (tests/test_generation_control.py, test_model_servers.py)
def lake_config(server_urls: list[str], *, ratio: int = 0, batch: int = 16,
                slow_tag: bool = False, **policy: Any) -> RolloutConfig:
    """16 FrozenLake envs (4 groups of 4, 2 shards), no val. With `slow_tag`, groups 2-3 are
    the tag `Slow`, whose system prompt starts with `SLOW` (so the server can hold them)."""
    tags = ["Lake", "Slow"] if slow_tag else ["Lake"]
    lake = {"env_type": "frozen_lake", "env_config": {"size": 4, "p": 0.8, "is_slippery": False,
                                                   "max_steps": 6}}
    custom = {"Lake": lake, "Slow": {**lake, "agent_system_template": "SLOW: play well."}}
    return llm_config(server_urls, policy={"timeout_s": 60.0, **policy},
                      async_generation_ratio=ratio,
                      rollout_batch_size=batch, val_env_manager=None,
                      custom_envs={tag: custom[tag] for tag in tags},
                      train_env_manager={"num_env_groups": 4, "group_size": 4, "tags": tags})


def step_seeds(traj: dict[str, Any]) -> list[int]:
    """The request seed of each of a trajectory's turns (what the policy sent)."""
    ctx = StepContext(env=None, seed=traj["seed"], version=0, mode=traj["mode"], group_id=0,
                      episode_id=0, member=traj["member"], tag="")
    seeds = []
    for turn in range(traj["num_actions"]):
        ctx.turn = turn
        seeds.append(turn_seed(ctx))
    return seeds


def answered(server: Any) -> dict[int, dict[str, Any]]:
    """Request seed -> the server's completed answer to it (each turn is answered once).
    (The server's deques are copied with `list()` first: one C call, safe while it runs.)"""
    done = [a for a in list(server.answers) if a["finish_reason"] != "abort"]
    counts = Counter(a["seed"] for a in done)
    assert max(counts.values()) == 1, "a turn was generated twice"
    return {a["seed"]: a for a in done}


def steps_of(batches: list[Any]) -> list[tuple[dict[str, Any], int]]:
    """(step, its request seed) of every step of the batches."""
    return [(step, seed) for batch in batches for traj in batch.trajectories
            for step, seed in zip(traj["steps"], step_seeds(traj), strict=True)]


def run_steps(batcher: Batcher, servers: ModelServers, steps: int) -> list[Any]:
    """The documented trainer step: get_batch, (train), update the servers, ack, publish."""
    batches = []
    for _ in range(steps):
        batch = batcher.get_batch(timeout_s=30)
        batches.append(batch)
        version = batcher.version + 1
        servers.update(version, f"/ckpt/{version}")
        batcher.ack(batch)
        batcher.publish_version(version)
    return batches


def run_pool(urls: list[str], scenario: Any, **kwargs: Any) -> Any:
    """Run `await scenario(pool)` with a started `ServerPool` over `urls` (timeout 5 s and
    2 retries unless given), closed afterwards."""
    import asyncio

    from producers.llm.pool import ServerPool

    kwargs.setdefault("timeout_s", 5.0)
    kwargs.setdefault("max_retries", 2)

    async def main() -> Any:
        pool = ServerPool(urls, **kwargs)
        await pool.start()
        try:
            return await scenario(pool)
        finally:
            await pool.close()

    return asyncio.run(main())


def discarded(reason: str = "aborted") -> int:
    """Generated tokens this process's producers counted thrown away for `reason`."""
    from producers import metrics

    return sum(n for (_, why), n in list(metrics.LLM.discarded.items()) if why == reason)
