"""`Batcher.from_records(PATH)`: recorded batches handed to a trainer with no Redis, no
producers and no servers, for debugging a trainer on the very batches a run gave it.

The object has the trainer-facing API of `Batcher` (`get_batch`, `ack`, `publish_version`,
`version`, `config`, `totals`, `close`, `with`): `get_batch(mode)` returns the next stored batch of
that mode, in the order they were recorded, as the same `Batch` (arrays, `turn_tokens`,
`trajectory_tokens`, `metrics`); once they are used up it raises `RecordsExhausted` (a
`BatchTimeout`, so a loop that stops on a timeout stops here too).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import yaml

from consumer.batch import Batch
from consumer.store import batch_files, read_batch
from schemas.config import RolloutConfig
from schemas.errors import BatchTimeout, ConfigError


class RecordsExhausted(BatchTimeout):
    """Every recorded batch of the mode has been handed out."""


class RecordedBatcher:
    """Recorded batches in order (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        self._files = batch_files(path)  # StoreError for a missing or empty folder
        self._next: dict[str, int] = defaultdict(int)
        self._by_mode: dict[str, list[str]] = defaultdict(list)
        for file in self._files:
            mode = "val" if file.name.endswith("-val.parquet") else "train"
            self._by_mode[mode].append(str(file))
        self._version = 0
        self._config: RolloutConfig | None = None
        self._closed = False
        self.totals: dict[str, float] = defaultdict(float)
        self.handed = 0

    @property
    def config(self) -> RolloutConfig | None:
        """The run's config as the first file records it (None if it records none)."""
        if self._config is None:
            text = read_batch(self._files[0]).config_yaml
            if text:
                self._config = RolloutConfig.from_dict(yaml.safe_load(text),
                                                       source=str(self._files[0]))
        return self._config

    @property
    def version(self) -> int:
        """The version of the batch last handed out, or the trainer's last publish."""
        return self._version

    def __len__(self) -> int:
        return len(self._files)

    def get_batch(self, mode: str = "train", n: int | None = None,
                  timeout_s: float = 60.0) -> Batch:
        """The next recorded `mode` batch (`n`, if given, must be its size)."""
        if self._closed:
            raise ConfigError("get_batch on a closed RecordedBatcher")
        if mode not in ("train", "val"):
            raise ConfigError(f"mode must be 'train' or 'val', not {mode!r}")
        files = self._by_mode[mode]
        i = self._next[mode]
        if i >= len(files):
            raise RecordsExhausted(f"all {len(files)} recorded {mode} batches of "
                                   f"{self.path} were handed out")
        recorded = read_batch(files[i])
        if n is not None and n != len(recorded.trajectories):
            raise ConfigError(f"get_batch n={n}: the recorded {mode} batch {files[i]} holds "
                              f"{len(recorded.trajectories)} trajectories")
        self._next[mode] = i + 1
        self._version = max(self._version, recorded.version)
        for name, value in recorded.metrics.items():
            if name.startswith("scheduler/") and name.endswith("_dropped"):
                self.totals[name] += value
        self.handed += 1
        return Batch(recorded.mode, recorded.version, recorded.trajectories, [],
                     dict(recorded.metrics), round=recorded.round)

    def ack(self, batch: Batch) -> None:
        """Nothing to acknowledge: the records stay as they are."""
        if not isinstance(batch, Batch):
            raise ConfigError(f"ack takes the Batch that get_batch returned, not "
                              f"{type(batch).__name__}")

    def publish_version(self, version: int | None = None, weights: bytes | None = None) -> int:
        """Note the trainer's version (no producer listens); returns it."""
        self._version = self._version + 1 if version is None else int(version)
        return self._version

    def stop_run(self) -> None:
        """Nothing runs."""

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> RecordedBatcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
