"""The producer's model-server pool against stand-in servers on loopback: server choice,
retries, timeouts, servers going away and coming back, 4xx, the start check, 1,000 in
flight."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import llm_helpers
import pytest
from llm_helpers import MODEL, fake_llm_factory

from producers.llm.pool import ServerPool
from schemas.errors import EpisodeFailed, PolicyError
from schemas.policy import ServerRecord

fake_llm = pytest.fixture(fake_llm_factory)

BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                   "temperature": 1.0}).encode()


def run_pool(urls: list[str], scenario: Any, **kwargs: Any) -> Any:
    return llm_helpers.run_pool(urls, scenario, **kwargs)


def test_requests_go_to_the_server_with_fewest_in_flight(fake_llm) -> None:
    a, b = fake_llm(latency_s=60), fake_llm(latency_s=60)

    async def scenario(pool: ServerPool) -> tuple[str, list[str]]:
        held = asyncio.create_task(pool.chat(BODY))  # whichever server gets it holds it
        while pool.inflight < 1:
            await asyncio.sleep(0.01)
        busy = next(s.base_url for s in pool.servers if s.inflight)
        for server in (a, b):
            if server.base_url != busy:
                server.options.latency_s = 0.0
        served = [(await pool.chat(BODY)).server.base_url for _ in range(6)]
        held.cancel()
        return busy, served

    busy, served = run_pool([a.base_url, b.base_url], scenario)
    idle = b.base_url if busy == a.base_url else a.base_url
    assert served == [idle] * 6
    assert (a if busy == a.base_url else b).stats["requests"] == 1  # only the held one


def test_5xx_is_retried_then_the_next_server_then_waits_until_one_is_back(
        fake_llm, caplog: pytest.LogCaptureFixture) -> None:
    """max_retries=2: three 503s (busy) on each server mark both down; the request waits for
    the cooldown and the first server tried answers."""
    a, b = fake_llm(), fake_llm()
    a.fail_next("503", 3)
    b.fail_next("503", 3)
    caplog.set_level(logging.INFO, logger="producers.llm.pool")
    answer = run_pool([a.base_url, b.base_url], lambda pool: pool.chat(BODY))
    assert answer.attempts == 7
    assert a.stats["fault:503"] == b.stats["fault:503"] == 3
    assert a.stats["completed"] + b.stats["completed"] == 1
    messages = [r.getMessage() for r in caplog.records]
    assert sum("all 2 model servers are down" in m for m in messages) == 1
    assert sum("is back; turns resume" in m for m in messages) == 1


def test_a_500_is_retried_on_the_same_server(fake_llm) -> None:
    a = fake_llm()
    a.fail_next("500", 2)
    answer = run_pool([a.base_url], lambda pool: pool.chat(BODY))
    assert answer.attempts == 3 and a.stats["completed"] == 1 and not answer.server.down


def test_a_hang_past_the_timeout_is_retried_on_another_server(fake_llm) -> None:
    a, b = fake_llm(), fake_llm()
    a.fail_next("hang")
    b.fail_next("hang")
    answer = run_pool([a.base_url, b.base_url], lambda pool: pool.chat(BODY), timeout_s=0.5)
    # the first server hung, the second hung, the first answered: never the same one twice
    assert answer.attempts == 3
    assert a.stats["fault:hang"] == b.stats["fault:hang"] == 1
    for server in (a, b):  # each saw its hung request closed by the client
        wait_until(lambda s=server: s.stats["cancelled"] == 1)


def test_a_hung_server_is_set_aside_so_later_turns_do_not_wait_on_it(
        fake_llm, caplog: pytest.LogCaptureFixture) -> None:
    """A SIGSTOPped server answers nothing: each turn waited out the timeout on it first
    (it had the fewest requests in flight once its own were closed) and nothing was logged.
    The first timeout sets it aside now; the others go to the live server."""
    hung, live = fake_llm(hang_rate=1.0), fake_llm()
    caplog.set_level(logging.WARNING, logger="producers.llm.pool")

    async def scenario(pool: ServerPool) -> tuple[list[str], float, dict[str, str]]:
        started = time.monotonic()
        served = [(await pool.chat(BODY)).server.base_url for _ in range(8)]
        return served, time.monotonic() - started, pool.servers_down()

    served, took, down = run_pool([hung.base_url, live.base_url], scenario, timeout_s=0.4)
    assert served == [live.base_url] * 8
    assert hung.stats["requests"] <= 2  # the first turn's try, at most one probe
    assert took < 4 * 0.4
    assert "no answer within 0.4s" in down[hung.base_url]
    assert f"model server {hung.base_url} is down (no answer within 0.4s)" in caplog.text


def test_a_request_the_servers_cannot_serve_fails_its_episode_while_others_pass(
        fake_llm) -> None:
    """A 502 for one request alone (a prompt that crashes a worker) was retried for ever and
    kept setting the servers aside for every request. Past every server's retry budget, while
    the servers answer others, it fails its episode; the others are served."""
    a, b = fake_llm(), fake_llm()
    for server in (a, b):
        server.fail_marked("POISON")
    poison = BODY.replace(b"hi", b"POISON")

    async def scenario(pool: ServerPool) -> tuple[BaseException | None, int]:
        async def others() -> int:
            done = 0
            while not bad.done():
                await pool.chat(BODY)
                done += 1
                await asyncio.sleep(0.01)
            return done

        bad = asyncio.ensure_future(pool.chat(poison))
        served = await asyncio.wait_for(others(), 30)
        return bad.exception(), served

    error, served = run_pool([a.base_url, b.base_url], scenario, max_retries=1)
    assert isinstance(error, EpisodeFailed) and "a request they cannot serve" in str(error)
    assert "HTTP 502: upstream worker crashed" in str(error)
    # (1 + 1) x 2 counted, then one more; an error counts only when its server answered
    # another request since this one's previous error there, so a few may not count
    assert 5 <= a.stats["fault:marked"] + b.stats["fault:marked"] <= 12
    assert served > 0


def test_an_outage_is_waited_out_not_failed(fake_llm) -> None:
    """Every request failing (nothing answered meanwhile, a busy or gateway status) is an
    outage, not a bad request: the request waits for the server, however many errors it
    gets."""
    a = fake_llm()
    a.fail_next("503", 4)  # past the budget of (1 + 1) x 1
    answer = run_pool([a.base_url], lambda pool: pool.chat(BODY), max_retries=1)
    assert answer.attempts == 5


def test_a_500_on_every_try_while_the_health_check_answers_fails_with_one_server(
        fake_llm) -> None:
    """llama-cpp-python answers one request 500 every time while `/v1/models` answers (a
    buffer bug): with one server, the rule "failed while the servers answer others" never
    fired, and the request was retried 35 times until the trainer's timeout. A 500 followed
    by a health check that answers counts against the request: past the retry budget the
    episode fails with the server's message; the server is not set aside for it."""
    a = fake_llm()
    a.fail_marked("POISON", status=500)
    poison = BODY.replace(b"hi", b"POISON")

    async def scenario(pool: ServerPool) -> tuple[BaseException | None, dict[str, str]]:
        try:
            await asyncio.wait_for(pool.chat(poison), 10)
        except (EpisodeFailed, asyncio.TimeoutError) as exc:
            return exc, pool.servers_down()
        return None, pool.servers_down()

    error, down = run_pool([a.base_url], scenario, max_retries=1)
    assert isinstance(error, EpisodeFailed), "retried for ever"
    assert f"model server {a.base_url}, HTTP 500: internal error" in str(error)
    assert a.stats["fault:marked"] == 3  # (1 + 1) x 1 counted, then one more
    assert down == {}  # it answers the others
    assert run_pool([a.base_url], lambda pool: pool.chat(BODY)).attempts == 1


