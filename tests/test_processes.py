"""Real producer processes and real signals: shard split, SIGTERM, SIGKILL, `rollstream up`."""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from helpers import clean_env, publish, small_config, wait_for
from helpers import run_cli as cli

from consumer import Batcher
from producers.envs import make_env
from producers.policies import StepContext
from producers.policies.random import RandomPolicy
from schemas.keys import Keys
from schemas.seeding import episode_seed

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def lease_owners(r, keys: Keys, config) -> dict[tuple[str, int], str | None]:
    shards = [(m, s) for m in config.modes() for s in range(config.manager(m).num_shards)]
    values = r.mget([keys.lease(m, s) for m, s in shards])
    return {shard: v.decode() if v else None for shard, v in zip(shards, values, strict=True)}


def spread_config(**overrides):
    """8 train groups of 4 in 8 shards, plus one val shard: 9 shards to split."""
    base = dict(rollout_batch_size=32,
                train_env_manager={"max_env_num_per_worker": 4, "num_env_groups": 8},
                val_env_manager={"num_env_groups": 4})
    base.update(overrides)
    return small_config(**base)


def test_two_producer_processes_split_the_shards_without_overlap(r, run, producer_process):
    config = spread_config()
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    producer_process()
    producer_process()
    total = 9

    def balanced():
        owners = Counter(lease_owners(r, keys, config).values())
        return None not in owners and len(owners) == 2 and max(owners.values()) <= math.ceil(
            total / 2)

    wait_for(balanced, timeout_s=30, what="two producers to hold all shards, balanced")
    seen: set[str] = set()
    for step in range(3):
        batch = batcher.get_batch("train", timeout_s=30)
        assert set(batch.episode_ids.tolist()) == {step}
        assert not seen & set(batch.traj_ids)
        seen |= set(batch.traj_ids)
        assert len(set(batch.traj_ids)) == 32
        batcher.ack(batch)
        publish(batcher)
    producers_seen = {t["producer"] for t in batch.trajectories}
    assert len(producers_seen) == 2


def test_sigterm_exits_zero_and_releases_leases(r, run, producer_process):
    config = spread_config()
    keys = Keys(run)
    Batcher(r, config, run=run)
    proc = producer_process()
    wait_for(lambda: all(lease_owners(r, keys, config).values()), timeout_s=30,
             what="the producer to lease every shard")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert set(lease_owners(r, keys, config).values()) == {None}
    assert r.zcard(keys.producers) == 0
    assert "leases released" in out


def replay_actions(config, traj) -> list[int]:
    """Play a trajectory's episode again here, as a fresh producer would."""
    spec = config.env_spec(traj["tag"])
    env = make_env(spec.env_id, spec.env_config)
    seed = episode_seed(config.seed, traj["mode"], traj["group_id"], traj["episode_id"])
    ctx = StepContext(env=env, seed=seed, version=0,
                      mode=traj["mode"], group_id=traj["group_id"],
                      episode_id=traj["episode_id"], member=traj["member"], tag=traj["tag"])
    policy = RandomPolicy()
    obs, _ = env.reset(seed=seed)
    actions: list[int] = []
    done = False
    while not done:
        action, _ = asyncio.run(policy.act(obs, ctx))
        obs, _, term, trunc, _ = env.step(action)
        actions.append(action)
        done = term or trunc
    return actions


