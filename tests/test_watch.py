"""`rollstream status --json / --watch`: a live run, a killed producer, a waiting batcher, and
the warnings."""

from __future__ import annotations

import io
import json
import signal
import threading

import pytest
from helpers import run_cli as cli
from helpers import small_config, wait_for

from consumer import Batcher
from producers.metrics import WARM_S, ProducerStats
from rollstream.status.render import render_rich, render_text
from rollstream.status.snapshot import snapshot
from rollstream.status.warnings import Limits, warnings
from schemas.errors import BatchTimeout
from schemas.keys import Keys
from schemas.stats import ProducerRecord


def status_json(redis_url: str, run: str, *extra: str) -> list[dict]:
    out = cli("status", "--json", "--redis-url", redis_url, "--run", run, *extra)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def by_pid(snap: dict, pid: int) -> dict:
    return next(p for p in snap["producers"] if p.get("pid") == pid)


@pytest.mark.slow
def test_status_json_of_a_live_run_and_of_a_killed_producer(r, run, redis_url,
                                                             producer_process):
    # train: 4 shards of 4 envs, val: 1 shard; the two producers may hold 2 and 3 of them, so
    # the survivor cannot take the killed one's shards over
    config = small_config(train_env_manager={"max_env_num_per_worker": 4})
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    keep = producer_process("--max-shards", "2")
    doomed = producer_process("--max-shards", "3")
    wait_for(lambda: all(r.mget([keys.lease("train", s) for s in range(4)]
                                + [keys.lease("val", 0)])), timeout_s=30,
             what="every shard leased")
    for _ in range(2):
        batcher.ack(batcher.get_batch("train", timeout_s=30))
        batcher.publish_version()
    # each producer's stats record counts its commits (written at heartbeat cadence)
    wait_for(lambda: sum(p.get("committed", 0)
                         for p in snapshot(r, keys, config)["producers"]) >= 32,
             what="stats records with the commits")
    (snap,) = status_json(redis_url, run)
    assert snap["run"] == run and snap["version"] == 2 and snap["live_producers"] == 2
    assert {p["state"] for p in snap["producers"]} == {"live"}
    assert sorted(s for p in snap["producers"] for s in p["shards"]) == [
        "train:0", "train:1", "train:2", "train:3", "val:0"]
    alive = by_pid(snap, keep.pid)
    assert alive["rss_mb"] > 0 and alive["cpu_percent"] >= 0
    assert alive["envs"] == sum(8 if s.startswith("val") else 4 for s in alive["shards"])
    train = snap["modes"]["train"]
    assert train["shards_leased"] == 4 and train["shards_without_live_producer"] == []
    assert train["tags"]["FrozenLake"]["committed"] >= 32
    assert train["tags"]["FrozenLake"]["mean_actions"] > 0
    assert snap["batchers"][0]["consumer"] == "batcher-0"
    assert snap["batchers"][0]["state"] == "handed"
    assert not [w for w in snap["warnings"] if "gone" in w or "no live producer" in w]

    doomed_shards = by_pid(snap, doomed.pid)["shards"]
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(10)
    wait_for(lambda: by_pid(snapshot(r, keys, config), doomed.pid)["state"] == "gone"
             and not by_pid(snapshot(r, keys, config), doomed.pid)["shards"],
             timeout_s=20, what="the killed producer gone and its leases lapsed")
    frames = status_json(redis_url, run, "--watch", "--count", "2", "--interval-s", "0.1")
    assert len(frames) == 2
    snap = frames[-1]
    gone = by_pid(snap, doomed.pid)
    assert gone["state"] == "gone" and gone["shards"] == []
    assert by_pid(snap, keep.pid)["state"] == "live" and snap["live_producers"] == 1
    orphans = [f"{m}:{s}" for m, info in snap["modes"].items()
               for s in info["shards_without_live_producer"]]
    assert sorted(orphans) == sorted(doomed_shards)
    assert any(f"producer {gone['id']} is gone" in w for w in snap["warnings"])
    assert any("shard(s) with no live producer" in w for w in snap["warnings"])
    text = cli("status", "--redis-url", redis_url, "--run", run).stdout
    assert f"{gone['id']} gone" in text and "! " in text


