"""`env_type: openenv`: envs on real OpenEnv env servers (tests/openenv_server.py, built with
openenv-core's server API, started as processes), played over their WebSocket sessions by
producers, through Redis to the batcher. No mock: servers are killed and restarted for real,
and the tests wait for what the servers print (a step), not for timers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from helpers import free_port, run_cli, small_config, stream_messages, wait_for
from openenv_servers import HAVE_OPENENV, EnvServer, ForkServer

from consumer.batcher import Batcher
from producers.envs import build_env
from producers.envs.openenv import OpenEnvEnv, string_field
from producers.envs.remote import RemoteEnvError
from schemas.keys import Keys
from schemas.seeding import episode_seed

needs_openenv = pytest.mark.skipif(not HAVE_OPENENV,
                                   reason="needs openenv-core (the openenv extra)")


@pytest.fixture(scope="module")
def forks() -> Iterator[ForkServer]:
    """One fork server for the module: openenv-core imported once, not per server."""
    forks = ForkServer()
    yield forks
    forks.close()


@pytest.fixture
def servers(forks: ForkServer) -> Iterator[Any]:
    started: list[EnvServer] = []

    def start(max_sessions: int = 1, stop_when_full: bool = False) -> EnvServer:
        server = EnvServer(free_port(), max_sessions, forks=forks,
                           stop_when_full=stop_when_full).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def guess_config(urls: list[str], max_sessions: int, down_wait_s: float = 2.0,
                 step_timeout_s: float = 10.0, reset_timeout_s: float | None = None,
                 **overrides: Any):
    env_config = {"base_urls": urls, "max_sessions": max_sessions, "down_wait_s": down_wait_s,
                  "step_timeout_s": step_timeout_s, "reset_timeout_s": 10.0}
    if reset_timeout_s is not None:  # with the fields given: no GET /schema before a session
        env_config.update(reset_timeout_s=reset_timeout_s, action_field="guess",
                          observation_field="prompt")
    return small_config(
        custom_envs={"Guess": {"env_type": "openenv", "env_config": env_config}},
        train_env_manager={"tags": ["Guess"]}, val_env_manager=None, **overrides)


def test_bad_base_urls_are_one_line_exit_2(tmp_path) -> None:
    for env_config, said in (({}, "env_config.base_urls must list the OpenEnv env servers"),
                             ({"base_urls": ["ftp://envs:8000"]}, "is not an http(s) URL"),
                             ({"base_urls": ["http://envs:port"]}, "has a bad port")):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump({
            "custom_envs": {"Guess": {"env_type": "openenv", "env_config": env_config}},
            "train_env_manager": {"max_env_num_per_worker": 4, "num_env_groups": 2,
                                  "group_size": 2, "tags": ["Guess"]}}))
        out = run_cli("config", "check", str(path))
        assert out.returncode == 2, out
        assert said in out.stderr and "custom_envs.Guess" in out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_config_check_says_in_one_line_that_no_server_answers(tmp_path) -> None:
    path = tmp_path / "down.yaml"
    path.write_text(yaml.safe_dump({
        "custom_envs": {"Guess": {"env_type": "openenv", "env_config": {
            "base_urls": [f"http://127.0.0.1:{free_port()}"], "down_wait_s": 0.2}}},
        "train_env_manager": {"max_env_num_per_worker": 4, "num_env_groups": 2,
                              "group_size": 2, "tags": ["Guess"]}}))
    out = run_cli("config", "check", str(path))
    assert out.returncode == 2, out
    assert "custom_envs.Guess: reset failed: RemoteEnvError: env server" in out.stderr
    assert "Cannot connect" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_default_fields_are_the_schemas_single_string_fields() -> None:
    schema = {"properties": {"guess": {"type": "string"}, "metadata": {"type": "object"}}}
    assert string_field(schema, "action") == "guess"
    two = {"properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    with pytest.raises(RemoteEnvError, match="2 string fields .a, b.: set env_config.action"):
        string_field(two, "action")


@needs_openenv
def test_an_env_resets_with_the_seed_and_steps_the_reply(servers) -> None:
    server = servers()

    async def play() -> list[Any]:
        env = OpenEnvEnv(base_urls=[server.url], action_pattern=r"<answer>(.*?)</answer>")
        try:
            obs, _ = await env.areset(seed=1237)
            assert env.action_field == "guess" and env.observation_field == "prompt"
            wrong = await env.astep_text("<answer>3</answer>")
            right = await env.astep_text("I think <answer> 7 </answer>")
            return [obs, wrong, right]
        finally:
            env.close()

    obs, wrong, right = asyncio.run(play())
    assert obs == "Guess a digit (0-9)."
    assert wrong[1:4] == (0.0, False, False)
    assert right[0] == "Right." and right[1:4] == (1.0, True, False)
    last = server.wait_line("step 1237 2")
    assert server.lines[last - 2:last + 1] == ["reset 1237", "step 1237 1", "step 1237 2"]


class Counting:
    """A policy answering like a model: a reply of text; it guesses 0, 1, 2, ... in turn."""

    async def act(self, observation: Any, ctx: Any) -> tuple[Any, str]:
        reply = f"Let me try. <answer>{ctx.turn}</answer>"
        return ctx.env.unwrapped.parse_action(reply), reply


@needs_openenv
def test_a_producer_episode_steps_with_the_replys_captured_action(servers) -> None:
    """`play_episode` awaits the remote env: reset with the episode's seed, each reply's
    `<answer>` sent as the action, the server's reward and done recorded; it encodes."""
    from producers.control import ControlState
    from producers.rollout import EnvSlot, play_episode
    from schemas.codec import decode_trajectory, encode_trajectory

    server = servers()

    async def gate() -> bool:
        return True

    async def play() -> dict[str, Any]:
        env = OpenEnvEnv(base_urls=[server.url], action_pattern=r"<answer>(.*?)</answer>")
        slot = EnvSlot(mode="train", env_id=0, group_id=0, member=0, shard=0, tag="Guess",
                       env=env)
        try:
            return await play_episode(slot, seed=5, producer_id="p", policy=Counting(),
                                      control=ControlState(), gate=gate)
        finally:
            env.close()

    traj = asyncio.run(play())
    seed = traj["seed"]
    assert seed == episode_seed(5, "train", 0, 0)
    target = seed % 10
    assert traj["num_actions"] == min(target + 1, 3)
    assert [step["action"] for step in traj["steps"]] == [str(i) for i in range(
        traj["num_actions"])]
    assert traj["episode_score"] == (1.0 if target < 3 else 0.0) and traj["terminated"]
    assert traj["steps"][0]["response"] == "Let me try. <answer>0</answer>"
    assert decode_trajectory(encode_trajectory(traj))["steps"] == traj["steps"]
    assert f"reset {seed}" in server.lines[server.wait_line(f"reset {seed}")]


