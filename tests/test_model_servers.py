"""`ModelServers` pausing and loading each server as its own endpoints do, with real producers
on the stand-in's vLLM 0.33 and SGLang 0.5.23 flavors: vLLM full-parameter updates through
its RL endpoints, the pause modes of both (abort: turns in flight are sent again; vLLM keep,
SGLang in_place / retract: they finish under the new weights and carry both versions), the
versions read back from the answers, and the arguments refused or warned about."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import redis
from helpers import wait_for
from llm_helpers import answered, fake_llm_factory, http, lake_config, run_steps, steps_of

from consumer import Batcher, ModelServers
from schemas.errors import ConfigError, ServerUpdateError

fake_llm = pytest.fixture(fake_llm_factory)


def test_vllm_full_weight_updates_while_producers_run(
        fake_llm, producer_thread, r: redis.Redis, run: str) -> None:
    """`method="vllm"`: /pause (abort), /collective_rpc reload_weights from the checkpoint,
    /update_weight_version, /resume; every turn after the first update records the version
    its answer's `weight_versions` name (source `server`)."""
    server = fake_llm(flavor="vllm", latency_s=0.003, load_time_s=0.05)
    batcher = Batcher(r, lake_config([server.base_url], ratio=1,
                                     partial_rollout={"in_flight": "abort"}), run=run)
    servers = ModelServers.for_batcher(batcher, "vllm", watch_s=None)
    assert servers.pause_mode == "abort"  # as the policy asks (default: keep)
    producer_thread()
    batches = run_steps(batcher, servers, 2)
    batches.append(batcher.get_batch(timeout_s=30))
    assert server.stats["pauses"] == 2 and server.stats["weight_updates"] == 2
    assert server.options.model_path == "/ckpt/2" and server.options.weight_version == "2"
    assert all(b.get("return_weight_versions") for b in list(server.requests))
    seeds = answered(server)
    for step, seed in steps_of(batches):
        label = seeds[seed]["weight_version"]
        if label == "default":
            assert (step["version"], step["version_source"]) == (0, "producer")
        else:
            assert (step["version"], step["version_source"]) == (int(label), "server")
    assert servers.holding() == {server.base_url: (2, None)}
    # restarted: its answers say "default" again; heal() reads /weight_info and reloads
    server.options.weight_version = "default"
    assert servers.heal() == {server.base_url: 2}
    assert server.options.weight_version == "2"


@pytest.mark.parametrize("flavor, method, mode", [
    ("vllm", "vllm", "keep"), ("sglang", "sglang", "in_place"),
    ("sglang", "sglang", "retract"),
])
def test_a_pause_that_keeps_turns_finishes_them_under_both_versions(
        fake_llm, producer_thread, r: redis.Redis, run: str, flavor: str, method: str,
        mode: str) -> None:
    """Turns in flight at an update are neither aborted nor sent again: they continue under
    the new weights, and each records the version of its oldest tokens with the spans of
    both (`version_spans`), as the server reported them."""
    server = fake_llm(flavor=flavor, latency_s=0.003)
    batcher = Batcher(r, lake_config([server.base_url], ratio=1), run=run)
    servers = ModelServers.for_batcher(batcher, method, pause_mode=mode, watch_s=None)
    producer_thread()
    batches = run_steps(batcher, servers, 1)  # the server holds version 1
    server.hold('"role":"assistant"')  # later turns: held mid-generation
    wait_for(lambda: server.stats["held"] >= 2, what="turns held in flight at version 1")
    aborted = server.stats["aborted"]
    updater = threading.Thread(target=servers.update, args=(2, "/ckpt/2"))
    updater.start()
    wait_for(lambda: server.options.weight_version == "2", what="the update under the hold")
    server.release()
    updater.join(30)
    assert server.stats["aborted"] == aborted  # nothing aborted by the update
    batches.append(batcher.get_batch(timeout_s=30))
    batcher.ack(batches[-1])
    batcher.publish_version(2)
    batches.append(batcher.get_batch(timeout_s=30))
    spanning = [step for step, _ in steps_of(batches) if "version_spans" in step]
    assert spanning, "no turn kept across the update"
    assert any(row[0] == 2 for step in spanning for row in step["version_spans"])
    for step in spanning:  # kept through the update to 2, or (the policy's default pause
        rows = step["version_spans"]  # mode: keep) through the first, from launch weights
        first = rows[0][0]
        assert step["version"] == first and step["version_source"] == "server"
        assert [row[0] for row in rows] == [first, first + 1] and rows[0][1] == 0
        assert rows[1][2] == len(step["response_ids"])


