"""`rollstream ui` without a browser: its JSON API on a real server on loopback, against a
live run on the real Redis; what it never does (write, read a trajectory stream, show a
secret), proven with a Redis ACL user that may do nothing else; its command line."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from helpers import ROOT, clean_env, free_port, run_cli_here, small_config, wait_for
from llm_helpers import MODEL, fake_llm_factory

from consumer import Batcher
from rollstream.ui.feed import SampleFeed
from rollstream.ui.redact import config_summary, mask_text, redact
from rollstream.ui.server import UiServer, bind
from rollstream.ui.view import RunView
from schemas.codec import ENTRY_FIELD
from schemas.keys import Keys
from schemas.samples import encode_sample, sample_of

fake_llm = pytest.fixture(fake_llm_factory)
API_KEY_ENV = "ROLLSTREAM_UI_TEST_API_KEY"
API_KEY = "sk-ui-test-" + uuid.uuid4().hex
PASSWORD = "pw-" + uuid.uuid4().hex


def get(url: str, *, headers: dict[str, str] | None = None,
        method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> Any:
    status, body = get(url)
    assert status == 200, (url, status, body[:300])
    return json.loads(body)


# -- a live run, read through a user that may only read what the page needs ----------------------
@pytest.fixture
def ui_user(r: redis.Redis, run: str, redis_url: str) -> Iterator[str]:
    """A Redis ACL user with a password that may read the run's keys but not the entries of
    its trajectory streams (only the sample stream's: ACL selectors, Redis 7; on an older
    server it may read every key of the run), and write nothing: its URL."""
    user = f"ui-{run}"
    prefix = Keys(run).prefix
    rules = ["reset", "on", f">{PASSWORD}", "-@all", "+@read", "+@connection", "+info",
             "+time"]
    if int(r.info("server")["redis_version"].split(".")[0]) >= 7:
        rules += ["-xrange", "-xrevrange", "-xread", "-xreadgroup", f"%R~{prefix}:*",
                  f"(+xrange %R~{prefix}:samples)"]
    else:
        rules += [f"~{prefix}:*"]
    r.execute_command("ACL", "SETUSER", user, *rules)
    scheme, rest = redis_url.split("://", 1)
    yield f"{scheme}://{user}:{PASSWORD}@{rest.split('@')[-1]}"
    r.execute_command("ACL", "DELUSER", user)


def start_ui(url: str, run: str, *extra: str, env: dict[str, str] | None = None
             ) -> tuple[subprocess.Popen, str]:
    """`rollstream ui --port 0` (the Redis URL from the environment, never argv): the process
    and the page's URL it printed."""
    env = {**clean_env(), "ROLLSTREAM_REDIS_URL": url, "ROLLSTREAM_RUN": run, **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "rollstream", "ui", "--port", "0",
                             "--interval-s", "0.3", *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("rollstream ui: http://"):
        proc.kill()
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"rollstream ui did not start: {line}{out}{err}")
    return proc, line.split()[2]


@pytest.fixture
def ui_process() -> Iterator[Callable[..., tuple[subprocess.Popen, str]]]:
    started: list[subprocess.Popen] = []

    def start(*args: Any, **kwargs: Any) -> tuple[subprocess.Popen, str]:
        proc, url = start_ui(*args, **kwargs)
        started.append(proc)
        return proc, url

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


def llm_run_config(base_url: str, **overrides: Any):
    return small_config(
        sample_rate=1.0, async_generation_ratio=1,
        policy={"type": "openai", "base_urls": [base_url], "model": MODEL, "max_tokens": 64,
                "timeout_s": 5.0, "max_retries": 2, "api_key_env": API_KEY_ENV},
        **overrides)


