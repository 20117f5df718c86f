"""The trajectory store: every batch handed to the trainer kept as one Parquet file.

`Batcher(..., record=DIR)` (and `rollstream train --record DIR`) writes each batch `get_batch`
returns to `DIR/batch-000017-train.parquet`: one row per trajectory, with the columns a
person filters on (`traj_id`, `tag`, `group_id`, `episode_id`, `member`, `seed`, the
versions, `episode_score`, `success`, `num_actions`) and the whole trajectory message as it
came from Redis (`trajectory`, msgpack bytes: observations, actions, replies, token ids,
logprobs, exactly). The batch's mode, version, round and metrics, and the run's resolved
config (as `rollstream config show` prints it, a password masked), sit in the file's schema
metadata under `rollstream`.

A file is written to a hidden temporary name in the same folder and hard-linked into place
(`os.link`: atomic on POSIX like a rename, and it fails on a name that exists, so several
batchers recording into one folder never overwrite each other): a crash mid-write leaves
at most a `.batch-*.tmp` file, which every reader skips, never half a batch under a batch's
name. Numbers continue after
the highest already in the folder, so a trainer that restarts with the same `--record`
appends.

`read_batch(path)` reads one file back; `batch_files(path)` lists a folder's (or names the
one file) in order; `RecordedBatcher` (`Batcher.from_records`) hands them out again.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.codec import decode_trajectory, encode_trajectory
from schemas.errors import ConfigError, DecodeError

FORMAT = "rollstream-batch/1"
META_KEY = b"rollstream"
CLAIM_TRIES = 100  # batch numbers a write tries when other writers took them meanwhile
_NAME = re.compile(r"^batch-(\d+)-(train|val)\.parquet$")

# the per-trajectory columns next to the message itself: (name, arrow type name)
COLUMNS = (("traj_id", "string"), ("tag", "string"), ("mode", "string"),
           ("group_id", "int64"), ("episode_id", "int64"), ("member", "int64"),
           ("seed", "int64"), ("version_start", "int64"), ("version_end", "int64"),
           ("episode_score", "float64"), ("success", "bool_"), ("num_actions", "int64"))


class StoreError(ConfigError):
    """A path that is not a trajectory store (or not one of its files)."""


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("the trajectory store needs pyarrow: pip install "
                          "'rollstream[store]'") from None
    return pa, pq


@dataclass
class RecordedBatch:
    """One stored batch: what the trainer was handed, and the run's config."""

    path: str
    mode: str
    version: int
    round: int
    metrics: dict[str, float]
    trajectories: list[dict[str, Any]]
    config_yaml: str | None


class BatchStore:
    """Writes batches into folder `path` (made if missing), one file each."""

    def __init__(self, path: str | os.PathLike[str], config_yaml: str | None = None):
        _pyarrow()  # refused at construction, not at the first batch
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"record={str(path)!r} is a file; the store is a folder")
        self.path.mkdir(parents=True, exist_ok=True)
        self.config_yaml = config_yaml
        taken = [int(m.group(1)) for name in os.listdir(self.path)
                 if (m := _NAME.match(name))]
        self.next = max(taken, default=-1) + 1
        self.written = 0

    def write(self, batch: Any) -> Path:
        """Store `batch` (a `Batch`); returns the file's path. A number another writer took
        meanwhile (several batchers recording into one folder) is never overwritten: the
        file takes the next free one."""
        data = table_bytes(batch.mode, batch.version, batch.round, batch.metrics,
                           batch.trajectories, self.config_yaml)
        for _ in range(CLAIM_TRIES):
            final = self.path / f"batch-{self.next:06d}-{batch.mode}.parquet"
            self.next += 1
            if write_atomic(final, data, exclusive=True):
                self.written += 1
                return final
        raise OSError(f"{self.path}: no free batch number after {CLAIM_TRIES} tries")


def table_bytes(mode: str, version: int, round_: int, metrics: dict[str, float],
                trajectories: list[dict[str, Any]], config_yaml: str | None) -> bytes:
    """One batch as the bytes of a Parquet file."""
    pa, pq = _pyarrow()
    columns: dict[str, Any] = {}
    for name, kind in COLUMNS:
        columns[name] = pa.array([traj.get(name) for traj in trajectories],
                                 type=getattr(pa, kind)())
    columns["trajectory"] = pa.array([encode_trajectory(t) for t in trajectories],
                                     type=pa.binary())
    meta = {"format": FORMAT, "mode": mode, "version": int(version), "round": int(round_),
            "metrics": {k: float(v) for k, v in metrics.items()}, "config": config_yaml}
    table = pa.table(columns).replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def write_atomic(final: Path, data: bytes, *, exclusive: bool = False) -> bool:
    """Write `data` to `final` through a hidden temporary file and a rename: readers see the
    whole file or none (fsync before the rename, so a power cut cannot reorder them). With
    `exclusive`, an existing `final` is left alone (a hard link, which fails on an existing
    name, instead of the rename) and the answer is False."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if not exclusive:
            os.replace(tmp, final)
            return True
        try:
            os.link(tmp, final)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def batch_files(path: str | os.PathLike[str]) -> list[Path]:
    """The batch files of a store folder in order, or the one file named; `StoreError` for a
    path that does not exist or a folder with no batch file."""
    where = Path(path)
    if where.is_file():
        return [where]
    if not where.is_dir():
        raise StoreError(f"{str(path)!r}: no such file or folder")
    found = sorted((int(m.group(1)), where / name) for name in os.listdir(where)
                   if (m := _NAME.match(name)))
    if not found:
        raise StoreError(f"{str(path)!r}: no batch files (batch-NNNNNN-MODE.parquet) in it; "
                         "is it a --record folder?")
    return [file for _, file in found]


def read_batch(path: str | os.PathLike[str]) -> RecordedBatch:
    """Read one stored batch; `StoreError` naming the file when it is not one."""
    pa, pq = _pyarrow()
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise StoreError(f"{str(path)!r} is not a rollstream batch file (not Parquet: "
                         f"{str(exc).splitlines()[0]})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    try:
        meta = json.loads(raw) if raw is not None else {}
    except ValueError:
        meta = {}
    if meta.get("format") != FORMAT or "trajectory" not in table.column_names:
        raise StoreError(f"{str(path)!r} is Parquet but not a rollstream batch file (no "
                         f"{FORMAT} metadata)")
    try:
        trajs = [decode_trajectory(data) for data in table.column("trajectory").to_pylist()]
    except DecodeError as exc:
        raise StoreError(f"{str(path)!r}: a stored trajectory does not decode: {exc}") from None
    return RecordedBatch(str(path), meta["mode"], int(meta["version"]), int(meta["round"]),
                         dict(meta["metrics"]), trajs, meta.get("config"))
