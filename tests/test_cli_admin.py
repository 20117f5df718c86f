"""The operator commands and the bounded ways to finish, as real processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest
import redis
from helpers import (
    BROKEN_ENV_ID,
    ROOT,
    blocked_in_xreadgroup,
    run_cli_here,
    small_config,
    stream_lengths,
    wait_for,
)
from helpers import run_cli as cli

from consumer import Batcher
from schemas.keys import Keys


def test_pause_resume_and_status(r, run, redis_url):
    # in this process: each command ends by itself and starts nothing (`pause` as a process
    # is test_user_edges' test_operator_commands_read_run_and_url_from_a_config's)
    keys = Keys(run)
    no_config = run_cli_here("status", "--redis-url", redis_url, "--run", run)
    assert no_config.returncode == 1
    Batcher(r, small_config(), run=run)
    out = run_cli_here("pause", "--redis-url", redis_url, "--run", run)
    assert out.returncode == 0 and "['operator']" in out.stdout
    assert r.smembers(keys.pause) == {b"operator"}
    r.sadd(keys.pause, "sync")
    out = run_cli_here("resume", "--redis-url", redis_url, "--run", run)
    assert out.returncode == 0
    assert r.smembers(keys.pause) == {b"sync"}  # each side removes only its own reason
    status = run_cli_here("status", "--redis-url", redis_url, "--run", run)
    assert status.returncode == 0
    assert f"run {run}: version 0" in status.stdout and "['sync']" in status.stdout
    assert "train: 0 entries in streams, 0/2 shards leased" in status.stdout


def test_config_check_prints_the_layout(tmp_path):
    out = run_cli_here("config", "check", "configs/frozenlake_async.yaml")
    assert out.returncode == 0, out.stderr
    assert "async, ratio 1, train batch 128" in out.stdout
    assert "train: 128 envs, 16 groups of 8, 4 shards" in out.stdout
    assert "FrozenLake: groups [0, 16)" in out.stdout


@pytest.mark.slow
def test_up_val_every_runs_a_val_round_every_second_step(redis_url, run):
    """`--steps`, not `--seconds 2`: the steps two seconds hold depend on the machine (on a
    busy one the producers were still starting when they ran out: 0 steps). `--seconds`
    ending `up` is test_up_seconds_ends_a_batch_wait_that_would_outlast_it's."""
    out = cli("up", "--config", "configs/frozenlake_sync.yaml", "--redis-url", redis_url,
              "--run", run, "--steps", "4", "--val-every", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    steps = [x for x in lines if x.startswith("step")]
    vals = [x for x in lines if x.strip().startswith("val")]
    assert len(steps) == 4 and len(vals) == 2, out.stdout  # after steps 2 and 4
    assert all("trajs    32" in val for val in vals)  # a val round: 32 FrozenLake val envs


def test_up_seconds_ends_a_batch_wait_that_would_outlast_it(redis_url, run, tmp_path):
    """Every action takes an hour, so no batch comes: `--seconds 1` ended `up` only when
    the wait for the first batch reached `--timeout-s` (60 s), with exit 1."""
    config = (ROOT / "configs" / "frozenlake_sync.yaml").read_text().replace(
        "  type: random", "  type: random\n  latency_s: 3600")
    path = tmp_path / "slow.yaml"
    path.write_text(config)
    started = time.monotonic()
    # 1 s: nothing needs to happen within it (no batch can come); --timeout-s stays far past
    # it and `took`'s bound, so a wait that is not cut short cannot pass as one that was
    out = cli("up", "--config", str(path), "--redis-url", redis_url, "--run", run,
              "--seconds", "1", "--timeout-s", "60", "--producers", "1")
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert "done: 0 steps" in out.stdout
    assert took < 40, took


@pytest.mark.slow
def test_produce_seconds_exits_by_itself(r, run, redis_url):
    """`produce --seconds` serves and then ends by itself (exit 0), leaving no heartbeat;
    at the default log level it says that it serves and that it stopped."""
    Batcher(r, small_config(), run=run)
    started = time.monotonic()
    # 1.5 s: the producer must start serving before it runs out (the "serving" line), on a
    # loaded machine too
    out = cli("produce", "--redis-url", redis_url, "--run", run, "--seconds", "1.5")
    assert out.returncode == 0, out.stderr
    assert 1.5 <= time.monotonic() - started < 30
    assert r.zcard(Keys(run).producers) == 0
    assert f"serving run {run}" in out.stderr
    assert re.search(r"stopped: \d+ committed, \d+ leases released", out.stderr)


BAD_ENV = {"custom_envs": {"Big": {"env_type": "sokoban",
                                   "env_config": {"dim_room": [3, 3], "num_boxes": 5}}},
           "train_env_manager": {"tags": ["Big"]}}


def test_bad_env_settings_fail_config_check_naming_the_tag(tmp_path):
    import yaml

    path = tmp_path / "bad_env.yaml"
    path.write_text(yaml.safe_dump({**BAD_ENV, "train_env_manager": {
        "max_env_num_per_worker": 4, "num_env_groups": 2, "group_size": 2, "tags": ["Big"]}}))
    out = run_cli_here("config", "check", str(path))
    assert out.returncode == 2
    assert "custom_envs.Big: cannot make env type 'sokoban'" in out.stderr
    assert "no room for 5 boxes" in out.stderr


def test_producer_exits_1_with_one_line_when_the_published_config_cannot_run(r, run,
                                                                             redis_url):
    Batcher(r, small_config(**BAD_ENV), run=run)
    out = cli("produce", "--redis-url", redis_url, "--run", run)
    assert out.returncode == 1
    assert "the published config cannot run: custom_envs.Big" in out.stderr
    assert "Traceback" not in out.stderr
    assert not list(r.scan_iter(match=Keys(run).prefix + ":lease:*"))


def test_train_whose_every_group_fails_ends_at_its_timeout(r, run, redis_url, tmp_path,
                                                           producer_thread):
    """Every train env raises, so every group of every step is dropped: each step is
    exhausted at once. `rollstream train` skips such a step by publishing (as after a restart
    between ack and publish), but the skipped versions count against `--timeout-s`: it ends
    with exit 1 and one line, not publishing versions for ever."""
    # `module:id`: gymnasium imports the tests' helpers (which register the env) in `train`
    config = small_config(custom_envs={"Broken": {"env_id": f"helpers:{BROKEN_ENV_ID}"}},
                          train_env_manager={"tags": ["Broken"]})
    path = tmp_path / "broken.yaml"
    path.write_text(config.to_json())
    Batcher(r, config, run=run)
    producer_thread()
    # every member of step 0 committed as failed: the skips below are train's, at their
    # pace, not spent waiting for the producer to start
    wait_for(lambda: sum(stream_lengths(r, Keys(run), config)) == 16, timeout_s=30,
             what="step 0's 16 failed trajectories")
    started = time.monotonic()
    # --timeout-s 3: skips 1 s apart from the second on (SKIP_AGAIN_S), so three fit if the
    # producer fails versions 1 and 2 within 1 s together (~20 ms each under 4 CPU hogs)
    out = subprocess.run(
        [sys.executable, "-m", "rollstream", "train", "--config", str(path), "--redis-url",
         redis_url, "--run", run, "--steps", "2", "--timeout-s", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=40,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert out.returncode == 1, out.stderr
    assert "no train batch in 3s" in out.stderr and "versions from 0 on" in out.stderr
    assert "Traceback" not in out.stderr
    assert time.monotonic() - started < 30
    skipped = int(r.get(Keys(run).version))
    assert skipped >= 3  # it did skip exhausted steps on the way, a second apart
    # ... with one line for the first skip, not a line each (it repeats every second)
    assert out.stderr.count(": publishing version") == 1, out.stderr


def test_train_restarted_between_an_ack_and_its_publish_goes_on(r, run, redis_url, tmp_path,
                                                                 producer_thread):
    """Sync: the step's groups were all handed out and acked, the version not published (a
    trainer killed in between). `rollstream train` is told so at once (StepExhausted),
    publishes the next version and goes on."""
    config = small_config()
    path = tmp_path / "sync.yaml"
    path.write_text(config.to_json())
    before = Batcher(r, config, run=run)
    producer_thread()
    before.ack(before.get_batch("train", timeout_s=20))
    before.close()
    out = subprocess.run(
        [sys.executable, "-m", "rollstream", "train", "--config", str(path), "--redis-url",
         redis_url, "--run", run, "--steps", "1", "--timeout-s", "20"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "no group can complete any more" in out.stderr
    assert int(r.get(Keys(run).version)) == 2  # the publish it missed, then its own step


@pytest.mark.parametrize("command", ["train", "up"])
def test_rollstream_stop_ends_train_and_up_with_exit_0(r, run, redis_url, tmp_path,
                                                       producer_process, command):
    """`rollstream stop` is how a run ends: `train` waited out its whole --timeout-s for a
    batch (the producers had exited) and exited 1 with a BatchTimeout; `up` exited 1 saying
    every producer exited. Both end at once with 0 and a line that says the run was stopped."""
    config = small_config()
    path = tmp_path / "sync.yaml"
    path.write_text(config.to_json())
    args = ["--config", str(path), "--redis-url", redis_url, "--run", run, "--timeout-s",
            "120", "--train-step-s", "0.2"]
    if command == "train":
        producer_process()
    else:
        args += ["--producers", "1"]
    trainer = subprocess.Popen([sys.executable, "-m", "rollstream", command, *args], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while int(r.get(Keys(run).version) or 0) < 2:  # steps are being trained
            assert trainer.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        # in this process: `stop` ends by itself and starts nothing
        assert run_cli_here("stop", "--redis-url", redis_url, "--run", run).returncode == 0
        stopped = time.monotonic()
        out, _ = trainer.communicate(timeout=60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.communicate()
    assert time.monotonic() - stopped < 15
    assert trainer.returncode == 0, out
    assert f"run '{run}' was stopped (rollstream stop)" in out, out
    assert "Traceback" not in out


def test_a_waiting_get_batch_raises_run_stopped_when_the_run_is_stopped(r, run, redis_url):
    from schemas.errors import RunStopped

    name = f"{run}-batcher"  # its reads are told apart from other clients' of this server
    client = redis.Redis.from_url(redis_url, socket_timeout=30, client_name=name)
    batcher = Batcher(client, small_config(), run=run)

    def stop_once_waiting() -> None:  # evidence that get_batch waits: its blocked read
        wait_for(lambda: blocked_in_xreadgroup(r, name), timeout_s=30,
                 what="get_batch blocked in XREADGROUP")
        cli("stop", "--redis-url", redis_url, "--run", run)

    stopper = threading.Thread(target=stop_once_waiting)
    stopper.start()
    started = time.monotonic()
    try:
        with pytest.raises(RunStopped,
                           match="was stopped \\(rollstream stop\\) while get_batch"):
            batcher.get_batch("train", timeout_s=20)
    finally:
        stopper.join(60)
        client.close()
    assert time.monotonic() - started < 10


def test_reset_ends_a_waiting_trainer_and_the_run_stays_gone(r, run, redis_url, tmp_path,
                                                             producer_process):
    """`reset --yes` under a running `rollstream train` said "reset" and within a second the
    trainer had put the run back (restoring config, version and streams). The trainer now
    ends at the stop and the run stays deleted."""
    config = small_config()
    path = tmp_path / "sync.yaml"
    path.write_text(config.to_json())
    producer = producer_process()
    trainer = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "train", "--config", str(path), "--redis-url",
         redis_url, "--run", run, "--train-step-s", "0.2", "--timeout-s", "120"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while int(r.get(Keys(run).version) or 0) < 2:
            assert trainer.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        # in this process: `reset` ends by itself and starts nothing
        out = run_cli_here("reset", "--yes", "--redis-url", redis_url, "--run", run)
        assert out.returncode == 0 and "reset," in out.stdout, out.stdout + out.stderr
        trainer.communicate(timeout=30)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.communicate()
    assert trainer.returncode == 0
    # every process of the run has exited (the producer ends at the stop), so nothing is
    # left that could still write a key of it
    producer.wait(timeout=30)
    assert list(r.scan_iter(match=Keys(run).pattern())) == []


def test_reset_refuses_while_a_trainer_that_does_not_wait_is_alive(r, run, redis_url,
                                                                   producer_thread):
    config = small_config()
    # reset waits out a live trainer's key for its ttl before it refuses: a short one
    batcher = Batcher(r, config, run=run, alive_ttl_ms=1500)
    producer_thread()
    batcher.get_batch("train", timeout_s=30)  # and now it trains, its liveness key fresh
    out = cli("reset", "--yes", "--redis-url", redis_url, "--run", run)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.strip() == (f"error: run {run}: not reset: a trainer still runs "
                                  "(batcher batcher-0), and it would put the run back; the "
                                  "run is stopped: end the trainer, then reset again")
    assert r.exists(Keys(run).config) and r.exists(Keys(run).stop)
    batcher.close()
    # in this process: `reset` ends by itself and starts nothing (its refusal above is a
    # process's, whose whole stderr is that one line)
    out = run_cli_here("reset", "--yes", "--redis-url", redis_url, "--run", run)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("stopped", [True, False])
def test_up_takes_every_producer_gone_at_a_stop_as_the_end(r, run, redis_url, monkeypatch,
                                                           stopped):
    """`up`'s producers may be seen gone (all exited 0 at the stop) before its batcher looks
    at the stop key: that is the run's end (0), and without a stop still a failure."""
    import io

    import rollstream.trainer as launcher
    from schemas.errors import ProducersExited

    def producers_gone(batcher, opts, progress):
        if stopped:
            r.set(Keys(run).stop, 1)
        raise ProducersExited("every producer exited (exit codes [0])")

    monkeypatch.setattr(launcher, "trainer_loop", producers_gone)
    opts = launcher.UpOptions(config=small_config(), redis_url=redis_url, run=run)
    out = io.StringIO()
    if stopped:
        assert launcher.train_session(r, opts, "header", out) == 0
        assert f"run '{run}' was stopped (rollstream stop)" in out.getvalue()
    else:
        with pytest.raises(ProducersExited):
            launcher.train_session(r, opts, "header", out)