@pytest.mark.slow
def test_the_api_shows_a_live_llm_run_read_only_and_without_its_secrets(
        r: redis.Redis, run: str, ui_user: str, fake_llm, producer_thread, ui_process,
        monkeypatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, API_KEY)
    server = fake_llm(api_key=API_KEY, p_good=0.5, malformed_share=1.0, latency_s=0.002)
    config = llm_run_config(server.base_url)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    # the API key is in the ui's environment too: it must still never come out
    proc, page = ui_process(ui_user, run, env={API_KEY_ENV: API_KEY})

    def a_whole_group() -> dict[str, Any] | None:
        groups = get_json(page + "api/groups?mode=train")["groups"]
        return next((g for g in groups if len(g["members"]) == g["expected"] == 4), None)

    group = wait_for(a_whole_group, timeout_s=60, what="a sampled group with its 4 members")
    assert group["tag"] == "FrozenLake" and group["mode"] == "train"
    uid = group["members"][0]["uid"]
    traj = get_json(page + f"api/trajectory/{uid}")
    assert traj["traj_id"] == group["members"][0]["traj_id"] and traj["steps"]
    step = traj["steps"][0]
    assert step["response"] and step["server"] == server.base_url
    assert step["latency_s"] > 0 and step["finish_reason"] == "stop"
    assert step["prompt_tokens"] > 0 and "prompt_ids" not in step
    assert "\n" in step["observation"]  # the grid, as the model saw it

    # the batcher drains the trajectory streams meanwhile: the page reads only the samples
    batch = batcher.get_batch(timeout_s=30)
    batcher.ack(batch)
    batcher.publish_version()

    def batcher_seen() -> dict[str, Any] | None:
        state = get_json(page + "api/state")
        seen = state["snapshot"].get("batchers") and state["refreshes"] > 3
        return state if seen or state["error"] else None

    state = wait_for(batcher_seen, what="the batcher in the ui's snapshot")
    assert state["error"] is None, state["error"]  # every read was allowed by the ACL user
    assert state["run"] == run and state["snapshot"]["live_producers"] == 1
    assert state["redis"].startswith(f"redis://ui-{run}:***@")
    assert state["config"]["policy"] == {"type": "openai", "model": MODEL,
                                         "base_urls": [server.base_url]}
    assert state["samples"]["received"] >= 4 and state["samples"]["tags"] == ["FrozenLake"]
    assert state["history"]["throughput"] and state["history"]["version"]

    bodies = [get(page + path)[1] for path in (
        "", "static/app.js", "static/style.css", "api/state", f"api/trajectory/{uid}",
        "api/trajectory/nothing-here", "api/groups?outcome=bogus",
        *[f"api/groups?outcome={o}" for o in ("all", "success", "failed", "stale")])]
    for body in bodies:
        assert PASSWORD.encode() not in body and API_KEY.encode() not in body
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert PASSWORD not in out + err and API_KEY not in out + err


# -- the API over a sample stream written here ----------------------------------------------------
def trajectory(mode: str, group: int, k: int, member: int, *, success: bool, version: int = 0,
               context_full: bool = False, round_: int = 0) -> dict[str, Any]:
    traj = {"schema": 1, "traj_id": f"{mode}-{group}-{k}-{member}",
            "traj_group_id": f"{mode}-{group}-{k}", "mode": mode, "round": round_,
            "group_id": group, "episode_id": k, "member": member, "env_id": group * 2 + member,
            "tag": "Lake" if group % 2 == 0 else "Box", "seed": 2**63 - 5,
            "version_start": version, "version_end": version,
            "episode_score": 1.0 if success else 0.0, "success": success, "terminated": True,
            "truncated": context_full, "num_actions": 1, "producer": "p",
            "steps": [{"observation": [[1, 2], [3, 4]], "action": 0, "reward": 0.0,
                       "version": version, "info": {"action_is_valid": True},
                       "response": "Bearer sk-leaked-123 at http://u:pw-leak@h:1/v1"}]}
    if context_full:
        traj["context_full"] = "the prompt outgrew the window"
    return traj