def test_sigkill_mid_episode_loses_nothing_and_doubles_nothing(r, run, proxy,
                                                               producer_process):
    # sync, every group in every batch: step s must deliver exactly episode s of every env;
    # 20 ms an action: the victim's other episodes are still being played when it is killed
    config = spread_config(policy={"type": "random", "latency_s": 0.02}, lease_ttl_s=1.0)
    keys = Keys(run)
    batcher = Batcher(r, config, run=run)
    victim = producer_process("--redis-url", proxy.url)  # its requests pass the proxy
    survivor = producer_process()

    def shared_fairly():  # 9 shards: 5 and 4, so the victim holds train shards
        owners = Counter(lease_owners(r, keys, config).values())
        return None not in owners and len(owners) == 2 and max(owners.values()) <= 5

    wait_for(shared_fairly, timeout_s=30, what="both producers to hold their share")
    victim_tag = f"-{victim.pid}-"
    victim_shards = {shard for shard, owner in lease_owners(r, keys, config).items()
                     if owner and victim_tag in owner}
    assert victim_shards
    group = min(index for mode, index in victim_shards if mode == "train")  # shard = group
    delivered: list[str] = []
    killer = threading.Thread(target=lambda: proxy.held.wait(40)
                              and os.kill(victim.pid, signal.SIGKILL))
    for step in range(4):
        batch = batcher.get_batch("train", timeout_s=40)
        assert set(batch.episode_ids.tolist()) == {step}
        assert len(batch) == 32 and len(set(batch.traj_ids)) == 32
        delivered += batch.traj_ids
        for traj in batch.trajectories:  # replays play the same episode
            assert [s["action"] for s in traj["steps"]] == replay_actions(config, traj)
        batcher.ack(batch)
        if step == 0:
            # evidence of an episode in flight: the victim played its group's episode 1 to
            # the end and its commit is held on the wire; kill it there. Armed before the
            # publish that lets episode 1 start (sync), so no commit of it can pass first
            proxy.hold(f"train-{group}-1-".encode())
            killer.start()
        publish(batcher)
    killer.join(10)
    assert proxy.held.is_set()
    victim.wait(10)
    assert victim.returncode == -signal.SIGKILL
    assert len(delivered) == len(set(delivered)) == 4 * 32
    owners = lease_owners(r, keys, config)
    assert all(owners[shard] and victim_tag not in owners[shard] for shard in victim_shards)
    assert {t["producer"] for t in batch.trajectories} == {owners[("train", 0)]}
    assert all(r.xlen(keys.stream("train", g)) == 0 for g in range(8))
    survivor.send_signal(signal.SIGTERM)
    survivor.communicate(timeout=30)
    assert survivor.returncode == 0


def test_rollstream_up_two_steps_on_the_embedded_server():
    out = cli("up", "--config", "configs/frozenlake_sync.yaml", "--steps", "2")
    assert out.returncode == 0, out.stderr
    steps = [line for line in out.stdout.splitlines() if line.startswith("step")]
    assert len(steps) == 2 and "trajs   128" in steps[0]
    sock = re.search(r"at unix://(\S+)/redis.sock", out.stdout)
    assert sock, out.stdout
    assert not Path(sock.group(1)).exists()  # the embedded server's folder is gone
    ps = subprocess.run(["pgrep", "-f", sock.group(1)], capture_output=True, text=True)
    assert ps.stdout == ""


def test_rollstream_up_with_a_url_leaves_no_producer_behind(r, run, redis_url, tmp_path):
    """`up` on a Redis of its config's `redis_url`, under its `run` (no --redis-url, --run
    or environment: one `up` for both, the flags are the other tests'), ends with none of
    its producers' heartbeats or leases left."""
    data = yaml.safe_load((ROOT / "configs" / "frozenlake_async.yaml").read_text())
    data.update(redis_url=redis_url, run=run)
    path = tmp_path / "with_url.yaml"
    path.write_text(yaml.safe_dump(data))
    out = cli("up", "--config", str(path), "--steps", "3", "--producers", "2")
    assert out.returncode == 0, out.stderr
    assert len([x for x in out.stdout.splitlines() if x.startswith("step")]) == 3
    keys = Keys(run)
    assert r.zcard(keys.producers) == 0
    assert not list(r.scan_iter(match=keys.prefix + ":lease:*"))
    assert r.get(keys.version) == b"3"  # the trainer ran there, under that name


def test_ctrl_c_stops_up_and_every_process(run):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "up", "--config", "configs/frozenlake_sync.yaml",
         "--run", run, "--train-step-s", "0.2"], cwd=ROOT, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    while len([x for x in lines if x.startswith("step")]) < 2:
        line = proc.stdout.readline()
        assert line, "up exited early"
        lines.append(line)
    sock = re.search(r"at unix://(\S+)/redis.sock", "".join(lines))
    assert sock
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in out
    assert "Traceback" not in err
    time.sleep(0.2)
    ps = subprocess.run(["pgrep", "-f", f"--run {run}"], capture_output=True, text=True)
    assert ps.stdout == ""
    assert not Path(sock.group(1)).exists()


