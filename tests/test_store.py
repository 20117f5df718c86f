"""The trajectory store (consumer/store.py): recorded runs read back by `rollstream export`,
replayed by `rollstream replay` (rollstream/replay.py) and handed out again by
`Batcher.from_records`; and the figures of issue 33 (staleness distribution, weight-sync
pause, train/inference mismatch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis

pytest.importorskip("pyarrow")

from helpers import ROOT, run_cli, run_cli_here, small_config  # noqa: E402
from llm_helpers import fake_llm_factory  # noqa: E402

from consumer import Batcher  # noqa: E402
from consumer.batch import batch_metrics  # noqa: E402
from consumer.kl import rollout_kl  # noqa: E402
from consumer.metrics import batcher_families  # noqa: E402
from consumer.records import RecordsExhausted  # noqa: E402
from consumer.servers import ModelServers  # noqa: E402
from consumer.state import BatcherStats  # noqa: E402
from consumer.store import batch_files, read_batch, table_bytes, write_atomic  # noqa: E402

fake_llm = pytest.fixture(fake_llm_factory)


def record_batches(r: redis.Redis, run: str, folder: Path, producer_thread, steps: int = 2,
                   **overrides) -> list:
    """A short run of the random policy whose Batcher records every batch into `folder`;
    returns the batches the trainer was handed."""
    batcher = Batcher(r, small_config(**overrides), run=run, record=folder)
    producer_thread()
    handed = []
    try:
        for _ in range(steps):
            batch = batcher.get_batch("train", timeout_s=30)
            handed.append(batch)
            batcher.ack(batch)
            batcher.publish_version()
    finally:
        batcher.close()
    return handed


def rewrite(path: Path, change) -> None:
    """Rewrite a stored batch with `change(trajectories)` applied (a tampered record)."""
    batch = read_batch(path)
    change(batch.trajectories)
    write_atomic(path, table_bytes(batch.mode, batch.version, batch.round, batch.metrics,
                                   batch.trajectories, batch.config_yaml))


def test_a_recorded_train_run_round_trips_through_export_and_replays(
        r, run, redis_url, tmp_path, producer_thread):
    """`rollstream train --record DIR` (a real process) keeps one Parquet file per batch with
    its version and metrics; `export` gives every trajectory back, and `replay` finds the
    FrozenLake episodes identical."""
    config = small_config()
    path = tmp_path / "lake.yaml"
    path.write_text(config.to_json())
    Batcher(r, config, run=run).close()
    producer_thread()
    folder = tmp_path / "rec"
    out = subprocess.run(
        [sys.executable, "-m", "rollstream", "train", "--config", str(path), "--redis-url",
         redis_url, "--run", run, "--steps", "3", "--timeout-s", "30", "--record",
         str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    files = batch_files(folder)
    assert [f.name for f in files] == [f"batch-00000{i}-train.parquet" for i in range(3)]
    batches = [read_batch(f) for f in files]
    assert [b.version for b in batches] == [0, 1, 2]
    assert all(len(b.trajectories) == 16 for b in batches)
    assert all(b.metrics["scheduler/staleness/lag_0"] == 16 for b in batches)
    exported = tmp_path / "out.jsonl"
    done = run_cli("export", str(folder), "--out", str(exported))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(lines) == 48
    assert [x["trajectory"]["traj_id"] for x in lines] == \
        [t["traj_id"] for b in batches for t in b.trajectories]
    assert [x["batch_version"] for x in lines] == [v for v in (0, 1, 2) for _ in range(16)]
    first = lines[0]["trajectory"]
    assert first["steps"] == json.loads(json.dumps(batches[0].trajectories[0]["steps"]))
    assert lines[0]["batch_metrics"] == batches[0].metrics
    stdout = run_cli_here("export", str(files[1]))  # one file, to stdout
    assert stdout.returncode == 0 and len(stdout.stdout.splitlines()) == 16
    replay = run_cli_here("replay", str(folder))
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "replayed 48 trajectories" in replay.stdout and "identical" in replay.stdout


def test_a_replayed_sokoban_run_is_identical_and_a_tampered_one_differs(
        r, run, tmp_path, producer_thread):
    """Sokoban episodes replay step for step; a reward or an observation changed in the file
    is reported with its trajectory and step, and replay exits 1."""
    folder = tmp_path / "rec"
    record_batches(r, run, folder, producer_thread, steps=1,
                   train_env_manager={"tags": ["SimpleSokoban"]},
                   val_env_manager={"tags": ["SimpleSokoban"]})
    [file] = batch_files(folder)
    trajs = read_batch(file).trajectories
    assert trajs[0]["tag"] == "SimpleSokoban"
    a, b = [i for i, t in enumerate(trajs) if len(t["steps"]) >= 3][:2]  # two long episodes
    same = run_cli_here("replay", str(file))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "identical" in same.stdout

    def reward(trajs):
        trajs[a]["steps"][1]["reward"] += 0.5

    rewrite(file, reward)
    changed = run_cli("replay", str(folder))
    assert changed.returncode == 1, changed.stdout + changed.stderr
    traj_id = trajs[a]["traj_id"]
    assert f"{traj_id} step 1: reward differs" in changed.stdout
    assert "1 differences" in changed.stdout and "Traceback" not in changed.stderr

    def observation(trajs):
        trajs[a]["steps"][1]["reward"] -= 0.5
        grid = trajs[b]["steps"][2]["observation"]
        trajs[b]["steps"][2]["observation"] = grid[::-1] if isinstance(grid, str) \
            else np.flip(grid).copy()

    rewrite(file, observation)
    moved = run_cli_here("replay", str(file))
    assert moved.returncode == 1
    traj_id = trajs[b]["traj_id"]
    assert f"{traj_id} step 1: observation differs" in moved.stdout


def test_from_records_hands_the_same_batches_without_redis(r, run, tmp_path, producer_thread):
    handed = record_batches(r, run, tmp_path / "rec", producer_thread, steps=3)
    with Batcher.from_records(tmp_path / "rec") as again:
        assert again.config.batch_size("train") == 16 and again.config.seed == 7
        for batch in handed:
            replayed = again.get_batch("train", n=16)
            assert (replayed.mode, replayed.version, replayed.round) == \
                (batch.mode, batch.version, batch.round)
            assert replayed.traj_ids == batch.traj_ids
            assert replayed.metrics == batch.metrics
            assert np.array_equal(replayed.rewards, batch.rewards)
            assert np.array_equal(replayed.actions, batch.actions)
            assert np.array_equal(replayed.group_index, batch.group_index)
            again.ack(replayed)
            assert again.publish_version() == batch.version + 1
        with pytest.raises(RecordsExhausted, match="all 3 recorded train batches"):
            again.get_batch("train")


def test_export_and_replay_refuse_what_is_not_a_store(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    import pyarrow as pa
    import pyarrow.parquet as pq

    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), other)
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, says in ((("export", str(tmp_path / "nope")), "no such file or folder"),
                       (("replay", str(tmp_path / "nope")), "no such file or folder"),
                       (("export", str(empty)), "no batch files"),
                       (("export", str(text)), "not Parquet"),
                       (("replay", str(other)), "not a rollstream batch file")):
        out = run_cli_here(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    bad = run_cli_here("train", "--config", "x.yaml", "--record", str(text))
    assert bad.returncode == 2


CRASH = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from consumer.batch import Batch
from consumer.store import BatchStore
from helpers import trajectory
store = BatchStore({folder!r})
batch = Batch("train", 0, [trajectory("train", 0, 0, m, group_size=2) for m in range(2)], [], {{}})
store.write(batch)
def crash(fd):  # the second file's bytes are written: the process dies before the rename
    os.kill(os.getpid(), signal.SIGKILL)
os.fsync = crash
store.write(batch)
"""