def add_samples(r: redis.Redis, keys: Keys, trajs: list[dict[str, Any]], run_version: int = 1):
    for traj in trajs:
        r.xadd(keys.samples, {ENTRY_FIELD: encode_sample(sample_of(traj,
                                                                   run_version=run_version))})


@pytest.fixture
def served(r: redis.Redis, run: str, redis_url: str) -> Iterator[Callable[..., str]]:
    """`serve(keep=...)`: a UiServer over this run on a thread: its URL."""
    servers: list[tuple[UiServer, threading.Thread]] = []

    def serve(keep: int = 1000, host: str = "127.0.0.1", url: str = redis_url) -> str:
        config = small_config(val_env_manager={"num_env_groups": 2, "group_size": 1})
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        view = RunView(client, Keys(run), config, redis_url, keep=keep)
        server = UiServer(view, bind(host, 0), interval_s=0.1, handle_signals=False)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        wait_for(lambda: view.refreshes > 0, what="the first refresh")
        return server.url

    yield serve
    for server, thread in servers:
        server.request_stop()
        thread.join(10)
        server.view.client.close()


def test_groups_filter_by_tag_mode_and_outcome_newest_first(r: redis.Redis, run: str,
                                                            served) -> None:
    keys = Keys(run)
    add_samples(r, keys, [trajectory("train", 0, 0, m, success=m == 0) for m in range(4)])
    add_samples(r, keys, [trajectory("train", 1, 0, m, success=False, version=1)
                          for m in range(4)])
    add_samples(r, keys, [trajectory("train", 2, 0, m, success=False, version=0,
                                     context_full=m == 1) for m in range(2)])
    add_samples(r, keys, [trajectory("val", 0, 0, 0, success=True, round_=r_, version=1)
                          for r_ in (1, 2)])
    page = served()
    wait_for(lambda: get_json(page + "api/state")["samples"]["received"] == 12,
             what="every sample read")

    def keys_of(query: str) -> list[str]:
        return [g["key"] for g in get_json(page + "api/groups?" + query)["groups"]]

    assert keys_of("") == ["val-0-0.r2", "val-0-0.r1", "train-2-0", "train-1-0", "train-0-0"]
    assert keys_of("mode=train&tag=Lake") == ["train-2-0", "train-0-0"]
    assert keys_of("outcome=success&mode=train") == ["train-0-0"]
    assert keys_of("outcome=failed") == ["train-2-0", "train-1-0", "train-0-0"]
    assert keys_of("outcome=context_full") == ["train-2-0"]
    assert keys_of("outcome=stale&mode=train") == ["train-2-0", "train-0-0"]  # v0, run v1
    assert keys_of("limit=2") == ["val-0-0.r2", "val-0-0.r1"]
    groups = {g["key"]: g for g in get_json(page + "api/groups")["groups"]}
    assert [m["member"] for m in groups["train-0-0"]["members"]] == [0, 1, 2, 3]
    assert groups["train-0-0"]["expected"] == 4 and groups["train-2-0"]["expected"] == 4
    assert groups["val-0-0.r1"]["expected"] == 1
    assert [m["outcome"]["context_full"] for m in groups["train-2-0"]["members"]] == [False, True]
    status, body = get(page + "api/groups?outcome=bogus")
    assert status == 400 and b"outcome 'bogus'" in body
    assert get(page + "api/groups?limit=x")[0] == 400
    # one trajectory: grids as grids, a 64-bit seed as text, secrets in the text masked
    traj = get_json(page + "api/trajectory/val-0-0-0.r2")
    assert traj["steps"][0]["observation"] == [[1, 2], [3, 4]]
    assert traj["seed"] == str(2**63 - 5) and traj["round"] == 2
    assert traj["steps"][0]["response"] == "Bearer *** at http://u:***@h:1/v1"
    assert get(page + "api/trajectory/train-9-9-9")[0] == 404


