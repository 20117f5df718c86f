"""The producer's client against every server flavor the stand-in reproduces (vLLM 0.33 and
0.10.2, SGLang 0.5.23 and 0.4.10, llama-server, llama-cpp-python, transformers serve as
`strict`): what each turn carries, what is said once per server, the request fitted to each
server, context limits in every wording, SGLang's model rename, unresolvable hosts."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
from typing import Any

import pytest
import redis
from helpers import ROOT, clean_env
from llm_helpers import MODEL, fake_llm_factory, llm_config

from consumer import Batcher
from producers.llm.chat import request_body, turn_from_answer
from producers.llm.pool import ServerPool
from schemas.errors import ContextFull, PolicyError
from schemas.policy import ServerRecord

fake_llm = pytest.fixture(fake_llm_factory)

FLAVORS = ("vllm", "vllm010", "sglang", "sglang04", "llamacpp", "llama-cpp-python", "strict")
# flavor -> (prompt ids, response ids, logprobs) its answers carry
CARRIES = {
    "vllm": (True, True, True), "vllm010": (True, True, True), "sglang": (True, True, True),
    "sglang04": (False, False, True), "llamacpp": (False, True, True),
    "llama-cpp-python": (False, False, True), "strict": (False, False, False),
}
# flavor -> how its context window is named in a message
SETTING = {
    "vllm": "--max-model-len (max_model_len)", "vllm010": "--max-model-len (max_model_len)",
    "sglang": "--context-length (max_model_len)", "sglang04": "--context-length (max_model_len)",
    "llamacpp": "-c / --ctx-size (n_ctx)", "llama-cpp-python": "--n_ctx (n_ctx)",
}


def body(content: str = "Play FrozenLake.", max_tokens: int = 64, **extra: Any) -> dict:
    return request_body(MODEL, [{"role": "user", "content": content}],
                        sampling={"temperature": 1.0, "top_p": 1.0,
                                  "max_tokens": max_tokens},
                        seed=7, extra_body=extra)


def started(urls: list[str], scenario: Any, *, records: dict | None = None,
            **kwargs: Any) -> Any:
    """`await scenario(pool)` with a pool that has checked the model (and so knows its
    servers)."""
    kwargs.setdefault("timeout_s", 5.0)
    kwargs.setdefault("max_retries", 1)

    async def main() -> Any:
        pool = ServerPool(urls, model=MODEL, **kwargs)
        await pool.start()
        try:
            await pool.check_model(MODEL, records)
            return await scenario(pool)
        finally:
            await pool.close()

    return asyncio.run(main())


@pytest.mark.parametrize("flavor", FLAVORS)
def test_each_servers_turns_carry_what_it_gives_and_what_it_lacks_is_said_once(
        fake_llm, flavor: str, caplog: pytest.LogCaptureFixture) -> None:
    server = fake_llm(flavor=flavor)
    caplog.set_level(logging.WARNING)

    async def scenario(pool: ServerPool) -> list[Any]:
        return [turn_from_answer((await pool.chat(body(f"turn {i}"))).data) for i in range(3)]

    turns = started([server.base_url], scenario)
    prompt, response, logprobs = CARRIES[flavor]
    for turn in turns:
        assert turn.text and turn.finish_reason == "stop"
        assert (turn.prompt_ids is not None) is prompt, flavor
        assert (turn.response_ids is not None) is response, flavor
        assert (turn.logprobs is not None) is logprobs, flavor
        if response and logprobs:
            assert len(turn.response_ids) == len(turn.logprobs) > 0
    said = [r.getMessage() for r in caplog.records]
    no_ids = [m for m in said if "no token ids" in m]  # (strict: said as it is dropped)
    assert len(no_ids) == (0 if response else 1), said
    if not response:
        assert server.base_url in no_ids[0]
    no_logprobs = [m for m in said if "returns no logprobs" in m]
    assert len(no_logprobs) == (0 if logprobs else 1), said


def test_a_strict_server_gets_its_refused_field_dropped_once(
        fake_llm, caplog: pytest.LogCaptureFixture) -> None:
    """transformers serve answers 422 "Unexpected fields in the request:
    {'return_token_ids'}" to every request that carries it: every episode failed, and
    `extra_body` cannot take the field out. It is dropped for that server (one warning naming
    server and field) and the request sent again."""
    server = fake_llm(flavor="strict")
    caplog.set_level(logging.WARNING)

    async def scenario(pool: ServerPool) -> list[int]:
        return [(await pool.chat(body(f"turn {i}"))).attempts for i in range(3)]

    assert started([server.base_url], scenario) == [1, 1, 1]  # not a retry: sent again
    assert server.stats["refused"] == 1 and server.stats["completed"] == 3
    assert [("return_token_ids" in b) for b in server.requests] == [True, False, False, False]
    dropped = [r.getMessage() for r in caplog.records if "refused 'return_token_ids'" in
               r.getMessage()]
    assert len(dropped) == 1
    assert dropped[0].startswith(f"model server {server.base_url} (OpenAI-compatible server) "
                                 "refused 'return_token_ids' (HTTP 422: Unexpected fields")
    assert "carry no token ids" in dropped[0]


def test_a_sampling_field_a_server_refuses_is_not_dropped(fake_llm) -> None:
    """top_k changes what is sampled: dropping it would make the logprobs lie."""
    from schemas.errors import EpisodeFailed

    server = fake_llm(flavor="strict")

    async def scenario(pool: ServerPool) -> Any:
        return await pool.chat({**body(), "top_k": 20})

    with pytest.raises(EpisodeFailed, match=r"refused the request \(HTTP 422\): Unexpected "
                       r"fields in the request: .*top_k"):
        started([server.base_url], scenario)


@pytest.mark.parametrize("flavor, asked", [
    ("vllm", {"return_weight_versions": True}), ("llamacpp", {"top_logprobs": 1}),
    ("llama-cpp-python", {"top_logprobs": 1}), ("sglang", {}),
])
def test_the_request_is_fitted_to_the_server(fake_llm, flavor: str, asked: dict) -> None:
    """llama-server sends 20 top logprobs unless told (1 here), llama-cpp-python none
    without a top_logprobs; vLLM is asked for its per-token weight versions."""
    server = fake_llm(flavor=flavor)
    started([server.base_url], lambda pool: pool.chat(body()))
    sent = server.requests[-1]
    for key in ("top_logprobs", "return_weight_versions"):
        assert sent.get(key) == asked.get(key), (flavor, key)
    assert sent["logprobs"] is True and sent["return_token_ids"] is True


def test_an_older_vllm_is_not_asked_for_weight_versions_again(fake_llm) -> None:
    """vLLM 0.10.2 has no `return_weight_versions` and logs a warning for every request
    that carries it: its answers lack `weight_versions`, so it is asked once."""
    server = fake_llm(flavor="vllm010")

    async def scenario(pool: ServerPool) -> None:
        for i in range(3):
            await pool.chat(body(f"turn {i}"))

    started([server.base_url], scenario)
    assert ["return_weight_versions" in b for b in server.requests] == [True, False, False]


def test_an_unknown_server_answering_no_logprobs_is_asked_with_top_logprobs(
        fake_llm, caplog: pytest.LogCaptureFixture) -> None:
    """A llama-cpp-python behind a router that rewrites its model cards is not recognised:
    its `logprobs: null` makes the pool ask with `top_logprobs: 1`, and the logprobs come."""
    server = fake_llm(flavor="llama-cpp-python")
    caplog.set_level(logging.WARNING)

    async def scenario(pool: ServerPool) -> list[Any]:
        pool.servers[0].adds.clear()  # as if it were not recognised
        return [turn_from_answer((await pool.chat(body(f"turn {i}"))).data) for i in range(3)]

    turns = started([server.base_url], scenario)
    assert turns[0].logprobs is None and turns[1].logprobs is not None
    assert [b.get("top_logprobs") for b in server.requests] == [None, 1, 1]
    assert "returns no logprobs" not in caplog.text


PROMPT = "Up Down Left Right " * 20


@pytest.mark.parametrize("flavor, room, max_tokens, wording", [
    # room: the window minus the prompt's tokens
    ("vllm", -10, 64, "your prompt contains"),
    ("vllm", 0, 4, "max_tokens must be at least 1, got 0"),  # the prompt fills the window
    ("vllm010", 0, 64, "your request has"),
    ("vllm010", 10, 64, "'max_tokens' or 'max_completion_tokens' is too large"),
    ("sglang", 0, 64, "is longer than the model's context length"),
    ("sglang", 10, 64, "Requested token count exceeds the model's maximum context length"),
    ("sglang", 2, 2, "exceeds the maximum allowed length"),  # the scheduler's check
    ("sglang04", 0, 64, "is longer than the model's context length"),
    ("llamacpp", 0, 64, "exceeds the available context size"),
    ("llama-cpp-python", 0, 64, "However, you requested"),
    ("llama-cpp-python", 100, 300, "llama_decode returned 1"),  # runs into the end: a 500
])
def test_every_context_wording_ends_the_episode_naming_the_servers_setting(
        fake_llm, flavor: str, room: int, max_tokens: int, wording: str) -> None:
    """SGLang's scheduler wording failed the episode instead of ending it truncated, and the
    message named vLLM's max_model_len to a llama.cpp user."""
    from rollstream.fake_llm import render_prompt

    prompt = len(render_prompt([{"role": "user", "content": PROMPT}]))
    server = fake_llm(flavor=flavor, max_model_len=prompt + room)

    async def scenario(pool: ServerPool) -> Any:
        return await pool.chat(body(PROMPT, max_tokens=max_tokens))

    with pytest.raises(ContextFull) as info:
        started([server.base_url], scenario)
    message = str(info.value)
    assert wording in message, message
    assert f"[its window: {SETTING[flavor]}" in message
    assert server.stats["completed"] == 0


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
def test_a_turn_the_server_cut_to_fit_its_context_ends_the_episode(fake_llm, flavor) -> None:
    """vLLM 0.33 shortens max_tokens to what fits and llama-server stops at the end of the
    context, both with `finish_reason: length` and nothing else said: the truncated reply was
    kept and format-penalised, and only the next turn's refusal ended the episode."""
    server = fake_llm(flavor=flavor, max_model_len=64, think_words=60)

    async def scenario(pool: ServerPool) -> Any:
        fits = turn_from_answer((await pool.chat(body("hi", max_tokens=8))).data)
        assert fits.finish_reason == "length"  # max_tokens itself: not the context
        return await pool.chat(body("hi", max_tokens=60))  # the window has ~50 left

    with pytest.raises(ContextFull, match=r"cut the turn to fit its context window: \d+ prompt "
                       r"\+ \d+ generated tokens reach its limit of 64 \(60 asked\)"):
        started([server.base_url], scenario)


