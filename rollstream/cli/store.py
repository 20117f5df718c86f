"""`rollstream export` and `rollstream replay`: reading a `--record` folder (the trajectory
store, consumer/store.py; the replay is rollstream/replay.py).

A path that does not exist, a folder with no batch file, or a file that is not a batch file
is a usage error: one line, exit 2. `replay` exits 1 when any reward or observation differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from rollstream.cli.errors import UsageError


def export(args: argparse.Namespace) -> int:
    """`rollstream export DIR [--format jsonl] [--out FILE]`: one JSON line per trajectory,
    with its batch's file, mode, version and round (the batch's metrics once, on its first
    trajectory's line, under `batch_metrics`)."""
    from consumer.store import batch_files, read_batch  # not at the CLI's start

    files = batch_files(args.path)
    batches = [read_batch(file) for file in files]  # every file checked before any output
    if args.out is None:
        return _write(batches, sys.stdout)
    try:
        with open(args.out, "w", encoding="utf-8") as out:
            return _write(batches, out)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: {exc.strerror}") from None


def _write(batches: list[Any], out: TextIO) -> int:
    for batch in batches:
        for i, traj in enumerate(batch.trajectories):
            line: dict[str, Any] = {"batch_file": batch.path, "batch_mode": batch.mode,
                                    "batch_version": batch.version, "batch_round": batch.round}
            if i == 0:
                line["batch_metrics"] = batch.metrics
            line["trajectory"] = traj
            out.write(json.dumps(line, default=_json_default) + "\n")
    return 0


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


def replay(args: argparse.Namespace) -> int:
    """`rollstream replay FILE_OR_DIR`: 0 when every replayed step matches, 1 otherwise."""
    from consumer.store import batch_files, read_batch
    from rollstream.replay import Replayer, ReplayReport

    files = batch_files(args.path)
    report = ReplayReport()
    replayers: dict[str | None, Replayer] = {}
    try:
        for file in files:
            recorded = read_batch(file)
            replayer = replayers.get(recorded.config_yaml)
            if replayer is None:
                replayer = replayers[recorded.config_yaml] = Replayer(recorded.config_yaml)
            replayer.batch(recorded, report)
    finally:
        for replayer in replayers.values():
            replayer.close()
    for tag, why in sorted(report.skipped.items()):
        print(f"tag {tag}: not replayed (its env cannot be built here; model servers and "
              f"remote envs are never contacted): {why}")
    for diff in report.differences[: args.max_report]:
        print(diff.line())
    more = len(report.differences) - args.max_report
    if more > 0:
        print(f"... and {more} more differences")
    verdict = "identical" if not report.differences else \
        f"{len(report.differences)} differences"
    print(f"replayed {report.trajectories} trajectories, {report.steps} steps from "
          f"{len(files)} batch file(s): {verdict}"
          + (f" ({report.failed} failed trajectories without steps skipped)"
             if report.failed else ""))
    return 1 if report.differences else 0