def test_the_state_counts_the_samples_tool_calls_and_the_runs_discarded_tokens(
        r: redis.Redis, run: str, served) -> None:
    """The page's counters of the other parts: tool calls and malformed ones (from the
    samples' steps) and the generated tokens thrown away (the status snapshot's)."""
    keys = Keys(run)
    trajs = [trajectory("train", 0, 0, m, success=True) for m in range(2)]
    trajs[0]["steps"][0].update(tool_calls=3, tool_malformed=1)
    trajs[1]["steps"].append({**trajs[1]["steps"][0], "tool_calls": 2})
    add_samples(r, keys, trajs)
    page = served()
    state = wait_for(lambda: (s := get_json(page + "api/state"))["samples"]["received"] == 2
                     and s, what="both samples read")
    assert state["samples"]["tools"] == {"calls": 5, "malformed": 1}
    assert "tokens_discarded" in state["snapshot"]


def test_the_page_keeps_the_newest_trajectories_and_reads_only_new_entries(
        r: redis.Redis, run: str, served) -> None:
    keys = Keys(run)
    add_samples(r, keys, [trajectory("train", g, 0, m, success=True) for g in range(4)
                          for m in range(4)])
    page = served(keep=8)
    wait_for(lambda: get_json(page + "api/state")["samples"]["received"] == 16,
             what="16 samples read")
    add_samples(r, keys, [trajectory("train", 3, 1, m, success=True) for m in range(4)])
    wait_for(lambda: get_json(page + "api/state")["samples"]["received"] == 20,
             what="the 4 new samples read, and only them")
    state = get_json(page + "api/state")["samples"]
    assert state["kept"] == 8 and state["groups"] == 2
    assert [g["key"] for g in get_json(page + "api/groups")["groups"]] == ["train-3-1", "train-3-0"]


def test_only_get_and_only_loopback_hosts(served) -> None:
    page = served()
    assert get(page + "api/state", method="POST")[0] == 405
    assert get(page + "api/state", method="DELETE")[0] == 405
    status, body = get(page + "api/state", headers={"Host": "rebound.example:80"})
    assert status == 403 and b"loopback" in body
    assert get(page + "api/state", headers={"Host": "127.0.0.1.rebound.example"})[0] == 403
    assert get(page + "api/state", headers={"Host": "127.attacker.example:80"})[0] == 403
    assert get(page + "api/state", headers={"Host": "localhost"})[0] == 200
    assert get(page + "api/state", headers={"Host": "[::1]:8360"})[0] == 200
    assert get(page + "../../etc/passwd")[0] == 404
    assert get(page + "static/../../../../etc/passwd")[0] in (403, 404)
    with pytest.raises(urllib.error.HTTPError) as missing:  # the router's own 404 ...
        urllib.request.urlopen(page + "no/such/page", timeout=10)
    assert missing.value.code == 404  # ... carries the page's headers too
    assert missing.value.headers["X-Frame-Options"] == "DENY"
    reply = urllib.request.urlopen(page, timeout=10)
    assert "default-src 'self'" in reply.headers["Content-Security-Policy"]
    assert reply.headers["Cache-Control"] == "no-store"


def test_what_leaves_is_masked() -> None:
    assert mask_text("see redis://u:secret@h:6379/0 and http://tok@h/v1") == \
        "see redis://u:***@h:6379/0 and http://***@h/v1"
    assert mask_text("Authorization: Bearer abc.def-ghi") == "Authorization: Bearer ***"
    assert mask_text("rediss://h:1/0?password=x&ssl=true") == "rediss://h:1/0?password=***&ssl=true"
    assert redact({"http://a:b@h/": [float("nan"), 2**60, 3, True]}) == \
        {"http://a:***@h/": ["nan", str(2**60), 3, True]}
    config = small_config(policy={"type": "openai", "base_urls": ["http://h:1/v1"],
                                  "model": "m", "api_key_env": "SECRET_HOLDER"},
                          redis_url="redis://u:pw@h:1/0")
    summary = json.dumps(config_summary(config, "exp"))
    assert "SECRET_HOLDER" not in summary and "pw" not in summary and "redis_url" not in summary
    assert json.loads(summary)["policy"] == {"type": "openai", "model": "m",
                                             "base_urls": ["http://h:1/v1"]}


