"""Generation under control, against the stand-in LLM server on loopback with real producers
and a real Batcher: a pause, an expiry or a stop closes the requests in flight (the server
sees its client go away), a turn cut short by a pause or aborted by a weight update is sent
again, and every turn records the weight version that generated it, as the trainer's
`ModelServers` updates the servers through SGLang's and vLLM's endpoints.

Every situation is made to happen with evidence: the server holds the requests it is told to
(`hold`), and the tests wait for its counters (held, in flight, cancelled, aborted) or the
policy's (turns waiting for a version), never for a timer alone.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import threading
from collections import Counter
from typing import Any

import pytest
import redis
from helpers import ONE_STEP_ENV_ID, stream_messages, wait_for
from llm_helpers import (
    MODEL,
    answered,
    fake_llm_factory,
    lake_config,
    run_steps,
    steps_of,
)

from consumer import Batcher, ModelServers
from producers.policies import StepContext
from rollstream.fake_llm import FakeLLMOptions, FakeLLMServer
from rollstream.status.snapshot import snapshot
from schemas.errors import ConfigError, ServerUpdateError
from schemas.keys import Keys
from schemas.policy import read_server_record

fake_llm = pytest.fixture(fake_llm_factory)


def set_pause(r: redis.Redis, keys: Keys, on: bool) -> None:
    """What `rollstream pause` / `resume` do."""
    (r.sadd if on else r.srem)(keys.pause, "operator")
    r.publish(keys.control, b"pause")


# -- pause, expiry and stop close the requests in flight ------------------------------------
def test_a_sync_pause_closes_generations_and_nothing_runs_until_the_publish(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    """Sync, vLLM LoRA adapters: the Lake groups fill the batch while the Slow tag's turns are
    held in flight; the hand-out's pause closes them, no request reaches the server while the
    trainer loads version 1, and after the publish every turn names adapter 1 and records it
    (read on the version change: the producers do not wait for their poll)."""
    server = fake_llm(latency_s=0.002, load_time_s=0.05)
    server.hold("SLOW")
    config = lake_config([server.base_url], batch=8, slow_tag=True)
    batcher = Batcher(r, config, run=run)
    servers = ModelServers.for_batcher(batcher, "vllm-lora", adapter_name="policy-v{version}")
    producer_thread()
    wait_for(lambda: server.stats["held"] == 8, what="the Slow envs' turns held in flight")

    first = batcher.get_batch(timeout_s=30)
    assert {t["tag"] for t in first.trajectories} == {"Lake"}
    wait_for(lambda: server.stats["cancelled"] == 8 and server.in_flight == 0,
             what="the pause to close the held requests")
    requests = server.stats["requests"]
    assert servers.update(1, "/ckpt/lora-1") == {server.base_url: 1}
    server.release()
    batcher.ack(first)
    assert server.stats["requests"] == requests  # nothing generated while paused
    batcher.publish_version()

    second = batcher.get_batch(timeout_s=30)
    assert second.metrics["scheduler/stale_dropped"] == 0
    seeds = answered(server)
    for step, seed in steps_of([second]):
        assert (step["version"], step["version_source"]) == (1, "recorded")
        assert seeds[seed]["model"] == "policy-v1"
    # the Slow episodes cut short at version 0 expired with it: abandoned, never committed
    slow = [m for m in stream_messages(r, Keys(run), config) if m["tag"] == "Slow"]
    assert all(m["episode_id"] >= 1 for m in slow)


def test_an_operator_pause_closes_turns_that_are_sent_again_after_it(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    """`partial_rollout.in_flight: abort` (the default, keep: tests/test_partial_rollout.py)."""
    server = fake_llm(latency_s=0.002)
    server.hold()
    config = lake_config([server.base_url], partial_rollout={"in_flight": "abort"})
    batcher = Batcher(r, config, run=run)
    producer_thread()
    wait_for(lambda: server.stats["held"] == 16, what="every env's first turn held")
    firsts = {body["seed"]: body for body in list(server.requests)}
    assert len(firsts) == 16

    set_pause(r, batcher.keys, True)
    wait_for(lambda: server.stats["cancelled"] == 16 and server.in_flight == 0,
             what="the pause to close the held requests")
    assert server.stats["requests"] == 16
    server.release()
    set_pause(r, batcher.keys, False)

    batch = batcher.get_batch(timeout_s=30)
    assert len(batch) == 16 and {t["episode_id"] for t in batch.trajectories} == {0}
    bodies = list(server.requests)
    for seed, body in firsts.items():  # each first turn sent again exactly as before
        assert [b for b in bodies if b["seed"] == seed] == [body, body]
    for body in bodies:  # no half turn: user and assistant alternate after the system
        roles = [m["role"] for m in body["messages"]]
        assert roles == ["system"] + ["user", "assistant"] * (len(roles) // 2 - 1) + ["user"]
    answered(server)  # and no turn was generated twice


def test_an_episode_expiring_mid_request_is_abandoned_and_its_request_closed(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    server = fake_llm(latency_s=0.002)
    server.hold()
    config = lake_config([server.base_url], ratio=1)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    wait_for(lambda: server.stats["held"] == 16, what="every env's first turn held")
    episode_0 = {body["seed"] for body in list(server.requests)}

    batcher.publish_version()
    batcher.publish_version()  # version 2: episode 0 (step 0) is more than 1 version stale
    wait_for(lambda: server.stats["cancelled"] == 16,  # (the next episodes' turns are held)
             what="the expiry to close the held requests")
    server.release()
    batch = batcher.get_batch(timeout_s=30)
    assert min(t["episode_id"] for t in batch.trajectories) == 2  # first live at version 2
    assert all(m["episode_id"] >= 2 for m in stream_messages(r, batcher.keys, config))
    assert not episode_0 & set(answered(server))  # never generated


def test_a_producer_stop_closes_its_requests(fake_llm, producer_thread, r: redis.Redis,
                                             run: str) -> None:
    server = fake_llm()
    server.hold()
    Batcher(r, lake_config([server.base_url]), run=run)
    producer = producer_thread()
    wait_for(lambda: server.stats["held"] == 16, what="every env's first turn held")
    assert producer.stop() == 0
    wait_for(lambda: server.stats["cancelled"] == 16 and server.in_flight == 0,
             what="the stop to close the held requests")


# -- weight updates while producers run --------------------------------------------------------
def check_staleness_spread(versions: set[int]) -> None:
    """The first batch is all version 0; the last, taken at version 3 with ratio 1, only
    holds trajectories that started at version 2 or later."""
    assert 0 in versions and max(versions) >= 2


def test_sglang_updates_while_producers_run(fake_llm, producer_thread, r: redis.Redis,
                                            run: str) -> None:
    """Async: every turn records the version the server reported when it answered; turns
    aborted by an update (held in flight when it lands) are sent again, once each."""
    # mostly malformed replies (no-op steps): episodes run to their 6 steps, so second turns
    # are in flight when the hold starts (ROLL's lake is often solved in one or two moves)
    server = fake_llm(flavor="sglang", latency_s=0.003, load_time_s=0.05, p_good=0.3,
                      malformed_share=1.0)
    batcher = Batcher(r, lake_config([server.base_url], ratio=1,  # (the default, keep:
                                     partial_rollout={"in_flight": "abort"}), run=run)
    servers = ModelServers.for_batcher(batcher, "sglang")  # tests/test_partial_rollout.py)
    producer_thread()
    batches = run_steps(batcher, servers, 1)

    batch = batcher.get_batch(timeout_s=30)  # version 1; the update to 2 lands on held turns
    batches.append(batch)
    server.hold('"role":"assistant"')  # turns after the first: a replayed episode would show
    wait_for(lambda: server.stats["held"] >= 1, what="a turn held in flight")
    servers.update(2, "/ckpt/2")
    server.release()
    aborts = [a for a in list(server.answers) if a["finish_reason"] == "abort"]
    assert any(a["weight_version"] == "1" for a in aborts)  # cut off by the update to 2
    aborted = {a["seed"] for a in aborts}  # (the update to 1 may have aborted some too)
    # at version 1 no episode expires, so each aborted turn must come back
    wait_for(lambda: aborted <= set(answered(server)), what="the aborted turns sent again")
    batcher.ack(batch)
    batcher.publish_version(2)
    batches += run_steps(batcher, servers, 1)
    batches.append(batcher.get_batch(timeout_s=30))

    seeds = answered(server)
    versions = set()
    for step, seed in steps_of(batches):
        reported = seeds[seed]["weight_version"]
        if reported == "default":  # before the first update: nothing reported or recorded
            assert (step["version"], step["version_source"]) == (0, "producer")
        else:
            assert (step["version"], step["version_source"]) == (int(reported), "server")
        versions.add(step["version"])
    check_staleness_spread(versions)
    assert servers.holding() == {server.base_url: (3, None)}


def test_a_version_ahead_of_the_run_from_a_server_it_never_loaded_is_not_the_runs(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    """A server still holding another run's weights reports their number (here 5, while this
    run is at 0-1): the run has no record of it and cannot have made version 5 yet, so its
    turns are labelled with the producer's version. Before, they were labelled 5: negative
    staleness, the trajectories' version_start ahead of the run."""
    server = fake_llm(flavor="sglang", latency_s=0.003, weight_version="5")
    batcher = Batcher(r, lake_config([server.base_url], ratio=1), run=run)
    producer_thread()
    batches = []
    for _ in range(2):
        batches.append(batcher.get_batch(timeout_s=30))
        batcher.ack(batches[-1])
        batcher.publish_version()
    for step, seed in steps_of(batches):
        assert answered(server)[seed]["weight_version"] == "5"  # what the server said
        assert step["version_source"] == "producer" and step["version"] <= 2
    assert min(batch.metrics["scheduler/staleness/mean"] for batch in batches) >= 0