def test_a_crash_mid_write_leaves_no_partial_batch_file(tmp_path):
    """A process killed while writing a batch leaves the batches before it and at most a
    hidden temporary file, which readers skip; the next writer numbers on."""
    folder = tmp_path / "rec"
    code = CRASH.format(tests=str(ROOT / "tests"), folder=str(folder))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    names = sorted(os.listdir(folder))
    assert names[0].startswith(".batch-000001-train.parquet.")  # the crashed one, hidden
    assert names[1:] == ["batch-000000-train.parquet"]
    assert [f.name for f in batch_files(folder)] == ["batch-000000-train.parquet"]
    assert len(Batcher.from_records(folder).get_batch()) == 2
    assert run_cli_here("export", str(folder)).returncode == 0


def test_the_staleness_distribution_counts_each_lag():
    trajs = [{"tag": "t", "success": True, "num_actions": 1, "episode_score": 1.0,
              "version_start": v, "steps": []} for v in (5, 5, 4, 2, 5, 4)]
    metrics = batch_metrics(trajs, 5, {}, 0.0)
    assert {k: v for k, v in metrics.items() if "/lag_" in k} == {
        "scheduler/staleness/lag_0": 3.0, "scheduler/staleness/lag_1": 2.0,
        "scheduler/staleness/lag_3": 1.0}
    assert metrics["scheduler/staleness/max"] == 3.0
    stats = BatcherStats()
    stats.on_batch("train", trajs, 0.1, 5)
    stats.on_batch("train", trajs[:2], 0.1, 7)  # two more at lag 2
    family = next(f for f in batcher_families(_State(stats), None, None)  # before Redis
                  if f.name == "rollstream_trajectory_staleness_versions")
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert (buckets["0.0"], buckets["1.0"], buckets["2.0"], buckets["3.0"], buckets["+Inf"]) \
        == (3, 5, 7, 8, 8)