def test_a_waiting_get_batch_is_shown_with_why(r, run):
    config = small_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    r.sadd(keys.pause, "operator")
    r.set(keys.lease("train", 0), "ghost", px=10_000)  # a lease whose holder sends no heartbeat
    limits = Limits(wait_warn_s=0.3)
    done = threading.Event()

    def wait() -> None:
        with pytest.raises(BatchTimeout):
            batcher.get_batch("train", timeout_s=1.5)
        done.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    snap = wait_for(lambda: (s := snapshot(r, keys, config, limits)) and any(
        "has waited" in w for w in s["warnings"]) and s, what="the waiting warning")
    (warning,) = [w for w in snap["warnings"] if "has waited" in w]
    assert warning.startswith("batcher-0 has waited")
    assert "0/4 complete groups" in warning and "paused: operator" in warning
    assert "no live producer" in warning
    assert snap["batchers"][0]["state"] == "waiting"
    train = snap["modes"]["train"]
    assert train["shards_leased"] == 1 and train["shards_without_live_producer"] == [0, 1]
    assert "waiting" in render_text(snap)
    waiter.join(10)
    assert done.is_set()
    snap = snapshot(r, keys, config, limits)
    assert snap["batchers"][0]["state"] == "timed_out"
    assert not [w for w in snap["warnings"] if "has waited" in w]


def test_a_stopped_run_is_not_warned_about_shards_its_producers_left(r, run):
    """`rollstream stop` ends every producer: its shards having no live producer is what a
    stop means, not something to look at (it was warned about while the run stayed stopped)."""
    config, keys = small_config(), Keys(run)
    Batcher(r, config, run=run)  # published, no producer yet
    orphaned = [w for w in snapshot(r, keys, config)["warnings"] if "no live producer" in w]
    assert [w.split(":")[0] for w in orphaned] == ["train", "val"]
    r.set(keys.stop, 1)
    snap = snapshot(r, keys, config)
    assert snap["stopped"] and not [w for w in snap["warnings"] if "no live producer" in w]


def test_redis_memory_past_the_limit_is_a_warning_and_the_view_renders(r, run):
    config = small_config()
    keys = Keys(run)
    Batcher(r, config, run=run)
    snap = snapshot(r, keys, config, Limits(redis_limit_mb=0.001))
    assert any(w.startswith("Redis uses") for w in snap["warnings"])
    assert snap["redis"]["used_mb"] > 0
    assert not any(w.startswith("Redis uses") for w in snapshot(r, keys, config)["warnings"])
    from rich.console import Console

    console = Console(file=io.StringIO(), width=140, record=True)
    console.print(render_rich(snap))
    drawn = console.export_text()
    assert f"run {run}" in drawn and "FrozenLake" in drawn and "! Redis uses" in drawn


def test_a_producer_whose_memory_per_env_grows_is_warned_about():
    steady = {"id": "p1", "state": "live", "heartbeat_age_s": 0.1, "envs": 100,
              "rss_per_env_mb": 1.1, "rss_per_env_baseline_mb": 1.0}
    grown = {**steady, "rss_per_env_mb": 2.0}  # 100 MB more over 100 envs
    small = {**steady, "envs": 10, "rss_per_env_mb": 2.0}  # only 10 MB more
    limits = Limits()
    snap = {"producers": [steady, grown, small], "modes": {}, "batchers": [],
            "model_servers": [], "redis": {"used_mb": 1.0, "limit_mb": 10.0},
            "dropped": {"dead_letters": 0}}
    found = warnings(snap, limits)
    assert found == ["producer p1: memory per env grew from 1.00 to 2.00 MB (100 MB more over "
                     "100 envs)"]


def test_the_memory_baseline_is_taken_once_the_env_count_holds():
    stats = ProducerStats("p")
    t0 = 1000.0
    assert stats._memory_baseline(16, 160 * 2**20, t0) is None  # the count just changed
    assert stats._memory_baseline(16, 160 * 2**20, t0 + WARM_S / 2) is None  # still warming
    assert stats._memory_baseline(16, 160 * 2**20, t0 + WARM_S) == 10 * 2**20
    assert stats._memory_baseline(16, 320 * 2**20, t0 + 2 * WARM_S) == 10 * 2**20  # kept
    assert stats._memory_baseline(32, 320 * 2**20, t0 + 3 * WARM_S) is None  # count changed