def test_vllm_lora_updates_while_producers_run(fake_llm, producer_thread, r: redis.Redis,
                                               run: str) -> None:
    """Async: turns name the adapter of the version their server holds and record it; the
    adapters older than the window (one version back at ratio 1) are unloaded."""
    server = fake_llm(latency_s=0.003, load_time_s=0.02)
    batcher = Batcher(r, lake_config([server.base_url], ratio=1), run=run)
    servers = ModelServers.for_batcher(batcher, "vllm-lora", adapter_name="policy-v{version}")
    producer_thread()
    batches = run_steps(batcher, servers, 3)
    batches.append(batcher.get_batch(timeout_s=30))
    seeds = answered(server)
    versions = set()
    for step, seed in steps_of(batches):
        model = seeds[seed]["model"]
        if model == MODEL:
            assert (step["version"], step["version_source"]) == (0, "producer")
        else:
            assert model == f"policy-v{step['version']}" and step["version_source"] == "recorded"
        versions.add(step["version"])
    check_staleness_spread(versions)
    assert sorted(server.adapters) == ["policy-v2", "policy-v3"]
    assert servers.holding() == {server.base_url: (3, "policy-v3")}


def test_a_loader_callable_and_errors_that_name_the_server(fake_llm, r: redis.Redis,
                                                           run: str) -> None:
    """Anything else (a full-parameter vLLM update) goes through the trainer's callable; a
    server that fails is named, the others are recorded."""
    good, bad = fake_llm(), fake_llm()
    calls = []

    def load(base_url: str, version: int, path: str) -> str | None:
        calls.append((base_url, version, path))
        if base_url == bad.base_url:
            raise RuntimeError("the RPC timed out")
        return None

    servers = ModelServers(r, run, [good.base_url, bad.base_url + "/"], method=load,
                           watch_s=None)
    with pytest.raises(ServerUpdateError) as info:
        servers.update(4, "/ckpt/4")
    assert str(info.value) == (f"model server {bad.base_url}: loading version 4 failed: "
                               "RuntimeError: the RPC timed out")
    assert sorted(calls) == sorted([(good.base_url, 4, "/ckpt/4"), (bad.base_url, 4, "/ckpt/4")])
    assert servers.holding() == {good.base_url: (4, None)}

    bad.stop()
    sglang = ModelServers(r, run, [bad.base_url], method="sglang", timeout_s=5, watch_s=None)
    with pytest.raises(ServerUpdateError, match=f"^model server {bad.base_url}: .* cannot be "
                       "reached"):
        sglang.update(5, "/ckpt/5")
    slow = fake_llm(flavor="sglang", load_time_s=3.0)  # takes the update, answers after 3 s
    with pytest.raises(ServerUpdateError, match=f"^model server {slow.base_url}: .* did not "
                       "answer within 0.5s"):
        ModelServers(r, run, [slow.base_url], method="sglang", timeout_s=0.5,
                     watch_s=None).update(5, "/c/5")
    lora = ModelServers(r, run, [good.base_url], method="vllm-lora", watch_s=None)
    good.adapters["rollstream-v6"] = "/elsewhere"  # loaded by an earlier, failed call
    assert lora.update(6, "/ckpt/6") == {good.base_url: 6}  # not loaded twice: no 400
    assert lora.holding()[good.base_url] == (6, "rollstream-v6")