def test_a_sample_that_cannot_be_read_is_counted_not_fatal(r: redis.Redis, run: str) -> None:
    keys = Keys(run)
    r.xadd(keys.samples, {ENTRY_FIELD: b"\xc1 not msgpack"})
    add_samples(r, keys, [trajectory("train", 0, 0, 0, success=True)])
    feed = SampleFeed(keys)
    assert feed.read(r) == 1 and feed.undecodable == 1 and feed.received == 1


# -- the command line ---------------------------------------------------------------------------
def test_sigint_exits_130_and_sigterm_0(r: redis.Redis, run: str, redis_url: str,
                                        ui_process) -> None:
    Batcher(r, small_config(), run=run)
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 0)):
        proc, page = ui_process(redis_url, run)
        assert get(page)[0] == 200
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == code and "Traceback" not in err, err


def test_bad_input_is_one_line(r: redis.Redis, run: str, redis_url: str) -> None:
    Batcher(r, small_config(), run=run)
    env = {**clean_env(), "ROLLSTREAM_REDIS_URL": redis_url}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli_here("ui", "--run", run, "--port", str(port), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"rollstream: error: --port {port}: cannot listen on 127.0.0.1:{port} (Address already "
        "in use)"]
    cases = [
        (("ui", "--run", f"{run}-none", "--port", "0"), 1, "does not exist here"),
        (("ui", "--run", run, "--host", "no.such.host.invalid", "--port", "0"), 2, "--host"),
    ]
    for args, code, text in cases:
        done = run_cli_here(*args, env=env)
        assert done.returncode == code and text in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    done = run_cli_here("ui", "--run", run, "--port", "70000", env=env)  # argparse's
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == \
        "rollstream ui: error: argument --port: '70000' must be a port in 0..65535"
    dead = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    done = run_cli_here("ui", "--run", run, env={**clean_env(), "ROLLSTREAM_REDIS_URL": dead})
    assert done.returncode == 1 and "cannot reach Redis" in done.stderr
    assert PASSWORD not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = run_cli_here("ui", "--run", run, "--redis-url", "http://nope")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


def test_the_page_lists_a_group_once_its_first_member_came(r: redis.Redis, run: str,
                                                           served) -> None:
    keys = Keys(run)
    page = served()
    assert get_json(page + "api/groups")["groups"] == []
    add_samples(r, keys, [trajectory("train", 0, 5, 2, success=False)])
    group = wait_for(lambda: get_json(page + "api/groups")["groups"], what="the group")[0]
    assert group["key"] == "train-0-5" and [m["member"] for m in group["members"]] == [2]
    time.sleep(0.3)  # refreshes go on; nothing doubles
    assert len(get_json(page + "api/groups")["groups"][0]["members"]) == 1


def test_a_redis_that_goes_away_is_said_on_the_page_which_keeps_what_it_had(
        r: redis.Redis, run: str, served, proxy) -> None:
    keys = Keys(run)
    add_samples(r, keys, [trajectory("train", 0, 0, m, success=True) for m in range(4)])
    page = served(url=proxy.url)
    wait_for(lambda: get_json(page + "api/state")["samples"]["received"] == 4,
             what="the samples read through the proxy")
    proxy.close()  # Redis unreachable from here on
    state = wait_for(lambda: (s := get_json(page + "api/state"))["error"] and s,
                     what="the page to say Redis cannot be read")
    assert state["error"].startswith("cannot read the run from Redis at redis://127.0.0.1:")
    assert state["samples"]["received"] == 4 and state["snapshot"]["run"] == run
    assert len(get_json(page + "api/groups")["groups"]) == 1
