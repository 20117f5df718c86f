"""Prometheus metrics: `/metrics` pages of live producers and Batchers scraped over HTTP, the
counters behind them, the compose monitoring profile, and Debian's Prometheus scraping a run."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import (
    ONE_STEP_ENV_ID,
    broken_group_config,
    clean_env,
    free_port,
    small_config,
    wait_for,
)
from helpers import run_cli as cli

from consumer import Batcher
from consumer.metrics import batcher_families
from producers import metrics as producer_metrics
from producers.metrics import ProducerStats
from schemas.errors import BatchTimeout, ConfigError
from schemas.keys import Keys
from schemas.stats import Histogram, serve_metrics

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
Samples = dict[tuple[str, frozenset], float]



def scrape(url: str) -> Samples:
    """Every sample of a /metrics page, parsed by prometheus-client's own parser."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def try_scrape(url: str) -> Samples | None:
    try:
        return scrape(url)
    except (urllib.error.URLError, ConnectionError):
        return None


# -- live runs -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_metrics_pages_of_a_live_run_show_the_counters_moving(r, run, redis_url):
    config = small_config()  # sync; train 4 groups of 4 in 2 shards, val 8 envs in 1 shard
    batcher = Batcher(r, config, run=run)
    trainer = batcher.serve_metrics(0, "127.0.0.1")
    port = free_port()  # compose's way: ROLLSTREAM_METRICS_PORT in the environment
    env = {**clean_env(), "ROLLSTREAM_METRICS_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "rollstream", "produce", "--redis-url",
                             redis_url, "--run", run, "--metrics-addr", "127.0.0.1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    producer_url = f"http://127.0.0.1:{port}/metrics"
    trainer_url = f"http://127.0.0.1:{trainer.port}/metrics"
    committed = "rollstream_trajectories_committed_total"
    try:
        first = wait_for(lambda: (s := try_scrape(producer_url)) and total(s, committed) and s,
                         timeout_s=30, what="the producer's first commits on /metrics")
        for _ in range(3):
            batch = batcher.get_batch("train", timeout_s=30)
            batcher.ack(batch)
            batcher.publish_version()
        later = wait_for(lambda: (s := scrape(producer_url)) and total(s, committed) >= 48 and s,
                         what="the producer's counter to move")
        assert value(later, committed, mode="train", tag="FrozenLake") > value(
            first, committed, mode="train", tag="FrozenLake")
        assert value(later, "rollstream_shards_held", mode="train") == 2
        assert value(later, "rollstream_shards_held", mode="val") == 1
        assert value(later, "rollstream_envs_held", mode="train", tag="FrozenLake") == 16
        assert value(later, "rollstream_producer_version") >= 2
        assert value(later, "process_resident_memory_bytes") > 0
        assert total(later, "rollstream_episode_actions_total") >= total(later, committed)
        seen = scrape(trainer_url)
        assert value(seen, "rollstream_trajectories_delivered_total", mode="train",
                     tag="FrozenLake") == 48
        assert value(seen, "rollstream_batch_wait_seconds_count", mode="train") == 3
        assert value(seen, "rollstream_commit_to_delivery_seconds_count", mode="train") == 48
        assert value(seen, "rollstream_version") == 3
        assert value(seen, "rollstream_live_producers") == 1
        assert ("rollstream_stream_backlog", frozenset({("mode", "train")})) in seen
        assert ("rollstream_stream_pending", frozenset({("mode", "val")})) in seen
        assert value(seen, "rollstream_paused") == 1  # sync: paused after each hand-out
        assert value(seen, "rollstream_pause_reason", reason="sync") == 1
    finally:
        trainer.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"producer metrics at http://127.0.0.1:{port}/metrics" in out


def free_port_range(count: int) -> int:
    """A port P with P .. P + count - 1 all free on loopback now."""
    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError("no free port range")


@pytest.mark.slow
def test_up_gives_the_trainer_and_each_producer_a_metrics_page(tmp_path, redis_url, run):
    port = free_port_range(3)
    config = tmp_path / "config.yaml"
    config.write_text(small_config(async_generation_ratio=1).to_json())
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "up", "--config", str(config), "--redis-url",
         redis_url, "--run", run, "--producers", "2", "--train-step-s", "0.05",
         "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"],
        cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    try:
        while not any(line.startswith("step 1 ") for line in lines):
            line = proc.stdout.readline()
            assert line, f"up ended early: {lines}"
            lines.append(line)
        assert (f"metrics: trainer http://127.0.0.1:{port}/metrics, producers "
                f":{port + 1}-{port + 2}\n") in lines
        trainer = scrape(f"http://127.0.0.1:{port}/metrics")
        assert value(trainer, "rollstream_trajectories_delivered_total", mode="train",
                     tag="FrozenLake") >= 32
        pages = [f"http://127.0.0.1:{p}/metrics" for p in (port + 1, port + 2)]

        def shards_held() -> list[float]:
            return [total(try_scrape(url) or {}, "rollstream_shards_held") for url in pages]

        # every shard (2 train, 1 val) held, split between the two (a handover may be under way)
        wait_for(lambda: sum(shards_held()) == 3 and all(shards_held()),
                 what="both producers' pages showing the shards they hold")
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err