def wait_until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_4xx_fails_at_once(fake_llm) -> None:
    a = fake_llm()
    a.fail_next("400")
    with pytest.raises(EpisodeFailed, match=r"refused the request \(HTTP 400\)"):
        run_pool([a.base_url], lambda pool: pool.chat(BODY))
    assert a.stats["requests"] == 1


def test_a_200_that_is_no_completion_fails_the_episode_naming_the_server(fake_llm) -> None:
    """`{"choices": ["x"]}` passed the check for choices and raised an AttributeError deep in
    the reply's parsing, which the producer blamed on the env and replayed."""
    a = fake_llm()
    a.fail_next("bad_shape")
    with pytest.raises(EpisodeFailed, match=f"model server {a.base_url} answered HTTP 200 "
                                            r"without a completion \(choices\[0\] holds no"):
        run_pool([a.base_url], lambda pool: pool.chat(BODY))


def test_a_dead_server_is_left_and_used_again_once_back(fake_llm) -> None:
    a, b = fake_llm(latency_s=0.02), fake_llm(latency_s=0.02)

    async def scenario(pool: ServerPool) -> None:
        await asyncio.gather(*(pool.chat(BODY) for _ in range(10)))
        assert a.stats["completed"] > 0 and b.stats["completed"] > 0
        await asyncio.to_thread(a.stop)
        answers = await asyncio.gather(*(pool.chat(BODY) for _ in range(30)))
        assert all(x.server.base_url == b.base_url for x in answers[-10:])
        assert pool.servers[0].down
        before = a.stats["completed"]
        await asyncio.to_thread(a.start)  # same port: the server is back
        deadline = time.monotonic() + 3 * pool.cooldown_max_s  # tried again within a cooldown
        while a.stats["completed"] == before and time.monotonic() < deadline:
            await pool.chat(BODY)
        assert a.stats["completed"] > before and not pool.servers[0].down

    run_pool([a.base_url, b.base_url], scenario, max_retries=1, cooldown_max_s=0.5)


