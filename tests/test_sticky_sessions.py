"""Sticky sessions (producers/llm/routing.py) against stand-in servers on loopback: an
episode's turns and its group's members on one server, a server taken down moving only its
sessions (and them coming back), the load bound spilling, the session header, the counters;
and the stand-in's prefix cache."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import llm_helpers
import pytest
from aiohttp import web
from llm_helpers import MODEL, fake_llm_factory, http

from producers.llm import routing
from producers.llm.pool import ServerPool
from producers.metrics import LLM, ProducerStats
from rollstream.fake_llm import FakeLLMOptions, FakeLLMServer
from rollstream.fake_llm.prefix_cache import PrefixCache
from rollstream.status.render import _producer_tail
from rollstream.status.snapshot import _producer_figures

fake_llm = pytest.fixture(fake_llm_factory)


def body(text: str = "hi") -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "temperature": 1.0}


def run_pool(urls: list[str], scenario: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("max_retries", 1)
    kwargs.setdefault("cooldown_max_s", 0.2)
    return llm_helpers.run_pool(urls, scenario, **kwargs)


SESSIONS = [routing.session_key("train", g, k) for g in range(12) for k in range(2)]


def preferred(key: str, urls: list[str]) -> str:
    return max(urls, key=lambda url: routing.score(key, url))


def test_an_episodes_turns_and_its_groups_members_go_to_one_server(fake_llm) -> None:
    servers = [fake_llm() for _ in range(4)]
    urls = [s.base_url for s in servers]
    before = LLM.sessions["preferred"]

    async def scenario(pool: ServerPool) -> dict[str, set[str]]:
        where: dict[str, set[str]] = {key: set() for key in SESSIONS}
        for turn in range(3):
            for key in SESSIONS:
                for member in range(4):  # a group's members share the session
                    answer = await pool.chat(body(f"{key} {member} {turn}"), session=key)
                    where[key].add(answer.server.base_url)
        return where

    where = run_pool(urls, scenario)
    assert all(len(used) == 1 for used in where.values()), where
    assert {key: used.pop() for key, used in where.items()} == {
        key: preferred(key, urls) for key in SESSIONS}
    assert len({preferred(key, urls) for key in SESSIONS}) == 4  # sessions spread over all
    assert LLM.sessions["preferred"] - before == len(SESSIONS) * 3 * 4


def test_a_server_taken_down_moves_only_its_sessions_and_they_come_back(fake_llm) -> None:
    servers = [fake_llm() for _ in range(4)]
    urls = [s.base_url for s in servers]
    gone = servers[0]
    port = gone.port

    async def scenario(pool: ServerPool) -> tuple[dict, dict, dict]:
        async def round_() -> dict[str, str]:
            return {key: (await pool.chat(body(key), session=key)).server.base_url
                    for key in SESSIONS}

        first = await round_()
        await asyncio.to_thread(gone.stop)
        during = await round_()
        back = await asyncio.to_thread(
            FakeLLMServer(FakeLLMOptions(), port=port).start)
        try:
            for _ in range(200):  # until a request has probed it and found it up
                await pool.chat(body("probe"), session="probe")
                if not pool.servers[0].down:
                    break
                await asyncio.sleep(0.02)
            after = await round_()
        finally:
            await asyncio.to_thread(back.stop)
        return first, during, after

    first, during, after = run_pool(urls, scenario)
    assert first == {key: preferred(key, urls) for key in SESSIONS}
    moved = {key for key in SESSIONS if first[key] == gone.base_url}
    assert moved and len(moved) < len(SESSIONS)
    for key in SESSIONS:
        if key in moved:  # to its own next server
            assert during[key] == preferred(key, [u for u in urls if u != gone.base_url])
        else:
            assert during[key] == first[key]
    assert after == first  # back on their own server


def test_the_load_bound_spills_a_session_to_its_next_server(fake_llm) -> None:
    servers = [fake_llm() for _ in range(4)]
    urls = [s.base_url for s in servers]
    key = SESSIONS[0]
    order = sorted(urls, key=lambda url: routing.score(key, url), reverse=True)

    def held_on(load_factor: float) -> dict[str, int]:
        for server in servers:
            server.hold(b"held")

        async def scenario(pool: ServerPool) -> dict[str, int]:
            tasks = [asyncio.create_task(pool.chat(body(f"held {i}"), session=key))
                     for i in range(4)]
            while pool.inflight < 4:
                await asyncio.sleep(0.01)
            counts = {s.base_url: s.inflight for s in pool.servers}
            for server in servers:
                server.release()
            await asyncio.gather(*tasks)
            return counts

        return run_pool(urls, scenario, load_factor=load_factor)

    before = LLM.sessions["overloaded"]
    spread = held_on(1.25)
    # bounds ceil(1.25 * n / 4) for n = 1..4 in flight: 1, 1, 1, 2: the 2nd and 3rd spill to
    # the session's 2nd and 3rd servers, the 4th fits on its own again
    assert [spread[url] for url in order] == [2, 1, 1, 0]
    assert LLM.sessions["overloaded"] - before == 2
    assert held_on(100.0) == {order[0]: 4, order[1]: 0, order[2]: 0, order[3]: 0}


def test_the_bound_is_ceil_of_the_factor_times_the_mean() -> None:
    class S:
        def __init__(self, url: str, inflight: int) -> None:
            self.base_url, self.inflight = url, inflight

    servers = [S("a", 4), S("b", 0), S("c", 0), S("d", 0)]
    assert routing.bound(servers, 1.25) == 2  # ceil(1.25 * 5 / 4)
    key = next(k for k in SESSIONS if routing.ranked(k, servers)[0].base_url == "a")
    chosen, how = routing.route(key, servers, servers)
    assert chosen is routing.ranked(key, servers)[1] and how == routing.OVERLOADED
    for server in servers:
        server.inflight = 1  # 2 after this one, within ceil(1.25 * 5 / 4) = 2
    assert routing.route(key, servers, servers) == (servers[0], routing.PREFERRED)


async def _recording_server(seen: list[dict[str, str]]) -> tuple[web.AppRunner, str]:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def chat(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant",
                                                           "content": "ok"}}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("header", ["X-Session-ID", "X-Route-Key", None])
def test_every_request_names_its_session_in_the_configured_header(header) -> None:
    seen: list[dict[str, str]] = []

    async def main() -> None:
        runner, url = await _recording_server(seen)
        pool = ServerPool([url], session_header=header)
        await pool.start()
        try:
            await pool.chat(body(), session="train:3:7")
            await pool.chat(body())
        finally:
            await pool.close()
            await runner.cleanup()

    asyncio.run(main())
    names = [{k.lower(): v for k, v in headers.items()} for headers in seen]
    if header is None:
        assert all("x-session-id" not in h for h in names)
    else:
        assert names[0].get(header.lower()) == "train:3:7"
        assert header.lower() not in names[1]  # no session, no header


def test_session_counters_reach_metrics_and_status() -> None:
    LLM.session(routing.PREFERRED)
    stats = ProducerStats("p1")
    text = "".join(str(f) for f in stats.families())
    assert "rollstream_llm_session_requests" in text
    figures = _producer_figures(stats.record())
    total = sum(LLM.sessions.values())
    assert figures["sessions"] == dict(LLM.sessions)
    assert figures["session_affinity"] == round(LLM.sessions["preferred"] / total, 4)
    figures.update({"traj_per_s": 0.0, "rss_mb": 1.0, "cpu_percent": 0.0})
    assert "% on their server" in _producer_tail(figures)


def test_the_stand_in_reports_cached_prompt_tokens_per_server(fake_llm) -> None:
    a = fake_llm(prefix_cache_tokens=4096)
    b = fake_llm(prefix_cache_tokens=4096)
    long = body("word " * 200)
    _, first = http(f"{a.base_url}/chat/completions", long)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    turn = long["messages"] + [first["choices"][0]["message"],
                               {"role": "user", "content": "next"}]
    nxt = {**long, "messages": [{"role": m["role"], "content": m["content"]} for m in turn]}
    _, again = http(f"{a.base_url}/chat/completions", nxt)
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"] - routing_block()
    _, elsewhere = http(f"{b.base_url}/chat/completions", nxt)
    assert elsewhere["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    plain = FakeLLMServer(FakeLLMOptions()).flavor  # off: usage as the flavor has it
    assert plain.name == "vllm"


def routing_block() -> int:
    from rollstream.fake_llm.prefix_cache import BLOCK_TOKENS
    return BLOCK_TOKENS


def test_the_prefix_cache_is_an_lru_of_prefix_blocks_and_prices_the_rest() -> None:
    cache = PrefixCache(capacity_tokens=64, prefill_s_per_token=0.001, block_tokens=16)
    one = [f"a{i}" for i in range(40)]  # 2 full blocks
    assert cache.lookup(one) == 0
    assert cache.prefill_s(one, 0) == pytest.approx(0.040)
    cache.store(one)
    assert cache.lookup(one + ["x"] * 10) == 32
    assert cache.prefill_s(one + ["x"] * 10, 32) == pytest.approx(0.018)
    assert cache.lookup(["b"] + one) == 0  # a prefix, not any substring
    cache.store([f"c{i}" for i in range(48)])  # 3 more blocks: capacity 4, oldest out
    assert cache.lookup(one) == 0
    assert json.dumps(cache.cached_tokens) == "32"


def test_the_policy_sends_a_groups_members_and_turns_to_one_server(fake_llm) -> None:
    """The openai policy's session: `mode:group:episode`, the member left out, so a group's
    members (same first prompt) and every turn of theirs share a server."""
    from llm_helpers import lake_config

    from producers.envs import build_env
    from producers.policies import StepContext, make_policy

    servers = [fake_llm() for _ in range(4)]
    urls = [s.base_url for s in servers]
    config = lake_config(urls)
    groups = range(8)

    async def main() -> dict[int, set[str]]:
        policy = make_policy(config.policy)
        await policy.start()
        used: dict[int, set[str]] = {g: set() for g in groups}
        try:
            for g in groups:
                for member in range(4):
                    env = build_env(config, "Lake")
                    obs, _ = env.reset(seed=g)
                    ctx = StepContext(env=env, seed=g, version=0, mode="train", group_id=g,
                                      episode_id=0, member=member, tag="Lake")
                    for turn in range(2):
                        ctx.turn = turn
                        _, answer = await policy.act(obs, ctx)
                        used[g].add(answer.server)
        finally:
            await policy.close()
        return used

    used = asyncio.run(main())
    assert all(len(where) == 1 for where in used.values()), used
    assert {g: where.pop() for g, where in used.items()} == {
        g: preferred(routing.session_key("train", g, 0), urls) for g in groups}


def test_bad_sticky_settings_are_refused_in_one_line() -> None:
    import subprocess
    import sys

    from pydantic import ValidationError

    from schemas.policy import OpenAIPolicyConfig

    done = subprocess.run([sys.executable, "-m", "rollstream", "fake-llm",
                           "--prefix-cache-tokens", "-5"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "rollstream: error: --prefix-cache-tokens must be non-negative, got -5"]
    block = {"type": "openai", "base_urls": ["http://h:1/v1"], "model": MODEL}
    for bad in ({"session_load_factor": 0.5}, {"routing": "random"},
                {"session_header": "X Session"}):
        with pytest.raises(ValidationError):
            OpenAIPolicyConfig.model_validate({**block, **bad})
    assert OpenAIPolicyConfig.model_validate(block).session_header == "X-Session-ID"
