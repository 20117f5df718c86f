"""The compose deployment: the file validates, and its services' commands work as local
processes against a Redis with a password and an append-only file, as compose runs them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml
from helpers import ASK_ONCE, password_redis, wait_for

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose" / "compose.yaml"
pytestmark = pytest.mark.slow


def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_compose_file_declares_the_deployment():
    svc = services()
    assert {name for name, spec in svc.items() if "profiles" not in spec} == {
        "redis", "producer", "trainer"}  # profiles (monitoring) add services on demand
    redis_cmd = " ".join(svc["redis"]["command"])
    assert "--requirepass" in redis_cmd and "--appendonly yes" in redis_cmd
    assert "--appendfsync always" in redis_cmd
    assert svc["producer"]["command"][-1] == "produce"
    assert svc["producer"]["healthcheck"]["test"][1:] == ["rollstream", "produce", "--check"]
    assert svc["trainer"]["command"][0] == "train"
    for name in ("producer", "trainer"):
        assert "ROLLSTREAM_REDIS_URL" in svc[name]["environment"]


def test_the_image_installs_what_the_services_use():
    """The services serve metrics (ROLLSTREAM_METRICS_PORT): the image needs the `metrics`
    extra, or every producer and the trainer exit 1 at start and restart in a loop."""
    line = next(line for line in (ROOT / "compose" / "Dockerfile").read_text().splitlines()
                if "pip install" in line)
    extras = set(line.split('".[', 1)[1].split("]", 1)[0].split(","))
    svc = services()
    for name in ("producer", "trainer"):
        env = {**svc.get("x-common-env", {}), **svc[name].get("environment", {})}
        if env.get("ROLLSTREAM_METRICS_PORT"):
            assert "metrics" in extras, (name, line)
    assert "llm" in extras  # the openai policy


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_compose_config_validates():
    env = {**os.environ, "REDIS_PASSWORD": "x"}
    out = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    env.pop("REDIS_PASSWORD")  # no default password: compose refuses to start without one
    out = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0 and "set REDIS_PASSWORD" in out.stderr


@pytest.fixture
def password_redis_port(tmp_path):
    """A redis-server like compose's: TCP, a password, AOF with an fsync per write."""
    with password_redis(tmp_path, PASSWORD, appendonly=True) as port:
        with pytest.raises(redis.AuthenticationError):
            # the password is really required (asked once: redis-py's default client
            # retries a refused AUTH with backoff, ~4 s)
            redis.Redis(port=port, retry=ASK_ONCE).ping()
        yield port


PASSWORD = "s3:c/r@t#pw"  # characters a URL would need escaped
NO_TRAIN_TIME = ("--train-step-s", "0")  # after the service's own 0.5 s: the last one wins