def test_while_every_server_is_down_requests_wait(fake_llm,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    a = fake_llm()
    a.stop()
    caplog.set_level(logging.INFO, logger="producers.llm.pool")

    async def scenario(pool: ServerPool) -> Any:
        request = asyncio.create_task(pool.chat(BODY))
        while not pool.servers[0].down:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        assert not request.done()  # waiting, not failed
        await asyncio.to_thread(a.start)
        return await asyncio.wait_for(request, 10)

    answer = run_pool([a.base_url], scenario, max_retries=1)
    assert answer.server.base_url == a.base_url
    messages = [r.getMessage() for r in caplog.records]
    assert sum("all 1 model servers are down" in m for m in messages) == 1
    assert sum("is back; turns resume" in m for m in messages) == 1


def test_the_start_check(fake_llm) -> None:
    a, b = fake_llm(), fake_llm(model="another-model")

    with pytest.raises(PolicyError) as info:
        run_pool([b.base_url], lambda pool: pool.check_model(MODEL))
    assert str(info.value) == f"model {MODEL!r} is unknown to every server ({b.base_url})"

    async def keeps_those_with_the_model(pool: ServerPool) -> list[str]:
        await pool.check_model(MODEL)
        return [s.base_url for s in pool.servers]

    assert run_pool([a.base_url, b.base_url], keeps_those_with_the_model) == [a.base_url]

    secured = fake_llm(api_key="k")
    with pytest.raises(PolicyError, match="refused the API key"):
        run_pool([secured.base_url], lambda pool: pool.check_model(MODEL))
    run_pool([secured.base_url], lambda pool: pool.check_model(MODEL), api_key="k")


def test_a_base_url_without_v1_is_named_as_such_not_as_an_unknown_model(fake_llm) -> None:
    a = fake_llm()
    root = a.base_url.removesuffix("/v1")
    with pytest.raises(PolicyError) as info:
        run_pool([root], lambda pool: pool.check_model(MODEL))
    assert str(info.value) == (f"no model server lists its models: {root} answered 404 for "
                               f"/models; is the base URL missing its /v1? (policy.base_urls; "
                               f"model {MODEL!r})")


def test_the_start_check_waits_for_servers_that_are_down(fake_llm) -> None:
    a = fake_llm()
    a.stop()
    timer = threading.Timer(0.6, a.start)
    timer.start()
    started = time.monotonic()
    run_pool([a.base_url], lambda pool: pool.check_model(MODEL))
    assert time.monotonic() - started >= 0.5
    timer.join()


@pytest.mark.slow
def test_a_thousand_requests_in_flight_without_threads(fake_llm) -> None:
    server = fake_llm(latency_s=0.01)
    server.hold()  # every request waits in the server until released: all in flight at once

    async def scenario(pool: ServerPool) -> int:
        threads = set(threading.enumerate())
        tasks = [asyncio.create_task(pool.chat(BODY)) for _ in range(1100)]
        while server.in_flight < 1000:
            await asyncio.sleep(0.05)
            assert not any(t.done() and t.exception() for t in tasks)
        assert not set(threading.enumerate()) - threads  # none started (others may end)
        assert pool.inflight == 1024  # max_inflight: the rest wait for a slot
        server.release()
        await asyncio.gather(*tasks)
        return server.stats["completed"]

    assert run_pool([server.base_url], scenario, max_inflight=1024, timeout_s=30) == 1100
    assert server.stats["max_in_flight"] >= 1000


def test_requests_and_failures_are_counted_for_the_metrics_page(fake_llm) -> None:
    from producers.metrics import LLM

    a = fake_llm()
    a.fail_next("500", 2)
    errors_before = LLM.errors[(a.base_url, "http_5xx")]
    run_pool([a.base_url], lambda pool: pool.chat(BODY))
    assert LLM.errors[(a.base_url, "http_5xx")] - errors_before == 2
    assert LLM.latency[a.base_url].count == 1  # the answered attempt
    a.fail_next("400")
    with pytest.raises(EpisodeFailed):
        run_pool([a.base_url], lambda pool: pool.chat(BODY))
    assert LLM.errors[(a.base_url, "http_4xx")] == 1


def test_a_set_aside_server_is_tried_at_once_when_its_record_changes() -> None:
    """A server set aside for an adapter it lacked (unloaded as the record moved on), or for
    weights a restart lost, gets its next try as soon as the producer reads its new record
    (a new version, or the same loaded again), not after the cooldown."""
    pool = ServerPool(["http://127.0.0.1:9/v1"])
    server = pool.servers[0]
    server.down, server.retry_at = True, time.monotonic() + 60
    pool.set_versions({server.base_url: ServerRecord(3, "rollstream-v3")})
    assert server.retry_at <= time.monotonic()
    server.retry_at = time.monotonic() + 60
    pool.set_versions({server.base_url: ServerRecord(3, "rollstream-v3")})  # no change
    assert server.retry_at > time.monotonic() + 30
    # a restarted server loaded again with the same version: a new record, tried at once
    # (before, it waited out its cooldown, up to 5 s, after the trainer had healed it)
    pool.set_versions({server.base_url: ServerRecord(3, "rollstream-v3", loaded_at=1.0)})
    assert server.retry_at <= time.monotonic()
    server.retry_at = time.monotonic() + 60
    pool.set_versions({server.base_url: ServerRecord(3, "rollstream-v3", loaded_at=1.0)})
    assert server.retry_at > time.monotonic() + 30


@pytest.mark.parametrize("body, overflow", [
    ({"object": "error", "message": "This model's maximum context length is 4096 tokens. "
      "However, you requested 4200 tokens (4136 in the messages, 64 in the completion).",
      "type": "BadRequestError", "code": 400}, True),  # vLLM's frontend
    ({"object": "error", "message": "The decoder prompt (length 5000) is longer than the "
      "maximum model length of 4096. Make sure that `max_model_len` is no smaller than the "
      "number of text tokens.", "type": "BadRequestError", "code": 400}, True),  # vLLM engine
    ({"object": "error", "message": "The input (5000 tokens) is longer than the model's "
      "context length (4096 tokens).", "type": "BadRequestError", "code": 400}, True),  # SGLang
    ({"error": {"message": "Input tokens exceed the configured limit of 272000 tokens.",
                "type": "invalid_request_error", "code": "context_length_exceeded"}}, True),
    ({"object": "error", "message": "temperature must be non-negative",
      "type": "BadRequestError", "code": 400}, False),
])
def test_context_overflow_is_read_from_every_servers_wording(body: dict, overflow: bool):
    from producers.llm.replies import is_context_overflow

    assert is_context_overflow(400, json.dumps(body).encode()) is overflow
    assert is_context_overflow(500, json.dumps(body).encode()) is False


def test_an_outage_that_starts_while_others_finish_is_waited_out(fake_llm) -> None:
    """Every request answered 502 from a moment on, while requests sent before still finish:
    those answers made every later error of a waiting request count against it, and an 8 s
    router outage failed episodes within 0.1 s. Only answers since the request's previous
    error on that server count now."""
    a = fake_llm(latency_s=0.3)

    async def scenario(pool: ServerPool) -> Any:
        before = [asyncio.ensure_future(pool.chat(BODY)) for _ in range(4)]
        await asyncio.sleep(0.1)
        a.fail_marked(b"")  # from now on every request gets 502; the four in flight finish
        waiting = asyncio.ensure_future(pool.chat(BODY.replace(b"hi", b"later")))
        await asyncio.gather(*before)
        while a.stats["fault:marked"] < 5:  # the waiting request refused five times
            await asyncio.sleep(0.02)
        a.fail_marked(None)  # the outage is over
        return await waiting

    answer = run_pool([a.base_url], scenario, max_retries=1)
    assert answer.attempts >= 4 and a.stats["fault:marked"] >= 3


def test_a_sigstopped_server_is_checked_with_get_models_not_with_turns(fake_llm) -> None:
    """A server set aside for a timeout was tried again with a real turn every cooldown, and
    each such turn waited out the whole timeout (with `timeout_s: 300`, a sync step of 300
    s or more). It is checked with `GET /models` now: no turn waits on it while it is
    stopped, and it is used again once it answers."""
    import signal
    import subprocess
    import sys
    import urllib.request

    from helpers import ROOT, free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rollstream", "fake-llm", "--port",
                             str(port), "--model", MODEL], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stopped_url = f"http://127.0.0.1:{port}/v1"
    live = fake_llm()
    try:
        wait_until(lambda: _answers(f"{stopped_url}/models", urllib.request), timeout_s=30)

        async def scenario(pool: ServerPool) -> tuple[list[str], list[float], list[str]]:
            proc.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            served, took = [], []
            while time.monotonic() - started < 2.0:  # cooldowns of 0.25, 0.5 and 1 s pass
                turn_started = time.monotonic()
                served.append((await pool.chat(BODY)).server.base_url)
                took.append(time.monotonic() - turn_started)
            proc.send_signal(signal.SIGCONT)
            later = []
            deadline = time.monotonic() + 20
            while stopped_url not in later and time.monotonic() < deadline:
                later.append((await pool.chat(BODY)).server.base_url)
                await asyncio.sleep(0.05)
            return served, took, later

        served, took, later = run_pool([stopped_url, live.base_url], scenario, timeout_s=0.5)
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(10)
    # one turn paid the timeout (the one that found it hung); no other turn waited on it
    assert served.count(stopped_url) == 0 and len(served) > 10
    assert len([t for t in took if t >= 0.45]) == 1, took
    assert live.stats["requests"] >= len(served)
    assert stopped_url in later  # back in use once it answered GET /models