def test_a_vllm_pause_in_abort_or_wait_mode_answers_503_and_the_turns_wait(
        fake_llm) -> None:
    """New requests during vLLM's abort/wait pause are answered 503 "Generation is paused";
    keep queues them."""
    server = fake_llm(flavor="vllm")
    messages = [{"role": "user", "content": "hi"}]
    assert http(f"{server.url}/pause?mode=wait", {})[0] == 200
    status, data = http(f"{server.base_url}/chat/completions",
                        {"model": "fake-model", "messages": messages})
    assert status == 503 and data["error"]["message"] == \
        "Generation is paused. Please retry after it resumes."
    assert http(f"{server.url}/is_paused")[1] == {"is_paused": True}
    assert http(f"{server.url}/resume", {})[0] == 200
    assert http(f"{server.url}/pause?mode=keep", {})[0] == 200
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(http(
        f"{server.base_url}/chat/completions", {"model": "fake-model", "messages": messages})))
    thread.start()
    wait_for(lambda: server.in_flight == 1, what="the request queued by the pause")
    assert not results
    assert http(f"{server.url}/resume", {})[0] == 200
    thread.join(10)
    assert results[0][0] == 200
    assert http(f"{server.url}/pause?mode=nope", {})[0] == 422


def test_pause_modes_and_methods_the_servers_do_not_have_are_refused(
        r: redis.Redis, run: str, caplog: pytest.LogCaptureFixture) -> None:
    url = ["http://127.0.0.1:1/v1"]
    with pytest.raises(ConfigError, match=r"pause_mode 'keep' is not one of method 'sglang''s: "
                       r"abort, in_place, retract"):
        ModelServers(r, run, url, method="sglang", pause_mode="keep", watch_s=None)
    with pytest.raises(ConfigError, match=r"pause_mode 'retract' is not one of method "
                       r"'vllm''s: abort, wait, keep"):
        ModelServers(r, run, url, method="vllm", pause_mode="retract", watch_s=None)
    with pytest.raises(ConfigError, match="method 'vllm-lora''s: none"):
        ModelServers(r, run, url, method="vllm-lora", pause_mode="abort", watch_s=None)
    with pytest.raises(ConfigError, match="method 'trtllm' is not one of sglang, vllm, "
                       "vllm-lora"):
        ModelServers(r, run, url, method="trtllm", watch_s=None)
    caplog.set_level(logging.WARNING)
    ModelServers(r, run, url, method="vllm-lora", staleness=0, watch_s=None)
    assert "--max-loras" not in caplog.text  # sync: one adapter in flight at a time
    ModelServers(r, run, url, method="vllm-lora", staleness=1, max_loras=2, watch_s=None)
    assert "--max-loras" not in caplog.text
    ModelServers(r, run, url, method="vllm-lora", staleness=2, watch_s=None)
    assert caplog.text.count("Start vLLM with --max-loras 2") == 1


def test_vllm_without_its_rl_endpoints_is_named_with_the_flag_it_needs(fake_llm, r: redis.Redis,
                                                                      run: str) -> None:
    """vLLM 0.10.2 (or 0.33 without VLLM_SERVER_DEV_MODE=1) has no /pause: the error names
    the server and the environment variable; nothing is recorded."""
    server = fake_llm(flavor="vllm010")
    servers = ModelServers(r, run, [server.base_url], method="vllm", watch_s=None)
    with pytest.raises(ServerUpdateError, match=rf"^model server {server.base_url}: "
                       r"pause\?mode=abort failed \(HTTP 404\): .*VLLM_SERVER_DEV_MODE=1"):
        servers.update(1, "/ckpt/1")
    assert servers.holding() == {}


def test_a_failed_reload_leaves_no_server_paused(fake_llm, r: redis.Redis, run: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload that fails (a checkpoint the server cannot read) still resumes the server:
    paused, it would refuse or hold every turn until someone resumed it by hand."""
    from consumer.loaders import ServerHTTP

    server = fake_llm(flavor="vllm")
    servers = ModelServers(r, run, [server.base_url], method="vllm", pause_mode="keep",
                           watch_s=None)
    real_ok = ServerHTTP._ok

    def ok(self: ServerHTTP, base_url: str, url: str, body: dict, what: str,
           **kwargs: Any) -> None:
        if "collective_rpc" in url:
            raise ServerUpdateError(f"model server {base_url}: {what} failed (HTTP 500)")
        real_ok(self, base_url, url, body, what, **kwargs)

    monkeypatch.setattr(ServerHTTP, "_ok", ok)
    with pytest.raises(ServerUpdateError, match="collective_rpc reload_weights from /ckpt/1 "
                       "failed"):
        servers.update(1, "/ckpt/1")
    assert server.stats["pauses"] == 1
    assert http(f"{server.url}/is_paused")[1] == {"is_paused": False}
    assert servers.holding() == {}