def test_records_round_trip_and_skip_fields_they_do_not_know():
    stats = ProducerStats("p")
    stats.committed("train", "FrozenLake", False, True, 3)
    stats.committed("train", "FrozenLake", True, False, 0)
    record = stats.record()
    back = ProducerRecord.decode(record.encode())
    assert back == record
    counts = back.tags["train"]["FrozenLake"]
    assert (counts.committed, counts.failed, counts.successes, counts.actions) == (2, 1, 1, 3)
    assert stats.record().tags["train"]["FrozenLake"].recent_committed == 0  # a new interval
    from schemas.codec import pack

    newer = pack({"producer": "p", "envs": 3, "from_the_future": 1})
    assert ProducerRecord.decode(newer).envs == 3


def test_the_weight_version_each_model_server_holds_is_shown(r, run):
    from consumer import ModelServers

    config = small_config()  # sync: a server behind the run's version is a warning
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    urls = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    servers = ModelServers(r, run, urls, method=lambda url, version, path: None,
                           watch_s=None)
    servers.update(1, "/ckpt/v1")  # the loader is the trainer's own (here: nothing to load)
    batcher.publish_version(1)
    snap = snapshot(r, keys, config)
    assert [(s["url"], s["version"]) for s in snap["model_servers"]] == [(u, 1) for u in urls]
    assert not [w for w in snap["warnings"] if "model server" in w]
    assert f"model servers: {urls[0]} v1, {urls[1]} v1" in render_text(snap)
    ModelServers(r, run, urls[1:], method=lambda url, version, path: None,
                 watch_s=None).update(2, "/ckpt")
    batcher.publish_version(2)  # one server loaded version 2, the other still holds 1
    (warning,) = [w for w in snapshot(r, keys, config)["warnings"] if "model server" in w]
    assert warning.startswith(f"model server {urls[0]} holds weight version 1, 1 behind the "
                              "run's 2 (staleness bound 0)")


def test_status_shows_a_killed_trainer_as_gone_and_a_closed_one_as_closed(r, run, redis_url,
                                                                          producer_thread):
    """A SIGKILLed trainer's last record said `handed` for ten minutes with no warning while
    the sync run sat paused. Its liveness key is read now: gone, with a warning."""
    import subprocess
    import sys

    from helpers import ROOT

    config = small_config()  # sync
    Batcher(r, config, run=run)
    producer_thread()
    script = ("import sys, time; sys.path.insert(0, 'tests')\n"
              "from helpers import small_config\nfrom consumer import Batcher\n"
              f"b = Batcher({redis_url!r}, small_config(), run={run!r}, alive_ttl_ms=1000)\n"
              "b.get_batch('train', timeout_s=30)\nprint('handed', flush=True)\n"
              "time.sleep(60)\n")
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout.readline().strip() == "handed"
        keys = Keys(run)
        assert snapshot(r, keys, config)["batchers"][0]["state"] == "handed"
        trainer.kill()
        trainer.wait(10)
        snap = wait_for(lambda: (s := snapshot(r, keys, config))["batchers"][0]["state"]
                        == "gone" and s, timeout_s=10)
    finally:
        if trainer.poll() is None:
            trainer.kill()
        trainer.communicate()
    assert any(w.startswith("batcher batcher-0 is gone: its trainer died (the run stays "
                            "paused until a trainer asks again)") for w in snap["warnings"])
    assert "gone (its liveness key expired" in render_text(snap)
    again = Batcher(r, config, run=run)
    again.get_batch("train", timeout_s=30)
    again.close()
    snap = snapshot(r, keys, config)
    assert snap["batchers"][0]["state"] == "closed"
    assert not any("is gone" in w for w in snap["warnings"])
    r.delete(keys.batcher_alive("batcher-0"))  # the closed mark expires after a minute
    assert snapshot(r, keys, config)["batchers"][0]["state"] == "closed"  # its record says so