@needs_openenv
def test_episodes_end_to_end_through_rollstream(r, run, servers, producer_thread) -> None:
    """Producers play the env's episodes on the server; trajectories reach the batcher with
    the server's observations and rewards, reset with each episode's seed; a server with
    max_concurrent_envs 2 never refuses a session (the producer keeps to max_sessions)."""
    server = servers(max_sessions=2)
    config = guess_config([server.url], 2)
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    batch = batcher.get_batch("train", timeout_s=60)
    assert len(batch.trajectories) == 16
    for traj in batch.trajectories:
        assert not traj["failed"] and 1 <= traj["num_actions"] <= 3
        assert traj["steps"][0]["observation"] == "Guess a digit (0-9)."
        assert traj["terminated"]
        assert f"reset {traj['seed']}" in server.lines
        assert traj["seed"] == episode_seed(config.seed, "train", traj["group_id"],
                                            traj["episode_id"])
    assert sum(thread.producer.stats.env_errors.values()) == 0
    batcher.ack(batch)
    assert thread.stop() == 0
    assert not any("CAPACITY" in line for line in server.lines)
    # every trajectory of the streams is a clean one: no session was refused or replayed
    assert not any(t["failed"] for t in stream_messages(r, Keys(run), config))
    assert sum(thread.producer.stats.replayed.values()) == 0


