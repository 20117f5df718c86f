"""Operations a user relies on: reusing and resetting runs, retrying a version publish,
stops that only a deliberate command makes, exit codes, and liveness that tells the truth."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import (
    ROOT,
    add_group,
    blocked_in_xreadgroup,
    clean_env,
    get_batch_in_thread,
    run_cli_here,
    small_config,
    wait_for,
)
from helpers import run_cli as cli

from consumer import Batcher
from producers.policies import StepContext
from producers.policies.random import RandomPolicy
from schemas.codec import unpack
from schemas.config import RolloutConfig
from schemas.errors import BatchTimeout, ConfigError, RunConflict, StepExhausted, VersionConflict
from schemas.keys import Keys
from schemas.redisconn import server_ms


def test_a_run_reused_with_another_layout_is_refused_and_reset_clears_it(r, run, redis_url):
    url = ["--redis-url", redis_url, "--run", run]
    first = cli("up", "--config", "configs/frozenlake_async.yaml", "--steps", "1",
                "--producers", "1", *url)
    assert first.returncode == 0, first.stderr
    again = cli("up", "--config", "configs/frozenlake_async.yaml", "--steps", "1",
                "--producers", "1", *url)
    assert again.returncode == 0, again.stderr  # the same config resumes the run
    assert "another live batcher" not in again.stderr  # the first one closed its batcher
    assert int(r.get(Keys(run).version)) == 2
    switched = cli("up", "--config", "configs/frozenlake_sync.yaml", "--steps", "1", *url)
    assert switched.returncode == 2
    line = switched.stderr.strip()
    assert "\n" not in line and "async_generation_ratio 1 -> 0" in line
    assert f"rollstream reset --run {run}" in line
    # reset starts nothing: in this process (`run_cli_here`), without a Python start each
    refused = run_cli_here("reset", *url)  # not a terminal: no silent deletion
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert r.exists(Keys(run).config)
    reset = run_cli_here("reset", "--yes", *url)
    assert reset.returncode == 0 and "keys deleted" in reset.stdout, reset.stderr
    assert not list(r.scan_iter(match=Keys(run).pattern()))
    # the refused layout now starts the run: a Batcher, where `up` met the refusal; with no
    # key of the run left, what `up` does next is any fresh run's (the other `up` tests)
    Batcher(r, RolloutConfig.from_yaml(Path(ROOT) / "configs/frozenlake_sync.yaml"),
            run=run).close()
    assert r.get(Keys(run).version) == b"0"


def test_reset_of_a_run_named_with_glob_characters_deletes_only_that_run(r, run, redis_url):
    """`*`, `?` and `[` may stand in a run name; reset finds the run's keys with SCAN, whose
    pattern must not read them as wildcards (it deleted every run `exp*` matched)."""
    starred = run[:-3] + "*"  # matches `run` as a glob
    Batcher(r, small_config(), run=run).close()
    Batcher(r, small_config(), run=starred).close()
    mine = set(r.scan_iter(match=Keys(run).pattern()))
    assert Keys(run).config.encode() in mine
    out = run_cli_here("reset", "--yes", "--redis-url", redis_url, "--run", starred)
    assert out.returncode == 0, out.stderr
    assert set(r.scan_iter(match=Keys(run).pattern())) == mine  # untouched
    assert not r.exists(Keys(starred).config)


def test_batcher_refuses_a_conflicting_config_but_takes_policy_changes(r, run):
    Batcher(r, small_config(), run=run)
    with pytest.raises(RunConflict, match="seed 7 -> 8"):
        Batcher(r, small_config(seed=8), run=run)
    with pytest.raises(RunConflict, match="rollout_batch_size 16 -> 8"):
        Batcher(r, small_config(rollout_batch_size=8), run=run, publish_config=False)
    latency = small_config(policy={"type": "random", "latency_s": 0.01})
    Batcher(r, latency, run=run)  # a policy change resumes the run
    assert b'"latency_s":0.01' in r.get(Keys(run).config)


def test_publish_version_is_a_compare_and_set(r, run):
    keys = Keys(run)
    batcher = Batcher(r, small_config(), run=run)
    assert batcher.publish_version(1, weights=b"w1") == 1
    assert batcher.publish_version(1, weights=b"w1") == 1  # a retry: no-op
    assert int(r.get(keys.version)) == 1 and r.get(keys.weights(1)) == b"w1"
    with pytest.raises(VersionConflict, match="at version 1; only 2 can follow"):
        batcher.publish_version(3)
    other = Batcher(r, small_config(), run=run)  # reads the version the run is at
    assert other.publish_version() == 2
    assert batcher.publish_version(2) == 2  # v again is a no-op, whoever published it
    with pytest.raises(VersionConflict, match="at version 2; only 3 can follow"):
        batcher.publish_version(4)
    assert int(r.get(keys.version)) == 2


def test_publish_version_refuses_oversized_weights(r, run):
    batcher = Batcher(r, small_config(), run=run)
    with pytest.raises(ConfigError, match="exceed the 64 MB"):
        batcher.publish_version(weights=b"\0" * (64 * 2**20 + 1))
    assert r.get(Keys(run).version) == b"0"


def test_stale_heartbeats_do_not_count_as_live_producers(r, run, redis_url):
    keys = Keys(run)
    batcher = Batcher(r, small_config(), run=run)
    r.zadd(keys.producers, {"dead-producer": server_ms(r, keys.producers) - 60_000})  # expired
    with pytest.raises(BatchTimeout, match="live producers: 0"):
        batcher.get_batch("train", timeout_s=0.2)
    status = run_cli_here("status", "--redis-url", redis_url, "--run", run)
    assert "live producers 0" in status.stdout, status.stdout + status.stderr


def test_operator_commands_refuse_a_run_that_does_not_exist(r, run, redis_url):
    for command in ("pause", "resume", "status", "stop"):
        out = run_cli_here(command, "--redis-url", redis_url, "--run", run)
        assert out.returncode == 1, command
        assert f"run {run!r} does not exist" in out.stderr
    assert not list(r.scan_iter(match=Keys(run).pattern()))  # no key made for a typo


class SlowGroupPolicy(RandomPolicy):
    """Random actions; group `slow` takes `delay_s` per action."""

    def __init__(self, slow: int, delay_s: float):
        super().__init__()
        self.slow, self.delay_s = slow, delay_s

    async def act(self, observation: Any, ctx: StepContext):
        if ctx.mode == "train" and ctx.group_id == self.slow:
            await asyncio.sleep(self.delay_s)
        return await super().act(observation, ctx)


def test_two_sync_batchers_do_not_deadlock_when_one_finishes_first(r, run, producer_thread):
    # group 1 (the odd batcher's) is slow: the even batcher has its batch long before. Its
    # hand-out must not pause the producers while the odd batcher still waits.
    config = small_config(rollout_batch_size=8)
    keys = Keys(run)
    even = Batcher(r, config, run=run, index=0, count=2)
    odd = Batcher(r, config, run=run, index=1, count=2)
    producer_thread(policy=SlowGroupPolicy(slow=1, delay_s=0.05))
    assert set(even.get_batch("train", timeout_s=20).group_ids.tolist()) == {0, 2}
    assert r.smembers(keys.pause) == set()  # the odd batcher still waits: producers run
    assert set(odd.get_batch("train", timeout_s=20).group_ids.tolist()) == {1, 3}
    assert r.smembers(keys.pause) == {b"sync"}  # both have their batch: paused
    even.publish_version()
    assert set(even.get_batch("train", timeout_s=20).episode_ids.tolist()) == {1}


@pytest.mark.slow
def test_up_exits_130_on_ctrl_c_even_when_sigint_was_ignored_at_start(run):
    # under `nohup` or `&` in a script the process inherits SIGINT ignored
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "up", "--config", "configs/frozenlake_sync.yaml",
         "--run", run, "--train-step-s", "0.2"], cwd=ROOT, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout is not None
    lines: list[str] = []
    while len([x for x in lines if x.startswith("step")]) < 1:
        line = proc.stdout.readline()
        assert line, "up exited early"
        lines.append(line)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    sock = re.search(r"at unix://(\S+)/redis.sock", "".join(lines))
    assert sock
    ps = subprocess.run(["pgrep", "-f", sock.group(1)], capture_output=True, text=True)
    assert ps.stdout == ""


@pytest.mark.slow
def test_up_exits_1_when_a_producer_dies(r, run, redis_url, tmp_path):
    # a producer killed mid-run: the other takes its shards and the steps complete, but the
    # run is not reported clean (a 2 s lease ttl: the survivor claims the shards sooner)
    config = tmp_path / "async.yaml"
    config.write_text((Path(ROOT) / "configs/frozenlake_async.yaml").read_text()
                      + "lease_ttl_s: 2\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "up", "--config", str(config),
         "--redis-url", redis_url, "--run", run, "--producers", "2", "--steps", "6",
         "--train-step-s", "0.3"], cwd=ROOT, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    keys = Keys(run)
    ids = wait_for(lambda: len(r.zrange(keys.producers, 0, -1)) == 2
                   and r.zrange(keys.producers, 0, -1), timeout_s=60, what="two producers")
    victim = int(ids[0].decode().split("-")[-2])
    wait_for(lambda: r.get(keys.version) not in (None, b"0"), what="a first step")
    subprocess.run(["kill", "-9", str(victim)], check=True)
    out, err = proc.communicate(timeout=120)
    assert len([x for x in out.splitlines() if x.startswith("step")]) == 6
    assert proc.returncode == 1
    assert "producers exited with" in err and "-9" in err


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def work() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # travels to the test
            out.append(exc)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread, out


def test_a_sync_batch_survives_a_connection_lost_at_hand_out(r, run, proxy, producer_thread):
    # the hand-out's Redis write runs but its answer is lost with the connection: the batch
    # must not vanish inside the Batcher; the same batch comes back, paused
    config = small_config(rollout_batch_size=16)
    keys = Keys(run)
    client = redis.Redis.from_url(proxy.url, socket_timeout=10)
    batcher = Batcher(client, config, run=run)
    producer_thread()
    # the hand-out script's keys, in a row: its inflight record, then the sync bookkeeping
    inflight, handed = keys.inflight("train", "batcher-0"), keys.sync_handed
    marker = f"{inflight}\r\n${len(handed)}\r\n{handed}".encode()
    proxy.hold(marker)
    thread, result = _in_thread(lambda: batcher.get_batch("train", timeout_s=20))
    assert proxy.held.wait(30), "the hand-out never reached Redis"
    proxy.lose_reply(then_hold=marker)  # it ran in Redis; the Batcher cannot know
    recorded = unpack(r.get(keys.inflight("train", "batcher-0")))
    assert proxy.held.wait(30), "the Batcher did not hand out again"
    proxy.release()
    thread.join(60)
    batch = result[0]
    assert not isinstance(batch, BaseException), batch
    assert [[e.stream, e.entry_id] for e in batch.entries] == recorded
    assert len(batch) == 16 and r.smembers(keys.pause) == {b"sync"}
    client.close()


def test_publish_version_retried_after_a_lost_reply_moves_one_version(r, run, proxy):
    keys = Keys(run)
    Batcher(r, small_config(), run=run)
    client = redis.Redis.from_url(proxy.url, socket_timeout=10)
    batcher = Batcher(client, small_config(), run=run)
    proxy.hold(keys.version.encode() + b"\r\n$")  # the publish script's key argument
    thread, result = _in_thread(lambda: batcher.publish_version(1, weights=b"w"))
    assert proxy.held.wait(10)
    proxy.lose_reply()
    thread.join(30)
    if isinstance(result[0], redis.ConnectionError):  # the README's retry: the same version
        result[0] = batcher.publish_version(1, weights=b"w")
    assert result[0] == 1
    assert r.get(keys.version) == b"1" and r.get(keys.weights(1)) == b"w"
    client.close()


def test_the_published_config_holds_no_redis_url(r, run):
    Batcher(r, small_config(redis_url="redis://:hunter2@db:6379/0"), run=run)
    assert b"hunter2" not in r.get(Keys(run).config)


def test_get_batch_leaves_the_young_gc_generations_empty(r, run):
    """The objects a get_batch allocated with the collector paused go to the oldest
    generation unscanned, so the trainer's next young collection does not walk them all."""
    config = small_config(rollout_batch_size=16, async_generation_ratio=1,
                          val_env_manager=None)
    batcher = Batcher(r, config, run=run)
    for group in range(4):
        add_group(r, Keys(run), "train", group, 0, group_size=4)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    batch = batcher.get_batch(timeout_s=5)
    young, middle, _ = gc.get_count()
    assert len(batch) == 16
    assert young < 50 and middle == 0, gc.get_count()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_get_batch_reads_again_when_a_stream_it_waits_on_leaves_the_node(r, run, redis_url):
    """Redis 7 ends a blocked XREADGROUP with UNBLOCKED when its stream leaves the node (a
    cluster slot migrating away, or the key deleted): get_batch reads again, as it does after
    a lost connection, instead of failing the trainer."""
    if int(r.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("Redis 6 keeps such a read blocked: nothing to recover from")
    config = small_config()
    name = f"{run}-batcher"
    client = redis.Redis.from_url(redis_url, socket_timeout=30, client_name=name)
    batcher = Batcher(client, config, run=run, block_ms=10_000)
    keys = Keys(run)
    waiter, result = get_batch_in_thread(batcher, timeout_s=30)
    try:
        wait_for(lambda: blocked_in_xreadgroup(r, name), what="the batcher blocked in XREADGROUP")
        r.delete(keys.stream("train", 0))  # ends its read with UNBLOCKED
        for g in range(config.train_env_manager.num_env_groups):
            add_group(r, keys, "train", g, 0, group_size=4)
        waiter.join(30)
        assert "error" not in result, result
        assert len(result["batch"]) == 16
    finally:
        waiter.join(30)
        client.close()


# -- the trainer API under misuse (found by a walk through it, 2026-11-25) --------------------
def test_a_batcher_without_run_uses_the_configs_run(r, run):
    batcher = Batcher(r, small_config(run=run))
    assert batcher.keys.run == run
    assert r.get(Keys(run).config) is not None and r.get(Keys("rollstream").config) is None


def test_get_batch_with_no_time_to_wait_looks_once(r, run):
    batcher = Batcher(r, small_config(), run=run)
    keys = Keys(run)
    for g in range(4):
        add_group(r, keys, "train", g, 0, group_size=4)
    batch = batcher.get_batch(timeout_s=0)  # the groups sit unread in Redis
    assert len(batch) == 16
    # nothing left of this sync step: said at once, whatever the timeout (it waited it out)
    with pytest.raises(StepExhausted, match="no group can complete any more"):
        batcher.get_batch(timeout_s=30)


def test_get_batch_can_wait_without_a_bound(r, run):
    """`timeout_s=float("inf")`: it waits (in finite blocks) until the batch is there; the
    block's length came from int(inf) and raised OverflowError."""
    batcher = Batcher(r, small_config(), run=run)
    keys = Keys(run)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(batcher.get_batch(
        timeout_s=float("inf"))))
    waiter.start()
    wait_for(lambda: blocked_in_xreadgroup(r) or not waiter.is_alive(),
             what="get_batch blocked in XREADGROUP")
    for g in range(4):
        add_group(r, keys, "train", g, 0, group_size=4)
    waiter.join(30)
    assert len(got) == 1 and len(got[0]) == 16