def service_env(name: str, port: int, **extra: str) -> dict[str, str]:
    """The service's environment as compose gives it, pointed at the test's Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLSTREAM_", "REDIS_"))}
    for key, value in services()[name]["environment"].items():
        if key == "ROLLSTREAM_METRICS_PORT":
            continue  # one port per container there, one host here (test_metrics covers it)
        value = value.replace("${REDIS_PASSWORD:?set REDIS_PASSWORD}", PASSWORD)
        value = value.replace("${ROLLSTREAM_RUN:-exp1}", "exp1")
        env[key] = value.replace("redis:6379", f"127.0.0.1:{port}")
    env.update(extra)
    return env


def service_cmd(name: str) -> list[str]:
    """The service's command as compose runs it: the image's entrypoint is `rollstream`."""
    cmd = [arg.replace("${ROLLSTREAM_CONFIG:-configs/frozenlake_async.yaml}",
                       "configs/frozenlake_async.yaml") for arg in services()[name]["command"]]
    return [sys.executable, "-m", "rollstream", *cmd]


def test_services_run_as_local_processes(password_redis_port):
    # a trainer that ends for any reason (done, timed out) leaves the producers running; a
    # trainer started again finds them; only `rollstream stop` ends them
    env = service_env("producer", password_redis_port)
    assert "@" not in env["ROLLSTREAM_REDIS_URL"]  # the password travels on its own
    r = redis.Redis(port=password_redis_port, password=PASSWORD)
    producer = subprocess.Popen(service_cmd("producer"), cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    healthy: subprocess.Popen | None = None
    try:
        # the service's command with tiny budgets: 3 steps, no stand-in training time
        trainer = subprocess.run([*service_cmd("trainer"), "--steps", "3", *NO_TRAIN_TIME],
                                 cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert trainer.returncode == 0, trainer.stderr
        assert len([x for x in trainer.stdout.splitlines() if x.startswith("step")]) == 3
        # the healthcheck runs beside the trainers: the producer has joined (it made the
        # trajectories of those 3 steps) and stays live until the stop below
        healthy = subprocess.Popen(service_cmd("producer") + ["--check"], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        r.sadd("{exp1}:pause", "operator")  # the trainer times out: exit 1, nothing stopped
        # paused, the producers commit no train step: a wait of any length ends in
        # BatchTimeout (a short one sooner)
        timed_out = subprocess.run([*service_cmd("trainer"), "--timeout-s", "0.2",
                                    *NO_TRAIN_TIME], cwd=ROOT,
                                   env=env, capture_output=True, text=True, timeout=120)
        assert timed_out.returncode == 1 and "BatchTimeout" in timed_out.stderr
        assert producer.poll() is None and not r.exists("{exp1}:stop")
        r.srem("{exp1}:pause", "operator")
        again = subprocess.run([*service_cmd("trainer"), "--steps", "2", *NO_TRAIN_TIME],
                               cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert "live producer(s) on this host" in healthy.communicate(timeout=60)[0]
        assert producer.poll() is None  # it was live all along, the healthcheck's time too
        stop = subprocess.run([sys.executable, "-m", "rollstream", "stop"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0 and "1 live producer(s) exit now" in stop.stdout
        # started after the stop: says so (while the first producer exits)
        late = subprocess.run(service_cmd("producer"), cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
        assert late.returncode == 0 and "run exp1 was stopped" in late.stdout + late.stderr
        out, _ = producer.communicate(timeout=30)
        assert producer.returncode == 0, out
        check = subprocess.run(service_cmd("producer") + ["--check"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 1  # healthcheck: no live producer on this host now
        # the password is in no output and no key of the run
        for text in (out, late.stdout, late.stderr, trainer.stdout, trainer.stderr,
                     stop.stdout, timed_out.stderr):
            assert PASSWORD not in text
        for key in r.scan_iter(match="{exp1}:*"):
            if r.type(key) == b"string":
                assert PASSWORD.encode() not in r.get(key)
    finally:
        for proc in (producer, healthy):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.communicate(timeout=10)
        r.close()


def test_producer_healthcheck_passes_while_it_runs(password_redis_port):
    env = service_env("producer", password_redis_port, ROLLSTREAM_RUN="hc")
    r = redis.Redis(port=password_redis_port, password=PASSWORD)
    from consumer import Batcher
    from schemas.config import RolloutConfig

    Batcher(r, RolloutConfig.from_yaml(ROOT / "configs" / "frozenlake_sync.yaml"), run="hc")
    producer = subprocess.Popen(service_cmd("producer"), cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while r.zcard("{hc}:producers") == 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        check = subprocess.run(service_cmd("producer") + ["--check"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "1 live producer(s) on this host" in check.stdout
    finally:
        producer.send_signal(signal.SIGTERM)
        producer.wait(30)
        r.close()


def test_the_openenv_service_scales_on_its_own():
    """The env servers are a service of their own (`--profile openenv`, `--scale openenv=N`):
    no host port (replicas would collide), its image is the example env server, and its
    command, run here as a local process, serves OpenEnv's /health and /schema."""
    import urllib.request

    from helpers import free_port
    from openenv_servers import HAVE_OPENENV, SERVER

    spec = services()["openenv"]
    assert spec["profiles"] == ["openenv"] and "ports" not in spec
    assert "openenv-core==0.3.0" in (ROOT / spec["build"]["dockerfile"]).read_text()
    if not HAVE_OPENENV:
        pytest.skip("needs openenv-core (the openenv extra)")
    port = free_port()
    cmd = [arg.replace("${OPENENV_MAX_SESSIONS:-8}", "8").replace("8000", str(port))
           for arg in spec["command"]]
    cmd[cmd.index("0.0.0.0")] = "127.0.0.1"
    proc = subprocess.Popen([sys.executable, str(SERVER), *cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/health"), timeout_s=60,
                 what="the env server's /health")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/schema", timeout=5) as reply:
            assert b'"guess"' in reply.read()
    finally:
        proc.kill()
        proc.wait(10)


def _answers(url: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return reply.status == 200
    except OSError:
        return False