def test_a_joining_producer_gets_its_share_long_before_a_heartbeat(r, run, producer_process):
    # heartbeats every 10 s: only the join/handover announcements can balance within 6 s
    config = spread_config(lease_ttl_s=30.0)
    keys = Keys(run)
    Batcher(r, config, run=run)
    producer_process()
    wait_for(lambda: all(lease_owners(r, keys, config).values()), timeout_s=30,
             what="the first producer to hold every shard")
    producer_process()

    def balanced():
        owners = Counter(lease_owners(r, keys, config).values())
        return None not in owners and len(owners) == 2 and max(owners.values()) <= 5

    wait_for(balanced, timeout_s=6, what="the shards to be shared within 6 s")


def test_a_producer_process_collects_garbage_rarely():
    # `rollstream produce` calls tune_gc(): checked in a child so this process keeps its own
    code = ("import gc; from producers.producer import GC_THRESHOLD, tune_gc; tune_gc(); "
            "assert gc.get_threshold() == GC_THRESHOLD, gc.get_threshold(); "
            "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_sigterm_after_a_run_stop_is_the_first_signal_not_a_forced_stop() -> None:
    """A producer already ending because the run was stopped (`rollstream stop`) took the
    SIGTERM `rollstream up` sends its producers as the second signal: a forced stop, exit 1
    ("producers exited with [1]"). Only a second signal forces."""
    import asyncio
    import signal as signals

    from producers.producer import Producer

    async def scenario() -> tuple[bool, bool]:
        producer = Producer("redis://127.0.0.1:1/0", "r", handle_signals=False)
        producer._stop = asyncio.Event()
        producer._stop.set()  # what the run's stop did
        producer._main_task = asyncio.ensure_future(asyncio.sleep(10))
        producer._on_signal(signals.SIGTERM)
        await asyncio.sleep(0)
        first = producer._main_task.cancelled()
        producer._on_signal(signals.SIGTERM)
        await asyncio.sleep(0)
        return first, producer._main_task.cancelled()

    assert asyncio.run(scenario()) == (False, True)


def test_ctrl_c_as_the_producer_watch_starts_leaves_no_watch_behind(monkeypatch) -> None:
    """A Ctrl+C landing just as `up` starts watching its producers (here: raised right after
    the watch thread started) left the watch running and armed: once the cleanup had stopped
    the producers, it raised ProducersExited over the KeyboardInterrupt, and `up` exited 1,
    not 130 (seen about once in 25 runs of test_ctrl_c_while_up_is_starting_leaves_nothing
    on a loaded machine)."""
    from rollstream import processes

    started: list[threading.Thread] = []

    class Interrupted(threading.Thread):
        def start(self) -> None:
            super().start()
            started.append(self)
            raise KeyboardInterrupt  # the Ctrl+C, right after the watch started

    monkeypatch.setattr(processes.threading, "Thread", Interrupted)
    before = signal.getsignal(signal.SIGUSR1)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(KeyboardInterrupt), processes.producers_watched([proc]):
            pass
        assert started and not started[0].is_alive()  # ended: it can raise nothing later
        assert signal.getsignal(signal.SIGUSR1) == before
    finally:
        proc.kill()
        proc.wait(10)


def test_the_producer_watch_ends_with_its_block_at_once() -> None:
    """`up` ends by leaving the watch's block, which joins the watch thread: it slept
    `PRODUCER_WATCH_S` (0.5 s) between looks, so every `up` waited out the rest of a sleep
    at its end. It waits on the block's end now."""
    from rollstream import processes

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = processes.producers_watched([proc])
        watch.__enter__()
        time.sleep(0.1)  # the watch is inside a wait between its looks
        left = time.monotonic()
        watch.__exit__(None, None, None)
        took = time.monotonic() - left
        assert took < 0.3, f"{took:.2f} s to leave: the rest of a sleep was waited out"
    finally:
        proc.kill()
        proc.wait(10)