class _State:
    """The parts of a BatcherState the /metrics families read before Redis."""

    def __init__(self, stats):
        self.stats, self.version, self.modes = stats, 0, {}


def test_a_live_batch_counts_its_lags_and_the_weight_sync_pause(
        fake_llm, r, run, producer_thread):
    """`ModelServers.update` against a real (stand-in vLLM) server: its pause time goes into
    the next batch's metrics and /metrics; the batch's lag counts add up to its size."""
    from test_metrics import scrape, value

    server = fake_llm(flavor="vllm", load_time_s=0.05)
    batcher = Batcher(r, small_config(async_generation_ratio=1), run=run)
    servers = ModelServers(r, run, [server.base_url], method="vllm", batcher=batcher,
                           watch_s=None)
    page = batcher.serve_metrics(0, "127.0.0.1")
    producer_thread()
    try:
        first = batcher.get_batch("train", timeout_s=30)
        assert first.metrics["time/weight_sync_pause_s"] == 0.0
        batcher.ack(first)
        servers.update(1, "/ckpt/1")
        assert server.stats["pauses"] == 1
        assert servers.last_pause_s >= 0.05  # the server's load, inside the pause
        batcher.publish_version(1)
        second = batcher.get_batch("train", timeout_s=30)
        assert second.metrics["time/weight_sync_pause_s"] == servers.last_pause_s
        assert second.metrics["time/weight_syncs"] == 1
        lags = {k: v for k, v in second.metrics.items() if "/lag_" in k}
        assert sum(lags.values()) == 16
        assert lags == {f"scheduler/staleness/lag_{lag}": float(n) for lag, n in zip(
            *np.unique(1 - second.version_start, return_counts=True), strict=True)}
        samples = scrape(f"http://127.0.0.1:{page.port}/metrics")
        assert value(samples, "rollstream_weight_sync_pause_seconds_count") == 1
        assert value(samples, "rollstream_trajectory_staleness_versions_count",
                     mode="train") == 32
    finally:
        page.close()
        batcher.close()


