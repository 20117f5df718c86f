"""Env servers an env of the producer talks to: which are up, how many sessions each holds.

`ServerPool` is shared by every env of one producer (event loop) that names the same base
URLs: it hands out a session slot on a server that is up and below its session cap (OpenEnv
servers refuse sessions past `max_concurrent_envs`, default 1), least loaded first; an env
waits for a slot when all are taken (waiting is not a failure). A server that fails (refused
connection, closed socket, deadline passed) is set aside with its reason, one log line; a
probe of its `/health` brings it back once it answers (one log line), and the pool uses it
again. With every server down, `acquire` waits up to its deadline and then raises
`RemoteEnvError` with the servers' reasons: the episode is replayed (the shard runner's
bounded retries) and in the end its group fails with that reason, never a stalled run.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field

import aiohttp

from producers.lifetime import within

logger = logging.getLogger(__name__)

PROBE_FIRST_S = 0.2  # the first /health probe after a failure; doubles up to PROBE_MAX_S
PROBE_MAX_S = 5.0
PROBE_TIMEOUT_S = 2.0


class RemoteEnvError(Exception):
    """An episode a remote env server could not finish (it died, timed out, refused); the
    message names the server and its reason. The episode is replayed on a fresh session."""


@dataclass
class Server:
    url: str
    cap: int
    in_use: int = 0
    down: str | None = None  # why it is set aside; None while up
    schema: dict | None = None  # the server's /schema, read once
    probe: asyncio.Task[None] | None = field(default=None, repr=False)


class ServerPool:
    """The env servers of one tag's `base_urls` in one event loop (see the module doc)."""

    def __init__(self, urls: tuple[str, ...], cap: int) -> None:
        self.servers = [Server(url, cap) for url in urls]
        self._changed = asyncio.Condition()
        self._session: aiohttp.ClientSession | None = None
        self.users = 0  # envs that hold the pool; the last one to leave closes it

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # no pool limit of its own: the session caps bound the connections
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0))
        return self._session

    def describe(self) -> dict[str, str]:
        """Base URL -> "up, N/cap sessions" or "down: reason" (for messages)."""
        return {s.url: (f"down: {s.down}" if s.down else f"up, {s.in_use}/{s.cap} sessions")
                for s in self.servers}

    async def acquire(self, deadline_s: float) -> Server:
        """A session slot on a server that is up (least loaded first). Waits while every
        server that is up is full; `RemoteEnvError` once every server has been down for
        `deadline_s`."""
        loop = asyncio.get_running_loop()
        all_down_since: float | None = None
        async with self._changed:
            while True:
                up = [s for s in self.servers if s.down is None]
                free = [s for s in up if s.in_use < s.cap]
                if free:
                    server = min(free, key=lambda s: s.in_use)
                    server.in_use += 1
                    return server
                wait: float | None = None
                if not up:
                    now = loop.time()
                    all_down_since = now if all_down_since is None else all_down_since
                    wait = deadline_s - (now - all_down_since)
                    if wait <= 0:
                        reasons = "; ".join(f"{s.url}: {s.down}" for s in self.servers)
                        raise RemoteEnvError(f"no env server up for {deadline_s:g} s "
                                             f"({reasons})")
                else:
                    all_down_since = None
                try:
                    await within(self._changed.wait(), wait)
                except TimeoutError:
                    pass

    def release(self, server: Server) -> None:
        """Give a session slot back (sync: `env.close()` calls it)."""
        server.in_use -= 1
        self._notify()

    def failed(self, server: Server, reason: str) -> None:
        """`server` failed a session: set it aside (logged once) and probe it until it
        answers again."""
        if server.down is not None:
            return
        server.down = reason
        logger.warning("env server %s down: %s; its episodes are replayed on other servers, "
                       "and it is probed until it answers", server.url, reason)
        server.probe = asyncio.get_running_loop().create_task(self._probe(server))

    def came_back(self, server: Server) -> None:
        if server.down is None:
            return
        logger.warning("env server %s is back (it was down: %s)", server.url, server.down)
        server.down = None
        server.probe = None
        self._notify()

    async def _probe(self, server: Server) -> None:
        delay = PROBE_FIRST_S
        while server.down is not None:
            await asyncio.sleep(delay)
            try:
                async with self.session.get(
                        server.url + "/health",
                        timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as reply:
                    if reply.status == 200:
                        self.came_back(server)
                        return
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
            delay = min(delay * 2, PROBE_MAX_S)

    def _notify(self) -> None:
        """Wake the envs waiting for a slot (a task, since `release` is sync)."""
        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()
        try:
            asyncio.get_running_loop().create_task(wake())
        except RuntimeError:  # no loop running (an env closed at exit): nobody waits
            pass

    async def aclose(self) -> None:
        """Stop the probes and close the HTTP session, awaited (a loop about to end)."""
        for server in self.servers:
            if server.probe is not None:
                server.probe.cancel()
        if self._session is not None and not self._session.closed:
            await self._session.close()

    def close(self) -> None:
        """The last env left: stop the probes and close the HTTP session."""
        for server in self.servers:
            if server.probe is not None:
                server.probe.cancel()
        if self._session is not None and not self._session.closed:
            try:
                asyncio.get_running_loop().create_task(self._session.close())
            except RuntimeError:
                pass


# (event loop, base URLs) -> its pool: the envs of one producer share their servers' caps
_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                  dict[tuple[str, ...], ServerPool]] = weakref.WeakKeyDictionary()


def pool_for(urls: tuple[str, ...], cap: int) -> ServerPool:
    """The pool of `urls` in the running loop (made on first use)."""
    loop = asyncio.get_running_loop()
    pools = _POOLS.setdefault(loop, {})
    pool = pools.get(urls)
    if pool is None:
        pool = pools[urls] = ServerPool(urls, cap)
        logger.info("env servers %s: at most %d sessions each (env_config.max_sessions: "
                    "their max_concurrent_envs)", ", ".join(urls), cap)
    return pool


def drop_pool(pool: ServerPool) -> None:
    """An env that used `pool` is closed; the last one closes it."""
    pool.users -= 1
    if pool.users > 0:
        return
    pool.close()
    for pools in _POOLS.values():
        for urls, held in list(pools.items()):
            if held is pool:
                del pools[urls]