@pytest.mark.parametrize("kwargs, message", [
    ({"n": "4"}, "get_batch n='4' must be a positive multiple"),
    ({"n": 4.0}, "get_batch n=4.0 must be a positive multiple"),
    ({"n": 100}, "needs 25 complete groups, but at most 4 can be ready at once"),
    ({"timeout_s": None}, "timeout_s=None must be a number of seconds"),
    ({"timeout_s": float("nan")}, "timeout_s=nan must be a number of seconds"),
])
def test_get_batch_refuses_what_it_cannot_serve(r, run, kwargs, message):
    batcher = Batcher(r, small_config(), run=run)
    with pytest.raises(ConfigError, match=re.escape(message)):
        batcher.get_batch(**kwargs)


def test_ack_takes_only_its_own_runs_batches(r, run):
    config = small_config()
    mine, other_run = Batcher(r, config, run=run), f"{run}-other"
    try:
        other = Batcher(r, small_config(val_env_manager=None), run=other_run)
        for g in range(4):
            add_group(r, Keys(run), "train", g, 0, group_size=4)
        batch = mine.get_batch(timeout_s=10)
        with pytest.raises(ConfigError, match=f"not an entry of run '{other_run}'"):
            other.ack(batch)
        assert sum(r.xlen(Keys(run).stream("train", g)) for g in range(4)) == 16  # untouched
        with pytest.raises(ConfigError, match="this run has no val_env_manager"):
            other.ack(dataclasses.replace(batch, mode="val"))
        with pytest.raises(ConfigError, match="ack takes the Batch that get_batch returned"):
            mine.ack(None)  # type: ignore[arg-type]
        mine.ack(batch)
    finally:
        for name in r.scan_iter(match=Keys(other_run).pattern()):
            r.delete(name)