def test_rollout_kl_gives_the_k1_k3_estimators_over_the_mask():
    rollout = np.log(np.array([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
    trainer = np.log(np.array([[0.25, 0.25, 0.1], [0.2, 0.2, 0.3]]))
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    figures = rollout_kl(rollout, trainer, mask)
    ratio = np.array([0.5, 1.0, 2.0])  # p/q on the three masked tokens
    assert figures["mismatch/tokens"] == 3
    assert figures["mismatch/kl_k1"] == pytest.approx(np.mean(-np.log(ratio)))
    assert figures["mismatch/kl_k3"] == pytest.approx(np.mean(ratio - 1 - np.log(ratio)))
    assert figures["mismatch/max_abs_diff"] == pytest.approx(np.log(2))
    assert rollout_kl(rollout, rollout)["mismatch/kl_k3"] == 0.0
    assert rollout_kl(rollout, trainer, np.zeros((2, 3)))["mismatch/tokens"] == 0
    with pytest.raises(ValueError, match="one shape"):
        rollout_kl(rollout, trainer[:1])


def test_an_llm_run_replays_from_its_recorded_replies_without_the_server(
        fake_llm, r, run, tmp_path, producer_thread):
    """The openai policy against the stand-in server: replay steps the text env with each
    turn's recorded reply (the server is stopped first: it is never contacted)."""
    from llm_helpers import lake_config

    server = fake_llm(latency_s=0.001)
    folder = tmp_path / "rec"
    batcher = Batcher(r, lake_config([server.base_url]), run=run, record=folder)
    producer_thread()
    try:
        batcher.ack(batcher.get_batch("train", timeout_s=60))
    finally:
        batcher.close()
    server.stop()
    [file] = batch_files(folder)
    trajs = read_batch(file).trajectories
    assert all(isinstance(s.get("response"), str) for t in trajs for s in t["steps"])
    out = run_cli_here("replay", str(folder))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "replayed 16 trajectories" in out.stdout and "identical" in out.stdout


def test_two_writers_into_one_folder_never_overwrite_each_other(tmp_path):
    """Several batchers recording into one folder: a number taken meanwhile is skipped."""
    from helpers import trajectory

    from consumer.batch import Batch
    from consumer.store import BatchStore

    first, second = BatchStore(tmp_path), BatchStore(tmp_path)  # both start at number 0

    def batch(version: int) -> Batch:
        return Batch("train", version, [trajectory("train", 0, version, m, group_size=2)
                                        for m in range(2)], [], {})

    written = [first.write(batch(0)), second.write(batch(1)), first.write(batch(2))]
    assert [p.name for p in written] == [f"batch-00000{i}-train.parquet" for i in range(3)]
    assert [read_batch(p).version for p in batch_files(tmp_path)] == [0, 1, 2]
    assert sorted(os.listdir(tmp_path)) == [p.name for p in written]  # no temporary left


def test_an_env_that_raises_in_replay_is_a_difference_not_a_traceback(r, run, tmp_path,
                                                                       producer_thread):
    """An env that raises now where the recorded run's did not is reported as a difference
    of that trajectory, and the replay goes on to the end."""
    from helpers import BrokenEnv

    from rollstream.replay import Replayer, ReplayReport

    folder = tmp_path / "rec"
    record_batches(r, run, folder, producer_thread, steps=1)
    recorded = read_batch(batch_files(folder)[0])
    replayer = Replayer(recorded.config_yaml)
    replayer.envs["FrozenLake"] = BrokenEnv()
    report = ReplayReport()
    replayer.batch(recorded, report)
    raised = [d.line() for d in report.differences if d.what == "env raised"]
    assert report.trajectories == 16 and len(raised) == 16  # each one, to the end
    first = recorded.trajectories[0]["traj_id"]
    assert f"{first} step 0: env raised differs" in raised[0], raised[0]
    assert "broken on purpose" in raised[0]