def test_require_version_holds_turns_until_a_server_catches_up(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    server = fake_llm(flavor="sglang", latency_s=0.003, load_time_s=0.02)
    batcher = Batcher(r, lake_config([server.base_url], ratio=1, require_version=True),
                      run=run)
    servers = ModelServers.for_batcher(batcher, "sglang")
    producer = producer_thread().producer
    for _ in range(2):  # versions 1 and 2 published, the server left at its first weights
        batcher.ack(batcher.get_batch(timeout_s=30))
        batcher.publish_version()
    # version 2 with ratio 1: a turn needs a server holding >= 1; this one holds 0
    wait_for(lambda: producer.policy.pool.version_waiting >= 1 and server.in_flight == 0,
             timeout_s=10, what="turns waiting for a server to catch up")
    behind = len(server.answers)
    servers.update(2, "/ckpt/2")
    batch = batcher.get_batch(timeout_s=30)
    seeds = answered(server)
    late = list(server.answers)[behind:]
    assert late and {a["weight_version"] for a in late} == {"2"}
    for step, seed in steps_of([batch]):
        if seed in {a["seed"] for a in late}:
            assert (step["version"], step["version_source"]) == (2, "server")
        assert seeds[seed]["weight_version"] in ("default", "2")
    assert all(s["version"] >= 1 for s, _ in steps_of([batch]))


def test_require_version_keeps_a_new_versions_episodes_within_the_ratio(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    """Ratio 1, T = 1: publishing version v before the server holds it admits episode v + 1,
    of step v. It waits for a server holding v; the episodes of step v - 1 go on with v - 1.
    With the floor `run version - ratio` it was served by v - 1 and handed out at v + 1, two
    versions stale."""
    server = fake_llm(flavor="sglang", latency_s=0.003)
    batcher = Batcher(r, lake_config([server.base_url], ratio=1, require_version=True),
                      run=run)
    servers = ModelServers.for_batcher(batcher, "sglang", watch_s=None)
    producer = producer_thread().producer
    batches = [batcher.get_batch(timeout_s=30)]
    for version in (1, 2, 3):
        batcher.ack(batches[-1])
        batcher.publish_version(version)  # the server still holds version - 1
        wait_for(lambda: producer.policy.pool.version_waiting >= 1, timeout_s=10,
                 what=f"turns of step {version} waiting for a server holding it")
        servers.update(version, f"/ckpt/{version}")
        batches.append(batcher.get_batch(timeout_s=30))
    for batch in batches:
        assert batch.metrics["scheduler/staleness/max"] <= 1, batch.version
        for traj in batch.trajectories:
            assert traj["version_start"] >= max(0, traj["episode_id"] - 1), traj["traj_id"]


# -- the mechanism -----------------------------------------------------------------------------
class WaitingPolicy:
    """Its first call waits until cancelled; later calls answer at once."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered: asyncio.Event | None = None

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, None]:
        self.calls += 1
        if self.calls == 1:
            assert self.entered is not None
            self.entered.set()
            await asyncio.Event().wait()
        return 0, None


def test_in_flight_takes_back_only_its_own_cancellation() -> None:
    """A call cut short by `interrupt()` is gated and sent again, and leaves its task
    uncancelled; a task also cancelled by someone else (a stop) stays cancelled."""
    from producers.control import ControlState
    from producers.envs import make_env
    from producers.rollout import EnvSlot, InFlight, play_episode

    async def episode(also_cancel: bool) -> tuple[Any, WaitingPolicy, int]:
        policy, inflight, gates = WaitingPolicy(), InFlight(), []
        policy.entered = asyncio.Event()

        async def gate() -> bool:
            gates.append(1)
            return True

        async def play() -> tuple[dict[str, Any], int]:
            slot = EnvSlot(mode="train", env_id=0, group_id=0, member=0, shard=0, tag="One",
                           env=make_env(ONE_STEP_ENV_ID, {}))
            traj = await play_episode(slot, seed=1, producer_id="p", policy=policy,
                                      control=ControlState(), gate=gate, inflight=inflight,
                                      must_stop=lambda: True)
            return traj, asyncio.current_task().cancelling()

        task = asyncio.create_task(play())
        await policy.entered.wait()
        assert inflight.interrupt() == 1
        if also_cancel:
            task.cancel()
        try:
            traj, cancelling = await task
        except asyncio.CancelledError:
            return None, policy, len(gates)
        assert not inflight.calls and cancelling == 0
        return traj, policy, len(gates)

    traj, policy, gates = asyncio.run(episode(also_cancel=False))
    assert traj["num_actions"] == 1 and policy.calls == 2 and gates == 2
    traj, policy, gates = asyncio.run(episode(also_cancel=True))
    assert traj is None and policy.calls == 1


def test_a_policy_start_gets_the_context_when_it_takes_one() -> None:
    from producers.policies import PolicyContext, start_policy

    class Plain:
        started = False

        async def start(self) -> None:
            self.started = True

    class WithContext:
        context: PolicyContext | None = None

        async def start(self, context: PolicyContext) -> None:
            self.context = context

    context = PolicyContext(redis=None, keys=Keys("x"), config=lake_config(["http://h/v1"]),
                            producer_id="p")
    plain, with_context = Plain(), WithContext()
    asyncio.run(start_policy(plain, context))
    asyncio.run(start_policy(with_context, context))
    asyncio.run(start_policy(object(), context))  # no start at all
    assert plain.started and with_context.context is context


# -- a model server restarted mid-run -----------------------------------------------------
def restarted(server: Any) -> FakeLLMServer:
    """`server` killed and started again on its port: its launch weights, no adapters."""
    port = server.port
    server.stop()
    return FakeLLMServer(FakeLLMOptions(flavor=server.options.flavor,
                                        latency_s=server.options.latency_s), port=port).start()


def test_a_restarted_sglang_server_is_set_aside_until_its_weights_are_loaded_again(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    """Its answers report the launch weights ("default") where version 2 was loaded: none of
    them is used (before, they were labelled version 2 from the record); `heal()` loads the
    recorded checkpoint again and the run goes on."""
    server = fake_llm(flavor="sglang", latency_s=0.003)
    batcher = Batcher(r, lake_config([server.base_url], ratio=1), run=run)
    servers = ModelServers.for_batcher(batcher, "sglang", watch_s=None)
    producer_thread()
    batches = run_steps(batcher, servers, 2)  # the server holds version 2
    again = restarted(server)
    try:
        wait_for(lambda: any(a["weight_version"] == "default" for a in list(again.answers)),
                 what="an answer from the restarted server's launch weights")
        config, keys = batcher.config, Keys(run)
        warning = f"model server {server.base_url} set aside by 1 producer(s): it answers " \
                  "with weight_version 'default' where version 2 was loaded"
        wait_for(lambda: any(w.startswith(warning) for w in
                             snapshot(r, keys, config)["warnings"]),
                 what="rollstream status to show the server set aside")
        assert servers.heal() == {server.base_url: 2}
        wait_for(lambda: not snapshot(r, keys, config)["model_servers"][0]["set_aside"],
                 what="the server back in use")
        assert (again.options.weight_version, again.options.model_path) == ("2", "/ckpt/2")
        assert servers.heal() == {}  # it holds them now
        batches += run_steps(batcher, servers, 1)
        batches.append(batcher.get_batch(timeout_s=30))
    finally:
        again.stop()
    sources = Counter((step["version_source"], step["version"]) for batch in batches
                      for traj in batch.trajectories for step in traj["steps"])
    assert {source for source, version in sources if version > 0} == {"server"}, sources
    assert {version for source, version in sources if source == "producer"} == {0}


@pytest.mark.parametrize("method, source", [("sglang", "server"), ("vllm-lora", "recorded")])
def test_a_server_that_missed_every_update_is_set_aside_not_mislabelled(
        fake_llm, producer_thread, r: redis.Redis, run: str, method: str, source: str) -> None:
    """Server B was down for the first update (A took it) and came back on its launch
    weights with no record: its turns were labelled with the run's version (the producer's
    fallback), weights they did not come from. It is not used until the trainer's
    `ModelServers` loads a checkpoint into it (here its next update)."""
    flavor = "sglang" if method == "sglang" else "vllm"
    a, b = fake_llm(flavor=flavor, latency_s=0.003), fake_llm(flavor=flavor, latency_s=0.003)
    # least_loaded: B's use once back is what is looked at, not where sessions hash
    batcher = Batcher(r, lake_config([a.base_url, b.base_url], routing="least_loaded"), run=run)
    servers = ModelServers.for_batcher(batcher, method, watch_s=None)
    producer_thread()
    batch = batcher.get_batch(timeout_s=30)
    b.stop()
    with pytest.raises(ServerUpdateError, match=re.escape(b.base_url)):
        servers.update(1, "/ckpt/1")  # A loads it; B misses it
    batcher.ack(batch)
    batcher.publish_version(1)
    again = restarted(b)
    try:
        batches = [batcher.get_batch(timeout_s=30)]
        batcher.ack(batches[-1])
        servers.update(2, "/ckpt/2")  # B is back: it takes this one (and is recorded)
        batcher.publish_version(2)
        batches.append(batcher.get_batch(timeout_s=30))
    finally:
        again.stop()
    steps = [step for batch in batches for traj in batch.trajectories for step in traj["steps"]]
    assert {(s["version_source"], s["version"]) for s in steps} <= {(source, 1), (source, 2)}
    assert any(s["server"] == b.base_url for s in steps if s["version"] == 2)


def test_a_restarted_vllm_server_loses_no_group_and_the_watch_loads_its_adapter(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    """Its 404s for the adapter the turns name set it aside (before, each failed its episode
    and the group was dropped); `watch()` loads the adapter again, and no group is lost."""
    server = fake_llm(latency_s=0.003)
    batcher = Batcher(r, lake_config([server.base_url], ratio=1), run=run)
    servers = ModelServers.for_batcher(batcher, "vllm-lora", watch_s=None)
    producer_thread()
    batches = run_steps(batcher, servers, 2)
    again = restarted(server)
    try:
        wait_for(lambda: again.stats["unknown_model"] >= 1, what="a request for the lost adapter")
        with servers.watch(interval_s=0.05):
            wait_for(lambda: "rollstream-v2" in again.adapters, what="the watch to reload it")
        assert again.adapters["rollstream-v2"] == "/ckpt/2"
        batches += run_steps(batcher, servers, 1)
        batches.append(batcher.get_batch(timeout_s=30))
    finally:
        again.stop()
    assert batcher.totals["scheduler/failed_groups"] == 0
    assert sum(len(batch.trajectories) for batch in batches) == 4 * 16


def test_heal_asks_what_each_server_holds(fake_llm, r: redis.Redis, run: str) -> None:
    """SGLang servers without `/model_info` answer on `/get_weight_version`; a callable
    loader's servers are checked by `check`, or left alone without one; a server that does
    not answer is left for the next call."""
    calls: list[str] = []

    class OlderSGLang(http.server.BaseHTTPRequestHandler):
        version = "default"

        def do_GET(self) -> None:
            calls.append(self.path)
            if self.path != "/get_weight_version":
                self.send_error(404)
                return
            self.answer({"weight_version": OlderSGLang.version})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(f"POST {self.path} {body['model_path']}")
            OlderSGLang.version = body["weight_version"]
            self.answer({"success": True})

        def answer(self, data: dict[str, Any]) -> None:
            raw = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: Any) -> None:
            pass

    older = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OlderSGLang)
    threading.Thread(target=older.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{older.server_address[1]}/v1"
        gone = fake_llm(flavor="sglang")
        gone_url = gone.base_url
        sglang = ModelServers(r, run, [url, gone_url], method="sglang", timeout_s=5,
                              watch_s=None)
        sglang.update(3, "/ckpt/3")
        assert calls == ["POST /update_weights_from_disk /ckpt/3"]
        assert sglang.heal() == {}  # both hold version 3
        loaded = read_server_record(r.hget(Keys(run).servers, url)).loaded_at
        OlderSGLang.version = "default"  # restarted
        gone.stop()  # and this one is down
        assert sglang.heal() == {url: 3}
        # recorded anew (producers that set it aside try it at once, not after a cooldown)
        again = read_server_record(r.hget(Keys(run).servers, url))
        assert again.version == 3 and again.loaded_at > loaded
        assert calls[-3:] == ["/model_info", "/get_weight_version",
                              "POST /update_weights_from_disk /ckpt/3"]
    finally:
        older.shutdown()
        older.server_close()

    held = {"a": 5}
    loads: list[tuple[str, int, str]] = []

    def load(base_url: str, version: int, path: str) -> None:
        loads.append((base_url, version, path))
        held[base_url] = version

    blind = ModelServers(r, run + "-blind", ["a"], method=load, watch_s=None)
    blind.update(5, "/ckpt/5")
    held["a"] = 0
    assert blind.heal() == {}  # no check: it cannot tell
    checked = ModelServers(r, run + "-blind", ["a"], method=load, check=held.get,
                           watch_s=None)
    assert checked.heal() == {"a": 5}
    assert loads == [("a", 5, "/ckpt/5"), ("a", 5, "/ckpt/5")]
    assert checked.heal() == {}
    held["a"] = None  # type: ignore[assignment]  # the check cannot tell: nothing is loaded
    assert checked.heal() == {} and len(loads) == 2

    def broken(base_url: str) -> int:
        raise ConnectionRefusedError("not up yet")

    assert ModelServers(r, run + "-blind", ["a"], method=load, check=broken,
                        watch_s=None).heal() == {}  # one warning; the next pass tries again
    with pytest.raises(ConfigError, match="interval_s must be > 0"):
        checked.watch(interval_s=0)
    r.delete(Keys(run + "-blind").servers)


def test_heal_brings_every_server_to_the_newest_checkpoint(fake_llm, r: redis.Redis,
                                                            run: str) -> None:
    """B was down during the update to 3 and comes back with its launch weights; C came back
    reporting version 2 (relaunched from /ckpt/2): both get /ckpt/3, the newest recorded (B's
    own record says 2: loading that would put it a version behind the run)."""
    a, b, c = (fake_llm(flavor="sglang") for _ in range(3))
    servers = ModelServers(r, run, [a.base_url, b.base_url, c.base_url], method="sglang",
                           timeout_s=5, watch_s=None)
    servers.update(2, "/ckpt/2")
    b.stop()
    with pytest.raises(ServerUpdateError, match=b.base_url):
        servers.update(3, "/ckpt/3")
    assert servers.holding()[b.base_url] == (2, None)
    b_again = restarted(b)
    c.stop()
    c_again = FakeLLMServer(FakeLLMOptions(flavor="sglang", weight_version="2",
                                           model_path="/ckpt/2"),
                            port=c.port).start()
    try:
        assert servers.heal() == {b.base_url: 3, c.base_url: 3}
        for server in (b_again, c_again):
            assert (server.options.weight_version, server.options.model_path) == ("3", "/ckpt/3")
        assert a.stats["weight_updates"] == 2  # it held 3 already
        assert servers.heal() == {}
    finally:
        b_again.stop()
        c_again.stop()


def test_the_watch_outlives_what_goes_wrong_and_heals(r: redis.Redis, run: str) -> None:
    """A check that raises (a server still starting) costs one pass, not the watch thread;
    `ModelServers` watches by default, and `close()` ends it."""
    held: dict[str, int] = {}
    asked: list[str] = []

    def check(base_url: str) -> int:
        asked.append(base_url)
        if len(asked) <= 3:
            raise ConnectionRefusedError("not up yet")
        return held.get(base_url, 0)

    def load(base_url: str, version: int, path: str) -> None:
        held[base_url] = version

    servers = ModelServers(r, run, ["a"], method=load, check=check, watch_s=None)
    servers.update(4, "/ckpt/4")
    held.clear()  # restarted
    watched = ModelServers(r, run, ["a"], method=load, check=check, watch_s=0.05)
    try:
        wait_for(lambda: held.get("a") == 4, what="the watch to load version 4 again")
        assert len(asked) >= 4  # after three passes that raised
    finally:
        watched.close()
    assert watched._watcher is None
    by_default = ModelServers(r, run, ["a"], method=load)  # watch_s=5.0
    assert by_default._watcher is not None and by_default._watcher.running
    by_default.close()