def test_sglang_serves_the_checkpoint_path_after_an_update_and_a_producer_still_starts(
        fake_llm) -> None:
    """After `/update_weights_from_disk`, SGLang's `/v1/models` lists only the new model
    path: a producer started afterwards exited 1 ("unknown to every server"). The
    checkpoint the trainer recorded for the server counts as the model; chat keeps working."""
    from llm_helpers import http

    server = fake_llm(flavor="sglang")
    assert http(f"{server.url}/update_weights_from_disk",
                {"model_path": "/ckpt/1", "weight_version": "1"})[0] == 200
    with pytest.raises(PolicyError, match="unknown to every server"):
        started([server.base_url], lambda pool: pool.chat(body()))
    records = {server.base_url: ServerRecord(1, checkpoint="/ckpt/1", reports=True)}
    answer = started([server.base_url], lambda pool: pool.chat(body()), records=records)
    assert answer.data["model"] == MODEL
    assert turn_from_answer(answer.data).version == 1


def test_an_unresolvable_host_fails_the_start_after_the_wait(fake_llm) -> None:
    """`http://vllm:8000/v1` outside compose: one warning, then a wait for ever."""
    url = "http://rollstream-no-such-host.invalid:8000/v1"
    with pytest.raises(PolicyError, match=r"^model server host names do not resolve after "
                       rf"0\.3s: {re.escape(url)} \(host name does not resolve"):
        started([url], lambda pool: pool.chat(body()), resolve_wait_s=0.3)
    # a host that resolves but does not answer yet is waited for (servers load for minutes)
    from helpers import free_port

    async def bounded() -> None:
        pool = ServerPool([f"http://127.0.0.1:{free_port()}/v1"], resolve_wait_s=0.3)
        await pool.start()
        try:
            await asyncio.wait_for(pool.check_model(MODEL), 1.5)
        finally:
            await pool.close()

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(bounded())


@pytest.mark.slow
def test_a_producer_whose_servers_do_not_resolve_exits_1_in_one_line(
        r: redis.Redis, run: str, redis_url: str) -> None:
    config = llm_config(["http://rollstream-no-such-host.invalid:8000/v1"],
                        policy={"resolve_timeout_s": 1.0})
    Batcher(r, config, run=run)
    proc = subprocess.run(
        [sys.executable, "-m", "rollstream", "--log-level", "WARNING", "produce",
         "--redis-url", redis_url, "--run", run], cwd=ROOT, env=clean_env(),
        capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if "ERROR" in line or "error:" in line]
    assert len(errors) == 1 and "host names do not resolve after 1s" in errors[0], out
