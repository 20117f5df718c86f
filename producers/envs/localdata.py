"""Question datasets from disk, for GEM's math and QA envs: rollstream never downloads one.

`dataset_name` is ROLL's key (`roll/datasets/dataset.py` `create_local_dataset`; GEM hands it
to `datasets.load_dataset`, which takes a local path too), and is found here as:
1. a path: a `.jsonl`, `.json` (a list of records) or `.parquet` file (parquet needs pyarrow),
   or a folder of such files (searched recursively, read in name order);
2. a hub name (`axon-rl/GSM-8k`) whose copy is in the Hugging Face cache on this machine
   (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`), as
   `huggingface-cli download NAME --repo-type dataset` leaves it;
else a one-line `ConfigError` naming the dataset and the key to set.

Splits follow the hub's file naming: a file belongs to the split its name (or a folder's
name) starts with (`train-00000-of-00001.parquet`, `test.jsonl`, `validation/...`); files
that name no split are left out when some do, and are all `train` when none does. With
`split` unset: the only split, else `train` (GEM refuses a dataset of several splits without
one; ROLL's own loader reads `train`).
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from schemas.errors import ConfigError

EXTENSIONS = (".jsonl", ".json", ".parquet")
SPLIT_WORDS = ("train", "test", "validation", "valid", "val", "dev", "eval")
_LEADING_WORD = re.compile(r"[A-Za-z0-9]+(?:_[A-Za-z]+)*")


def hub_cache_dir() -> Path:
    """Where the Hugging Face hub keeps its downloads on this machine."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def hub_snapshot(name: str) -> Path | None:
    """The cached copy of the hub dataset `name` (the revision `refs/main` names, else the
    newest snapshot), or None."""
    if name.count("/") != 1:
        return None
    root = hub_cache_dir() / ("datasets--" + name.replace("/", "--"))
    snapshots = root / "snapshots"
    if not snapshots.is_dir():
        return None
    main = root / "refs" / "main"
    if main.is_file():
        chosen = snapshots / main.read_text().strip()
        if chosen.is_dir():
            return chosen
    found = sorted((p for p in snapshots.iterdir() if p.is_dir()),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def locate(dataset_name: str, task: str) -> Path:
    """The file or folder holding `dataset_name`; a one-line `ConfigError` when there is none."""
    if not isinstance(dataset_name, str) or not dataset_name.strip():
        raise ConfigError(f"{task} needs env_config.dataset_name: a local .jsonl/.json/.parquet "
                          "file or folder of them, or a hub dataset in the local cache")
    path = Path(dataset_name).expanduser()
    if path.exists():
        return path
    snapshot = hub_snapshot(dataset_name)
    if snapshot is not None:
        return snapshot
    raise ConfigError(
        f"{task} needs the dataset {dataset_name!r} on disk, and it is neither a path nor in "
        f"the Hugging Face cache ({hub_cache_dir()}): set env_config.dataset_name to a local "
        ".jsonl/.json/.parquet file or a folder of them (e.g. what `huggingface-cli download "
        f"{dataset_name} --repo-type dataset --local-dir DIR` writes)")


def split_of(path: Path, root: Path, wanted: str | None = None) -> str | None:
    """The split a data file's name says, by the hub's naming: the leading word of its name,
    else of a folder's name, when it is a split word (or the split `wanted`); else None."""
    names = set(SPLIT_WORDS) | ({wanted.lower()} if wanted else set())
    for part in reversed(path.relative_to(root).parts):
        word = _LEADING_WORD.match(part)
        if word and word.group(0).lower() in names:
            return word.group(0).lower()
    return None


def data_files(path: Path, wanted: str | None = None) -> dict[str, list[Path]]:
    """The data files under `path` by split, as the hub resolves them: when some file names
    a split, the files that name none are left out; when none does, all are `train`. A single
    file is its own split."""
    if path.is_file():
        return {split_of(path, path.parent, wanted) or "train": [path]}
    files: dict[str | None, list[Path]] = {}
    for found in sorted(p for p in path.rglob("*") if p.is_file()
                        and p.suffix in EXTENSIONS and ".cache" not in p.parts):
        files.setdefault(split_of(found, path, wanted), []).append(found)
    unnamed = files.pop(None, [])
    return {str(k): v for k, v in files.items()} if files else \
        ({"train": unnamed} if unnamed else {})


def read_file(path: Path) -> list[dict[str, Any]]:
    """The records of one data file."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(f"reading {path} needs pyarrow (pip install pyarrow), or "
                              "convert the dataset to .jsonl") from None
    try:
        if path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as handle:
                return [json.loads(line) for line in handle if line.strip()]
        if path.suffix == ".parquet":
            return list(pq.read_table(path).to_pylist())
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError(f"cannot read dataset file {path}: {exc}") from None
    if not isinstance(records, list):
        raise ConfigError(f"dataset file {path} must hold a list of records")
    return records


@lru_cache(maxsize=16)
def _records(path: str, split: str | None, stamp: tuple[float, ...]) -> tuple[dict, ...]:
    """Every record of a split, read once per process (`stamp`: the files' mtimes, so a
    changed file is read again). Shared by every env of the dataset: never modified."""
    files = data_files(Path(path), split)
    if not files:
        raise ConfigError(f"dataset {path} holds no .jsonl, .json or .parquet file")
    if split is None:
        split = next(iter(files)) if len(files) == 1 else "train"
    split = split.lower()
    if split not in files:
        raise ConfigError(f"dataset {path} has no split {split!r} (splits: "
                          f"{', '.join(sorted(files))}); set env_config.split")
    records: list[dict] = []
    for file in files[split]:
        records.extend(read_file(file))
    return tuple(records)


def load_records(dataset_name: str, split: str | None, keys: tuple[str, ...],
                 task: str) -> tuple[dict, ...]:
    """The records of `dataset_name`'s split, each checked to hold `keys`."""
    path = locate(dataset_name, task)
    stamp = tuple(p.stat().st_mtime for ps in data_files(path, split).values() for p in ps)
    return _checked(str(path), split, stamp, keys, task)


@lru_cache(maxsize=16)
def _checked(path: str, split: str | None, stamp: tuple[float, ...], keys: tuple[str, ...],
             task: str) -> tuple[dict, ...]:
    """`_records`, checked once per process and set of keys."""
    records = _records(path, split, stamp)
    if not records:
        raise ConfigError(f"{task}: dataset {path} (split {split or 'default'}) is empty")
    for index, record in enumerate(records):
        missing = [key for key in keys if not isinstance(record, dict) or key not in record]
        if missing:
            columns = ", ".join(record) if isinstance(record, dict) else type(record).__name__
            raise ConfigError(f"{task}: record {index} of {path} has no {', '.join(missing)} "
                              f"(columns: {columns}); set env_config.question_key / answer_key")
    return records
