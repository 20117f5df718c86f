"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from producers.producer import Producer
from schemas.codec import ENTRY_FIELD, decode_trajectory, encode_trajectory, traj_ids
from schemas.config import RolloutConfig
from schemas.keys import Keys

ROOT = Path(__file__).resolve().parents[1]
ASK_ONCE = Retry(NoBackoff(), 0)  # a client that does not retry a refused connection or AUTH:
# redis-py 8's default retries them with ~4 s of backoff; the tests' polls ask again themselves


def clean_env() -> dict[str, str]:
    """This environment without the variables that would point a command at another run."""
    return {k: v for k, v in os.environ.items()
            if k not in ("ROLLSTREAM_REDIS_URL", "REDIS_URL", "ROLLSTREAM_RUN")}


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m rollstream ARGS` from the repo root (with `clean_env()` unless given)."""
    return subprocess.run([sys.executable, "-m", "rollstream", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout,
                          env=clean_env() if env is None else env)


def run_cli_here(*args: str, env: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess:
    """`rollstream ARGS` run in this process (`rollstream.cli.main`) from the repo root, with
    `env` (`clean_env()` unless given) as the environment meanwhile: the same code and the
    same output as `run_cli`, without a Python start and its imports (~0.4 s a command).
    For commands that end by themselves and start nothing (`config check`, `config show`);
    what only a process shows (its exit status, that nothing else is printed, a
    traceback-free interpreter) is checked through `run_cli` elsewhere."""
    import contextlib
    import io
    import logging

    from rollstream.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    root.handlers[:] = []  # so main's logging.basicConfig writes to this stderr, as there
    os.environ.clear()
    os.environ.update(clean_env() if env is None else env)
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's refusal of a bad command line
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(cwd)
        root.handlers[:], root.level = handlers, level  # main's logging set-up undone
    return subprocess.CompletedProcess(["rollstream", *args], code, out.getvalue(),
                                       err.getvalue())


def small_config(**overrides: Any) -> RolloutConfig:
    """A fast FrozenLake config: 4 groups of 4, 2 shards, short leases."""
    data: dict[str, Any] = {
        "rollout_batch_size": 16,
        "async_generation_ratio": 0,
        "seed": 7,
        "lease_ttl_s": 1.5,
        "train_env_manager": {"max_env_num_per_worker": 8, "num_env_groups": 4,
                              "group_size": 4, "tags": ["FrozenLake"]},
        "val_env_manager": {"max_env_num_per_worker": 8, "num_env_groups": 8,
                            "group_size": 1, "tags": ["FrozenLake"]},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return RolloutConfig.from_dict(data)


class ProducerThread:
    """A Producer running in a thread of this process (fast to start)."""

    def __init__(self, producer: Producer):
        self.producer = producer
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(producer.run()),
                                       daemon=True)

    def start(self) -> ProducerThread:
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 20.0) -> int:
        self.producer.request_stop()
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "producer thread did not stop"
        return self.result[0]


def ephemeral_ports() -> range:
    """The ports the kernel picks by itself: for every outgoing connection and every bind to
    port 0, of any process on this machine (Linux's setting, else the widest default)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 65535
    return range(low, high + 1)


PORT_TRIES = 5  # starts of a server on fresh ports when its port was taken meanwhile
PORT_TAKEN = "Address already in use"  # what redis-server logs then (bind: ...)
FIRST_PORT = 10_000  # free_port() stays above the usual services' ports
_picked: set[int] = set()  # ports free_port() gave out in this process: never twice
# not the `random` module: a test may seed that, and two suites on one machine would then
# try the same ports in the same order
_picker = random.SystemRandom()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now, for a server started next.

    Never one of `ephemeral_ports()` (what a bind to port 0 gave before): such a port, once
    the probe closes, is the kernel's to give to the next bind to port 0 or outgoing
    connection of any process, and on a machine busy with other test runs (their servers
    on port 0) one took it before the redis-server meant for it bound it (`bind: Address
    already in use`). Outside that range only a process that names the port takes it;
    a start that finds it taken retries on a fresh one (`redis_servers.Node.wait_ready`,
    `password_redis`)."""
    ephemeral = ephemeral_ports()
    pool = [*range(FIRST_PORT, ephemeral.start), *range(ephemeral.stop, 65536)]
    for _ in range(200):
        port = _picker.choice(pool)
        if port in _picked:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # in use
                continue
        _picked.add(port)
        return port
    raise AssertionError(f"no free port outside {ephemeral} in 200 tries")


@contextmanager
def password_redis(folder: Path, password: str, *, appendonly: bool = False) -> Iterator[int]:
    """A redis-server on loopback that wants `password` (AOF with an fsync per write when
    `appendonly`, as compose runs it); yields its port, stops it after. A port taken between
    `free_port()` and the server's bind is given up for another."""
    from rollstream.embedded import find_redis_server

    aof = ["--appendonly", "yes", "--appendfsync", "always"] if appendonly else []
    for _ in range(PORT_TRIES):
        port = free_port()
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen([find_redis_server(), "--port", str(port), "--bind",
                                 "127.0.0.1", "--requirepass", password, *aof, "--save", "",
                                 "--dir", str(folder)], stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=port, password=password,  # asked again by wait_for
                             retry=ASK_ONCE)
        try:
            wait_for(functools.partial(_started, proc, client), timeout_s=10,
                     what="redis-server")
            if proc.poll() is None:
                yield port
                return
            log.seek(0)
            said = log.read().decode(errors="replace")
            if PORT_TAKEN not in said:
                raise AssertionError(f"redis-server exited at start: {said[-400:]}")
        finally:
            client.close()
            log.close()
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
    raise AssertionError(f"redis-server found {PORT_TRIES} free ports taken at its start")


def _started(proc: subprocess.Popen, client: redis.Redis) -> bool:
    """The server answers, or has exited."""
    return proc.poll() is not None or _pings(client)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def wait_for(predicate: Callable[[], Any], timeout_s: float = 15.0, interval_s: float = 0.05,
             what: str = "condition") -> Any:
    """Poll `predicate` until truthy; fail the test with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class BrokenEnv(gym.Env):
    """An env whose step always raises: its members must commit failed trajectories.

    Every reset's seed is appended to `BrokenEnv.resets` (clear it first), so a test can
    count the attempts and see that a retry reuses the episode's seed."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)
    resets: list[int | None] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        BrokenEnv.resets.append(seed)
        return 0, {}

    def step(self, action: int):
        raise RuntimeError("broken on purpose")


BROKEN_ENV_ID = "rollstream-test/Broken-v0"
if BROKEN_ENV_ID not in gym.registry:
    gym.register(id=BROKEN_ENV_ID, entry_point="helpers:BrokenEnv")


class SleepyEnv(gym.Env):
    """A one-step env whose step blocks for `delay_s` (as an env doing I/O would)."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay_s: float = 30.0):
        self.delay_s = delay_s

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: int):
        time.sleep(self.delay_s)
        return 1, 1.0, True, False, {"success": True}


SLEEPY_ENV_ID = "rollstream-test/Sleepy-v0"
if SLEEPY_ENV_ID not in gym.registry:
    gym.register(id=SLEEPY_ENV_ID, entry_point="helpers:SleepyEnv")


class OneStepEnv(gym.Env):
    """An episode of exactly one step (reward 1): one policy call, then a commit."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: int):
        return 1, 1.0, True, False, {"success": True}


ONE_STEP_ENV_ID = "rollstream-test/OneStep-v0"
if ONE_STEP_ENV_ID not in gym.registry:
    gym.register(id=ONE_STEP_ENV_ID, entry_point="helpers:OneStepEnv")


class SlowToBuildEnv(OneStepEnv):
    """A one-step env that takes `build_s` to construct (a simulator loading its assets)."""

    def __init__(self, build_s: float = 0.025):
        time.sleep(build_s)


SLOW_BUILD_ENV_ID = "rollstream-test/SlowToBuild-v0"
if SLOW_BUILD_ENV_ID not in gym.registry:
    gym.register(id=SLOW_BUILD_ENV_ID, entry_point="helpers:SlowToBuildEnv")


def slow_build_config(lease_ttl_s: float, groups: int) -> RolloutConfig:
    """`small_config` of `groups` train groups of 2 SlowToBuild envs, 4 envs a shard (so
    `groups / 2` shards, each 0.1 s to build: claiming them takes that long whatever the
    machine's speed), async, no val."""
    return small_config(
        lease_ttl_s=lease_ttl_s, rollout_batch_size=8, async_generation_ratio=1,
        custom_envs={"Slow": {"env_id": SLOW_BUILD_ENV_ID}},
        train_env_manager={"max_env_num_per_worker": 4, "num_env_groups": groups,
                           "group_size": 2, "tags": ["Slow"]},
        val_env_manager=None)


def broken_group_config(threaded: bool = False, **overrides: Any) -> RolloutConfig:
    """`small_config` whose train group 3 is an env that always raises (groups 0-2 are
    FrozenLake): its episodes fail and the group is dropped."""
    return small_config(
        custom_envs={"Broken": {"env_id": BROKEN_ENV_ID, "threaded": threaded}},
        train_env_manager={"tags": ["FrozenLake", "Broken"], "num_groups_partition": [3, 1]},
        **overrides)


def get_batch_in_thread(batcher: Any, timeout_s: float) -> tuple[threading.Thread, dict]:
    """`batcher.get_batch("train")` on a started thread; the dict gets "batch" or "error"."""
    result: dict[str, Any] = {}

    def wait() -> None:
        try:
            result["batch"] = batcher.get_batch("train", timeout_s=timeout_s)
        except Exception as exc:  # what the caller's test looks for
            result["error"] = exc

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, result


def blocked_in_xreadgroup(client: Any, name: str | None = None) -> bool:
    """Whether the server lists a client (named `name`, if given) blocked in XREADGROUP."""
    return any(c["cmd"] == "xreadgroup" and "b" in c["flags"]
               and (name is None or c.get("name") == name) for c in client.client_list())


def publish(batcher: Any) -> int:
    """The trainer publishes the next policy version (one place to adapt to its signature)."""
    return batcher.publish_version()


def trajectory(mode: str, group_id: int, episode_id: int, member: int, *, group_size: int,
               version_start: int = 0, round: int = 0, producer: str = "test",
               **extra: Any) -> dict[str, Any]:
    """A valid, hand-built trajectory message (one step) for a group of `group_size`."""
    group_key, traj_key = traj_ids(mode, group_id, episode_id, member)
    return {
        "traj_id": traj_key, "traj_group_id": group_key, "mode": mode, "round": round,
        "group_id": group_id, "episode_id": episode_id, "member": member,
        "env_id": group_id * group_size + member, "tag": "FrozenLake", "seed": 1,
        "version_start": version_start, "version_end": version_start, "episode_score": 1.0,
        "success": True, "terminated": True, "truncated": False, "num_actions": 1,
        "steps": [{"observation": "o", "action": 1, "reward": 1.0, "version": version_start,
                   "info": {}}],
        "producer": producer, **extra,
    }


def add_trajectory(r: Any, keys: Keys, mode: str, group_id: int, episode_id: int,
                   member: int, *, group_size: int, **fields: Any) -> str:
    """XADD a hand-built trajectory to its group stream, as a producer's commit would."""
    msg = trajectory(mode, group_id, episode_id, member, group_size=group_size, **fields)
    entry_id = r.xadd(keys.stream(mode, group_id), {ENTRY_FIELD: encode_trajectory(msg)})
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def add_group(r: Any, keys: Keys, mode: str, group_id: int, episode_id: int, *,
              group_size: int, members: Any = None, **fields: Any) -> None:
    """XADD the given members (default: all) of one group's episode."""
    for member in range(group_size) if members is None else members:
        add_trajectory(r, keys, mode, group_id, episode_id, member, group_size=group_size,
                       **fields)


def stream_messages(r: Any, keys: Keys, config: RolloutConfig,
                    mode: str = "train") -> list[dict[str, Any]]:
    """Every message in the mode's group streams, read with XRANGE (not via a batcher)."""
    out: list[dict[str, Any]] = []
    for g in range(config.manager(mode).num_env_groups):
        for _, fields in r.xrange(keys.stream(mode, g)):
            out.append(decode_trajectory(fields[ENTRY_FIELD]))
    return out


def stream_lengths(r: Any, keys: Keys, config: RolloutConfig, mode: str = "train") -> list[int]:
    """XLEN of every group stream of the mode."""
    pipe = r.pipeline(transaction=False)
    for g in range(config.manager(mode).num_env_groups):
        pipe.xlen(keys.stream(mode, g))
    return pipe.execute()


def record_acknowledged(monkeypatch: Any) -> list[str]:
    """Patch the producers of this process so every commit they are told is in (COMMITTED or
    DUPLICATE: acknowledged) appends its traj_id to the returned list."""
    from producers import serving as serving_module
    from producers.commit import Committer, Outcome

    told: list[str] = []

    class RecordingCommitter(Committer):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            future = super().submit(*args, **kwargs)
            data = args[-1]

            def note(done: Any) -> None:
                if (not done.cancelled() and done.exception() is None
                        and done.result() in (Outcome.COMMITTED, Outcome.DUPLICATE)):
                    told.append(decode_trajectory(data)["traj_id"])

            future.add_done_callback(note)
            return future

    monkeypatch.setattr(serving_module, "Committer", RecordingCommitter)
    return told


class HoldsSecondEpisode:
    """A policy (`type: python, entrypoint: helpers:HoldsSecondEpisode`) that plays episode 0
    at once and holds the first turn of any later episode until it is cancelled, setting
    `holding` when it gets there (evidence that the env's next episode is in flight)."""

    holding = threading.Event()

    async def act(self, observation: Any, ctx: Any) -> tuple[int, None]:
        if ctx.episode_id >= 1:
            HoldsSecondEpisode.holding.set()
            await asyncio.Event().wait()
        return 0, None


def load_bench(name: str) -> ModuleType:
    """`bench/<name>.py` imported as a module (the benchmarks are scripts, not a package).
    bench/ goes on sys.path, as running a script puts its folder there, so they import each
    other; the module is registered under its name (its dataclasses look themselves up)."""
    folder = str(ROOT / "bench")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