@pytest.mark.slow
def test_up_trainer_hands_its_script_the_metrics_port_and_the_producers_the_next(tmp_path):
    port = free_port_range(2)
    config = tmp_path / "config.yaml"
    config.write_text(small_config(val_env_manager=None).to_json())
    out = subprocess.run(
        [sys.executable, "-m", "rollstream", "up", "--config", str(config), "--producers", "1",
         "--metrics-port", str(port), "--metrics-addr", "127.0.0.1", "--trainer",
         str(ROOT / "tests" / "data" / "metrics_trainer.py")],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"metrics: producers :{port + 1} (the trainer's: ROLLSTREAM_METRICS_PORT={port})" \
        in out.stdout
    assert 'rollstream_trajectories_delivered_total{mode="train",tag="FrozenLake"} 16.0' \
        in out.stdout
    assert 'rollstream_shards_held{mode="train"} 2.0' in out.stdout


def test_env_errors_replays_and_failed_groups_are_counted(r, run, producer_thread):
    config = broken_group_config(rollout_batch_size=12, env_max_retries=1,
                                 async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    page = thread.producer.serve_metrics(0, "127.0.0.1")
    with batcher.serve_metrics(0, "127.0.0.1") as trainer:
        for _ in range(2):
            batcher.ack(batcher.get_batch("train", timeout_s=20))
            batcher.publish_version()
        seen = scrape(f"http://127.0.0.1:{trainer.port}/metrics")
    produced = scrape(f"http://127.0.0.1:{page.port}/metrics")
    # group 3: 4 members, each raised on its first try and on its one retry
    assert value(produced, "rollstream_env_errors_total", mode="train", tag="Broken") >= 8
    assert value(produced, "rollstream_episodes_replayed_total", mode="train", tag="Broken") >= 4
    assert value(produced, "rollstream_trajectories_failed_total", mode="train",
                 tag="Broken") >= 4
    assert value(produced, "rollstream_env_errors_total", mode="train", tag="FrozenLake") == 0
    assert value(seen, "rollstream_groups_failed_total", mode="train") >= 1
    assert thread.stop() == 0
    with pytest.raises(urllib.error.URLError):  # run() ended: the page is closed
        scrape(f"http://127.0.0.1:{page.port}/metrics")


def test_a_commit_fenced_by_a_lost_lease_is_counted_refused(r, run, producer_thread, caplog):
    """... and said once per shard: every env of the shard meets the fence (an audit saw 58
    lines within a second after a Redis restart)."""
    config = small_config(lease_ttl_s=30.0, policy={"type": "random", "latency_s": 1.0},
                          custom_envs={"One": {"env_id": ONE_STEP_ENV_ID}},
                          train_env_manager={"tags": ["One"]}, val_env_manager=None)
    keys = Keys(run)
    Batcher(r, config, run=run)
    thread = producer_thread()
    stats = thread.producer.stats
    # the heartbeat that follows the producer's own join announcement is done (the next one
    # is 10 s away, so no heartbeat notices the move before the commits meet it)
    wait_for(lambda: thread.producer.heartbeats >= 2, timeout_s=30, what="a second heartbeat")
    wait_for(lambda: stats.in_flight["train"] == 16, what="every env inside its episode")
    for shard in range(2):  # another producer has the shards now: commits are fenced
        r.set(keys.lease("train", shard), "someone-else", xx=True, keepttl=True)

    def stream_entries() -> int:
        return sum(r.xlen(keys.stream("train", g)) for g in range(4))

    before = stream_entries()  # every entry there landed before the move
    with thread.producer.serve_metrics(0, "127.0.0.1") as page:
        seen = wait_for(lambda: (s := scrape(f"http://127.0.0.1:{page.port}/metrics")) and value(
            s, "rollstream_commits_refused_total", mode="train", reason="lease_lost") and s,
            what="refused commits on /metrics")
    assert value(seen, "rollstream_trajectories_committed_total", mode="train",
                 tag="One") == before
    assert stream_entries() == before
    wait_for(lambda: stats.in_flight["train"] == 0, what="every env's commit fenced")
    fenced = [rec.getMessage() for rec in caplog.records if "lease lost at commit" in
              rec.getMessage()]
    assert sorted(fenced) == [f"shard ('train', {s}): lease lost at commit; its envs stop"
                              for s in range(2)]
    thread.stop()


def test_expired_episodes_are_counted_abandoned(r, run, producer_thread):
    config = small_config(async_generation_ratio=1, val_env_manager=None,
                          policy={"type": "random", "latency_s": 0.3})
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    stats = thread.producer.stats
    wait_for(lambda: stats.in_flight["train"] == 16, what="every env inside episode 0")
    batcher.publish_version()
    batcher.publish_version()  # version 2: episode 0 (step 0) expires with ratio 1
    wait_for(lambda: stats.abandoned[("train", "FrozenLake", "expired")] > 0,
             what="an abandoned episode")
    families = {f.name: f for f in stats.families()}
    samples = {tuple(s.labels.values()): s.value
               for s in families["rollstream_episodes_abandoned"].samples}
    assert samples[("train", "FrozenLake", "expired")] >= 1
    assert ("train", "FrozenLake", "leaving") not in samples
    thread.stop()


def test_llm_requests_recorded_by_a_policy_show_on_the_producer_page():
    stats = ProducerStats("p")
    with stats.serve(0, "127.0.0.1") as page:
        url = f"http://127.0.0.1:{page.port}/metrics"
        before = scrape(url)
        producer_metrics.llm_request("http://llm-a:8000/v1", 0.3)
        producer_metrics.llm_request("http://llm-a:8000/v1", 7.0)
        producer_metrics.llm_error("http://llm-a:8000/v1", "timeout")
        after = scrape(url)
    server = {"server": "http://llm-a:8000/v1"}
    name = "rollstream_llm_request_seconds"
    assert value(after, f"{name}_count", **server) - value(before, f"{name}_count", **server) == 2
    assert value(after, f"{name}_bucket", le="0.5", **server) - value(
        before, f"{name}_bucket", le="0.5", **server) == 1
    errors = "rollstream_llm_request_errors_total"
    assert value(after, errors, reason="timeout", **server) - value(
        before, errors, reason="timeout", **server) == 1
    producer_metrics.llm_request("http://user:s3cret@llm-b:8000/v1", 0.1)  # a password in it
    with stats.serve(0, "127.0.0.1") as page:
        shown = urllib.request.urlopen(f"http://127.0.0.1:{page.port}/metrics").read().decode()
    assert "s3cret" not in shown and 'server="http://user:***@llm-b:8000/v1"' in shown


def test_a_batcher_in_get_batch_shows_waiting(r, run):
    batcher = Batcher(r, small_config(), run=run)
    with batcher.serve_metrics(0, "127.0.0.1") as page:
        url = f"http://127.0.0.1:{page.port}/metrics"
        waiter = threading.Thread(target=lambda: pytest.raises(
            BatchTimeout, batcher.get_batch, "train", timeout_s=1.5), daemon=True)
        waiter.start()
        wait_for(lambda: value(scrape(url), "rollstream_batcher_waiting", mode="train") == 1,
                 what="the waiting gauge")
        waiter.join(10)
        assert value(scrape(url), "rollstream_batcher_waiting", mode="train") == 0


# -- the plain counters and the page -------------------------------------------------------------
def test_histogram_buckets_match_prometheus_clients_own():
    bounds = (0.1, 0.5, 1.0)
    values = [0.05, 0.1, 0.1000001, 0.5, 0.7, 1.0, 3.0, 0.0]
    theirs = prometheus_client.Histogram("h", "h", buckets=bounds,
                                         registry=prometheus_client.CollectorRegistry())
    ours, many = Histogram(bounds), Histogram(bounds)
    for v in values:
        theirs.observe(v)
        ours.observe(v)
    import numpy as np

    many.observe_many(np.array(values))
    expected = [(s.labels["le"], s.value) for s in theirs.collect()[0].samples
                if s.name == "h_bucket"]
    assert [(float(le), n) for le, n in ours.buckets()] == [(float(le), n)
                                                            for le, n in expected]
    assert many.buckets() == ours.buckets() and many.total == pytest.approx(ours.total)
    assert ours.count == len(values)


def busy_port_after_a_free_one() -> tuple[socket.socket, int]:
    """A listening socket on a port whose predecessor is free right now (for `up`, which
    serves the trainer on P and producer 1 on P + 1). The free one is a `free_port()`: one
    next to a port the kernel picked is in its ephemeral range, where any process's
    outgoing connection may take it before `up` binds it."""
    for _ in range(100):
        port = free_port() + 1
        busy = socket.socket()
        try:
            busy.bind(("127.0.0.1", port))
        except OSError:
            busy.close()
            continue
        busy.listen()
        return busy, port
    raise AssertionError("no free port below a busy one in 100 tries")


def test_a_port_in_use_is_refused_with_its_number():
    busy, port = busy_port_after_a_free_one()
    with busy:
        with pytest.raises(ConfigError, match=f"metrics port {port}: cannot serve"):
            serve_metrics(lambda: [], port, "127.0.0.1")
        out = cli("produce", "--redis-url", "redis://127.0.0.1:1/0", "--run", "x",
                  "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
        assert out.returncode == 2, out.stderr
        assert f"metrics port {port}: cannot serve producer metrics" in out.stderr
        assert "Traceback" not in out.stderr
        out = cli("up", "--config", "configs/frozenlake_async.yaml", "--producers", "2",
                  "--metrics-port", str(port - 1), "--metrics-addr", "127.0.0.1",
                  "--steps", "1")
        assert out.returncode == 2, out.stderr
        assert f"port {port} on 127.0.0.1 (for producer 1) is not free" in out.stderr
    env = {**clean_env(), "ROLLSTREAM_METRICS_PORT": "http"}
    out = cli("produce", "--redis-url", "redis://127.0.0.1:1/0", "--run", "x", env=env)
    assert out.returncode == 2 and "ROLLSTREAM_METRICS_PORT: 'http' is not a port" in out.stderr


# -- compose's monitoring profile ---------------------------------------------------------------
COMPOSE = ROOT / "compose"


def served_names(r, run) -> set[str]:
    """Every metric name the producer and batcher pages can show."""
    producer_metrics.llm_request("http://x", 0.1)  # LLM families appear once recorded
    producer_metrics.llm_error("http://x", "timeout")
    stats = ProducerStats("p")
    names = {f.name for f in stats.families()}
    batcher = Batcher(r, small_config(), run=run)
    names |= {f.name for f in batcher_families(batcher._shared, batcher.redis, batcher.keys)}
    return names | {"process_resident_memory_bytes", "process_cpu_seconds"}


def test_the_monitoring_profile_scrapes_trainer_and_producers_and_its_dashboard_is_served(r, run):
    services = yaml.safe_load((COMPOSE / "compose.yaml").read_text())["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
    for name in ("producer", "trainer"):  # both serve /metrics on the port Prometheus scrapes
        assert services[name]["environment"]["ROLLSTREAM_METRICS_PORT"] == "9100"
    scrape_configs = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())["scrape_configs"]
    jobs = {job["job_name"]: job for job in scrape_configs}
    assert jobs["rollstream-trainer"]["static_configs"][0]["targets"] == ["trainer:9100"]
    assert jobs["rollstream-producer"]["dns_sd_configs"][0] == {
        "names": ["producer"], "type": "A", "port": 9100, "refresh_interval": "15s"}
    dashboard = json.loads((COMPOSE / "grafana" / "dashboards" / "rollstream.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {re.sub(r"_(total|bucket|count|sum)$", "", name)
            for expr in exprs for name in re.findall(r"\b(?:rollstream|process)_[a-z_]+", expr)}
    served = served_names(r, run)
    assert used - served == set(), "the dashboard asks for metrics nobody serves"
    assert len(used & served) >= 20


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_prometheus_config():
    out = subprocess.run(["promtool", "check", "config", str(COMPOSE / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# -- Debian's Prometheus -------------------------------------------------------------------------
def prometheus_query(base: str, query: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())["data"]["result"]
    except (urllib.error.URLError, ConnectionError):
        return []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_prometheus_scrapes_a_live_run(r, run, producer_thread, tmp_path):
    config = small_config(async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    thread = producer_thread()
    page = thread.producer.serve_metrics(0, "127.0.0.1")
    trainer = batcher.serve_metrics(0, "127.0.0.1")
    web = free_port()
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "250ms"},  # two scrapes show a counter move
        "scrape_configs": [
            {"job_name": "rollstream-producer",
             "static_configs": [{"targets": [f"127.0.0.1:{page.port}"]}]},
            {"job_name": "rollstream-trainer",
             "static_configs": [{"targets": [f"127.0.0.1:{trainer.port}"]}]}]}))
    server = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{web}"
    stop = threading.Event()

    def train() -> None:
        while not stop.is_set():
            batcher.ack(batcher.get_batch("train", timeout_s=20))
            batcher.publish_version()

    trainer_thread = threading.Thread(target=train, daemon=True)
    trainer_thread.start()
    try:
        first = wait_for(lambda: prometheus_query(
            base, 'sum(rollstream_trajectories_delivered_total{job="rollstream-trainer"})'),
            timeout_s=40, what="Prometheus to have scraped the trainer")
        wait_for(lambda: (later := prometheus_query(
            base, 'sum(rollstream_trajectories_delivered_total{job="rollstream-trainer"})'))
            and float(later[0]["value"][1]) > float(first[0]["value"][1]),
            timeout_s=30, what="the delivered counter to move in Prometheus")
        committed = wait_for(lambda: prometheus_query(
            base, 'rollstream_trajectories_committed_total{job="rollstream-producer",'
                  'mode="train"}'), timeout_s=20, what="the producer's counter in Prometheus")
        assert float(committed[0]["value"][1]) > 0
        assert committed[0]["metric"]["tag"] == "FrozenLake"
        up = prometheus_query(base, "up")
        assert {u["metric"]["job"]: u["value"][1] for u in up} == {
            "rollstream-producer": "1", "rollstream-trainer": "1"}
    finally:
        stop.set()
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        trainer_thread.join(30)
        trainer.close()
        thread.stop()