def _answers(url: str, request: Any) -> bool:
    try:
        with request.urlopen(url, timeout=1) as reply:
            return reply.status == 200
    except OSError:
        return False


def test_a_set_aside_server_names_what_it_lacks_now_not_when_it_was_set_aside(
        fake_llm) -> None:
    """A restarted SGLang server answers with its launch weights ('default'). It was set
    aside while the producer still had version 1 on record; version 2's record came while it
    was aside, and its retry failed the same way: `status` kept saying 'where version 1 was
    loaded' (the reason of the first failure) though the server had lost version 2."""
    server = fake_llm(flavor="sglang")  # weight_version 'default': launch weights
    url = server.base_url

    async def scenario(pool: ServerPool) -> tuple[str, str]:
        pool.set_versions({url: ServerRecord(1, reports=True)})
        turn = asyncio.ensure_future(pool.chat(BODY))
        while not pool.servers_down():
            await asyncio.sleep(0.01)
        first = pool.servers_down()[url]
        retried = server.stats["requests"]
        pool.set_versions({url: ServerRecord(2, reports=True)})  # tried again at once
        while server.stats["requests"] == retried or pool.servers[0].probing:
            await asyncio.sleep(0.01)
        now = pool.servers_down()[url]
        turn.cancel()
        return first, now

    first, now = run_pool([url], scenario)
    assert "weight_version 'default' where version 1 was loaded" in first
    assert "weight_version 'default' where version 2 was loaded" in now