def test_a_batcher_with_no_group_of_its_own_is_refused(r, run):
    with pytest.raises(ConfigError, match="batcher 5 of 8 would read no train group"):
        Batcher(r, small_config(), run=run, index=5, count=8)


def test_a_split_batcher_asking_for_more_than_its_groups_is_told_at_once(r, run):
    # each of two sync batchers reads 2 of the 4 groups: 16 trajectories (4 groups) would
    # have waited out the whole timeout before
    batcher = Batcher(r, small_config(), run=run, index=0, count=2)
    with pytest.raises(ConfigError, match=r"needs 4 complete groups, but at most 2 can be "
                                          r"ready at once here \(2 train groups read by"):
        batcher.get_batch(timeout_s=30)
    for g in range(4):
        add_group(r, Keys(run), "train", g, 0, group_size=4)
    assert sorted(set(batcher.get_batch(n=8, timeout_s=5).group_ids.tolist())) == [0, 2]


@pytest.mark.parametrize("call, message", [
    (lambda b: b.publish_version(3.7), "version must be an int, got 3.7"),
    (lambda b: b.publish_version("x"), "version must be an int, got 'x'"),
    (lambda b: b.publish_version(weights="abc"), "weights must be bytes"),
    (lambda b: b.publish_version(weights={"w": 1}), "weights must be bytes"),
    (lambda b: b.serve_metrics("80"), "metrics port '80': not a port number"),
])
def test_the_api_names_a_wrong_argument(r, run, call, message):
    batcher = Batcher(r, small_config(), run=run)
    with pytest.raises(ConfigError, match=re.escape(message)):
        call(batcher)
    assert int(r.get(Keys(run).version) or 0) == 0  # nothing was published


@pytest.mark.parametrize("kwargs, message", [
    ({"config": {"seed": 1}}, "Batcher needs a RolloutConfig, not dict"),
    ({"read_count": 0}, "read_count must be an integer >= 1, got 0"),
    ({"claim_idle_ms": -1}, "claim_idle_ms must be an integer >= 0, got -1"),
])
def test_a_batcher_built_wrong_says_how(r, run, kwargs, message):
    args = {"config": small_config(), **kwargs}
    with pytest.raises(ConfigError, match=re.escape(message)):
        Batcher(r, args.pop("config"), run=run, **args)


def test_only_the_last_three_weights_published_stay(r, run):
    batcher = Batcher(r, small_config(), run=run)
    keys = Keys(run)
    batcher.publish_version(weights=b"w1")
    for _ in range(3):
        batcher.publish_version()  # versions 2-4 carry no weights
    for _ in range(4):
        batcher.publish_version(weights=b"w")  # versions 5-8
    assert sorted(int(k.rsplit(b":", 1)[1]) for k in r.scan_iter(match=keys.weights("*"))) \
        == [6, 7, 8]
