"""`rollstream replay`: a determinism check of recorded trajectories.

Each stored trajectory (consumer/store.py) is played again on a fresh local env of its tag,
built by the producers' env factory (`producers.envs.build_env`) from the config the file
records: `reset(seed=...)` with the recorded seed, then every recorded step in order, the
model's recorded reply for a text env that parses replies (`step_text`, as the producer
does) and the recorded action otherwise. The observation after reset and after each step and
each step's reward are compared with the record; every difference is reported.

No model server is contacted (the replies are in the record) and no env outside this
process: a tag whose env cannot be built here (a remote env, a missing package or dataset)
is named in one line and left out. Failed trajectories (the env kept raising) have no steps
and are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from consumer.store import RecordedBatch
from schemas.codec import pack, unpack
from schemas.config import RolloutConfig
from schemas.errors import ConfigError


@dataclass
class Difference:
    """One place where the replay does not match the record."""

    file: str
    traj_id: str
    step: int  # -1: the observation after reset
    what: str  # "reward", "observation", "terminated"
    recorded: Any
    replayed: Any

    def line(self) -> str:
        where = "after reset" if self.step < 0 else f"step {self.step}"
        return (f"{self.file}: {self.traj_id} {where}: {self.what} differs: recorded "
                f"{_short(self.recorded)}, replayed {_short(self.replayed)}")


@dataclass
class ReplayReport:
    trajectories: int = 0  # replayed
    steps: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # tag -> why it was not replayed
    failed: int = 0  # failed trajectories (no steps), skipped
    differences: list[Difference] = field(default_factory=list)


def same(recorded: Any, replayed: Any) -> bool:
    """Equal as the record stores it: `replayed` goes through the same msgpack round trip
    (numpy scalars become numbers, arrays keep dtype and shape), then compared exactly."""
    return _equal(recorded, unpack(pack(replayed)))


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b or (isinstance(a, int | float) and
                                             isinstance(b, int | float) and
                                             not isinstance(a, bool) and a == b)


def _short(value: Any) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


class Replayer:
    """Replays the batches of one config: one env per tag, built when first needed."""

    def __init__(self, config_yaml: str | None):
        if not config_yaml:
            raise ConfigError("the batch file records no config: it cannot be replayed")
        self.config = RolloutConfig.from_dict(yaml.safe_load(config_yaml),
                                              source="the recorded config")
        self.envs: dict[str, Any] = {}
        self._at = -1  # the step being replayed (-1: the reset)

    def env(self, tag: str, report: ReplayReport) -> Any | None:
        if tag in report.skipped:
            return None
        if tag not in self.envs:
            from producers.envs import build_env

            try:
                self.envs[tag] = build_env(self.config, tag)
            except ConfigError as exc:
                report.skipped[tag] = str(exc)
                return None
        return self.envs[tag]

    def close(self) -> None:
        for env in self.envs.values():
            env.close()

    def batch(self, recorded: RecordedBatch, report: ReplayReport) -> None:
        for traj in recorded.trajectories:
            if traj.get("failed") or not traj.get("steps"):
                report.failed += 1
                continue
            env = self.env(traj["tag"], report)
            if env is None:
                continue
            report.trajectories += 1
            diffs: list[Difference] = []
            try:
                diffs.extend(self.trajectory(env, traj))
            except Exception as exc:  # the env raised where the recorded run's did not
                diffs.append(Difference("", traj["traj_id"], self._at, "env raised", None,
                                        f"{type(exc).__name__}: {exc}"))
            for diff in diffs:
                diff.file = recorded.path
            report.differences += diffs
            report.steps += len(traj["steps"])

    def trajectory(self, env: Any, traj: dict[str, Any]) -> Iterator[Difference]:
        traj_id, steps = traj["traj_id"], traj["steps"]
        self._at = -1
        observation, _ = env.reset(seed=traj["seed"])
        if not same(steps[0]["observation"], observation):
            yield Difference("", traj_id, -1, "observation", steps[0]["observation"],
                             observation)
        text_step = getattr(env.unwrapped, "step_text", None)
        for i, step in enumerate(steps):
            self._at = i
            reply = step.get("response")
            if text_step is not None and isinstance(reply, str):
                observation, reward, terminated, truncated, _ = text_step(reply)
            else:
                observation, reward, terminated, truncated, _ = env.step(step["action"])
            if not same(step["reward"], float(reward)):
                yield Difference("", traj_id, i, "reward", step["reward"], float(reward))
            last = i == len(steps) - 1
            wanted = traj.get("final_observation") if last else steps[i + 1]["observation"]
            if not same(wanted, observation):
                yield Difference("", traj_id, i, "observation", wanted, observation)
            ended = bool(terminated or truncated)
            if ended != last and not (last and traj.get("context_full")):
                yield Difference("", traj_id, i, "end of episode", last, ended)
                return