@needs_openenv
def test_a_server_killed_mid_episode_costs_replays_not_trajectories(
        r, run, servers, producer_thread, caplog) -> None:
    """Two servers; one is killed while it holds open sessions (after it printed a step, in
    the middle of an episode of 3 turns): its episodes are replayed on a fresh session of the
    other server with the same seed; no trajectory is lost, doubled or failed, batches keep
    coming; restarted, the server is used again; each change of state is one log line."""
    caplog.set_level(logging.WARNING, logger="producers.envs.remote")
    a, b = servers(max_sessions=4), servers(max_sessions=4)
    config = guess_config([a.url, b.url], 4, async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    a.wait_line("step ")
    a.kill()
    batches = [batcher.get_batch("train", timeout_s=60)]
    batcher.ack(batches[0])
    batcher.publish_version()
    wait_for(lambda: sum(thread.producer.stats.replayed.values()) >= 1, timeout_s=30,
             what="an episode replayed")
    back = len(a.lines)
    a.start()  # back on the same port: the producer's probe finds it
    wait_for(lambda: any("is back" in rec.getMessage() for rec in caplog.records),
             timeout_s=60, what="the server back in the producer's pool")
    for _ in range(2):
        batch = batcher.get_batch("train", timeout_s=60)
        batches.append(batch)
        batcher.ack(batch)
        batcher.publish_version()
    a.wait_line("reset ", after=back)  # the producer opened sessions on it again
    assert thread.stop() == 0
    for batch in batches:
        assert not any(t["failed"] for t in batch.trajectories)
    # never a lost or doubled trajectory: 3 batches of 16 distinct (group, episode, member)
    handed = [(t["group_id"], t["episode_id"], t["member"])
              for batch in batches for t in batch.trajectories]
    assert len(handed) == len(set(handed)) == 48
    down = [rec for rec in caplog.records if "until it answers" in rec.getMessage()]
    up = [rec for rec in caplog.records if "is back" in rec.getMessage()]
    assert len(down) == 1 and a.url in down[0].getMessage()
    assert len(up) == 1 and a.url in up[0].getMessage()


@needs_openenv
def test_a_hung_server_misses_its_step_deadline_and_is_set_aside(
        r, run, servers, producer_thread, caplog) -> None:
    """A server that stops (SIGSTOP) mid-step while all its 4 sessions are mid-episode
    answers nothing: the step deadline (step_timeout_s) sets it aside and the episodes are
    replayed on the other server; continued (SIGCONT), the probe brings it back. The server
    stops itself at that point (`stop_when_full`): a SIGSTOP this test sent on seeing a line
    would land some steps later (its threads wait on the producer's), at times on a session
    still opening or resetting there."""
    caplog.set_level(logging.INFO, logger="producers.envs.remote")
    a, b = servers(max_sessions=4, stop_when_full=True), servers(max_sessions=4)
    config = guess_config([a.url, b.url], 4, step_timeout_s=1.0)
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    a.wait_line("stopped")
    batch = batcher.get_batch("train", timeout_s=60)
    assert not any(t["failed"] for t in batch.trajectories)
    assert sum(thread.producer.stats.replayed.values()) >= 1
    a.resume()
    wait_for(lambda: any("is back" in rec.getMessage() for rec in caplog.records),
             timeout_s=60, what="the server back in the producer's pool")
    assert thread.stop() == 0
    said = [rec.getMessage() for rec in caplog.records]
    assert any(f"env server {a.url} down: no answer to step within 1 s" in m for m in said)
    assert any("at most 4 sessions each" in m for m in said)  # the cap, said once
    assert sum("at most 4 sessions each" in m for m in said) == 1


@needs_openenv
def test_a_server_hung_before_the_first_session_is_set_aside_at_connect(
        r, run, servers, producer_thread, caplog) -> None:
    """A server stopped (SIGSTOP) before the producer starts accepts connections (the kernel
    does) and answers nothing: the websocket upgrade of each session on it is bounded by
    reset_timeout_s (it had aiohttp's 300 s), the server set aside, the episodes played on the
    other one. The fields are given, so no GET /schema (bounded already) comes first."""
    caplog.set_level(logging.INFO, logger="producers.envs.remote")
    a, b = servers(max_sessions=4), servers(max_sessions=4)
    config = guess_config([a.url, b.url], 4, reset_timeout_s=1.0)
    a.pause()
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    batch = batcher.get_batch("train", timeout_s=60)
    assert not any(t["failed"] for t in batch.trajectories)
    a.resume()
    assert thread.stop() == 0
    said = [rec.getMessage() for rec in caplog.records]
    assert any(f"env server {a.url} down: no answer to connect within 1 s" in m for m in said)


@needs_openenv
def test_a_server_that_stays_down_fails_the_group_after_the_bounded_replays(
        r, run, servers, producer_thread) -> None:
    """One server, killed mid-episode and never back: each episode in flight is replayed
    env_max_retries times (a fresh session, which finds no server up within down_wait_s),
    then committed failed with the server's reason, so its group fails; the run does not
    stall (every env commits) and the producer stops cleanly."""
    server = servers(max_sessions=16)
    config = guess_config([server.url], 16, down_wait_s=0.3, env_max_retries=1)
    Batcher(r, config, run=run)
    thread = producer_thread()
    server.wait_line("step ")
    server.kill()
    keys = Keys(run)

    # version 0 only (no trainer): each of the 16 envs commits its episode 0, clean or failed
    wait_for(lambda: len(stream_messages(r, keys, config)) == 16, timeout_s=60,
             what="every env's episode committed")
    stats = thread.producer.stats
    assert thread.stop() == 0
    failed = [t for t in stream_messages(r, keys, config) if t["failed"]]
    assert failed  # the episodes in flight at the kill
    for traj in failed:
        assert server.url in traj["error"] and "RemoteEnvError" in traj["error"]
    # each failed episode was played once and replayed exactly env_max_retries (1) times
    assert stats.replayed[("train", "Guess")] == len(failed)
    assert stats.env_errors[("train", "Guess")] == 2 * len(failed)


@needs_openenv
def test_build_env_makes_the_remote_env_of_a_tag() -> None:
    config = guess_config(["http://127.0.0.1:1"], 3)
    env = build_env(config, "Guess")
    assert isinstance(env.unwrapped, OpenEnvEnv) and env.unwrapped.max_sessions == 3
    env.close()
