"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

from producers.producer import Producer
from schemas.config import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]


def clean_env() -> dict[str, str]:
    """This environment without the variables that would point a command at another run."""
    return {k: v for k, v in os.environ.items()
            if k not in ("ROLLSTREAM_REDIS_URL", "REDIS_URL", "ROLLSTREAM_RUN")}


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m rollstream ARGS` from the repo root (with `clean_env()` unless given)."""
    return subprocess.run([sys.executable, "-m", "rollstream", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout,
                          env=clean_env() if env is None else env)


def small_config(**overrides: Any) -> RolloutConfig:
    """A fast FrozenLake config: 4 groups of 4, 2 shards, short leases."""
    data: dict[str, Any] = {
        "rollout_batch_size": 16,
        "async_generation_ratio": 0,
        "seed": 7,
        "lease_ttl_s": 1.5,
        "train_env_manager": {"max_env_num_per_worker": 8, "num_env_groups": 4,
                              "group_size": 4, "tags": ["FrozenLake"]},
        "val_env_manager": {"max_env_num_per_worker": 8, "num_env_groups": 8,
                            "group_size": 1, "tags": ["FrozenLake"]},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return RolloutConfig.from_dict(data)


class ProducerThread:
    """A Producer running in a thread of this process (fast to start)."""

    def __init__(self, producer: Producer):
        self.producer = producer
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(producer.run()),
                                       daemon=True)

    def start(self) -> ProducerThread:
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 20.0) -> int:
        self.producer.request_stop()
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "producer thread did not stop"
        return self.result[0]


def wait_for(predicate: Callable[[], Any], timeout_s: float = 15.0, interval_s: float = 0.05,
             what: str = "condition") -> Any:
    """Poll `predicate` until truthy; fail the test with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class BrokenEnv(gym.Env):
    """An env whose step always raises: its members must commit failed trajectories."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: int):
        raise RuntimeError("broken on purpose")


BROKEN_ENV_ID = "rollstream-test/Broken-v0"
if BROKEN_ENV_ID not in gym.registry:
    gym.register(id=BROKEN_ENV_ID, entry_point="helpers:BrokenEnv")


class SleepyEnv(gym.Env):
    """A one-step env whose step blocks for `delay_s` (as an env doing I/O would)."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay_s: float = 30.0):
        self.delay_s = delay_s

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: int):
        time.sleep(self.delay_s)
        return 1, 1.0, True, False, {"success": True}


SLEEPY_ENV_ID = "rollstream-test/Sleepy-v0"
if SLEEPY_ENV_ID not in gym.registry:
    gym.register(id=SLEEPY_ENV_ID, entry_point="helpers:SleepyEnv")
