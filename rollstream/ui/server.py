"""The web server of `rollstream ui`: a static page and a read-only JSON API (aiohttp).

    GET /                        the page (rollstream/ui/static/: HTML, JS, CSS; no build step)
    GET /api/state               the run: status snapshot, config summary, history, samples
    GET /api/groups?tag=&outcome=&mode=&limit=
                                 the sampled group episodes, newest first (outcome: all,
                                 success, failed, context_full, stale)
    GET /api/trajectory/UID      one sampled trajectory, turn by turn

One reader refreshes the run every `interval_s` (`RunView.refresh`, in a worker thread: the
status snapshot uses the blocking Redis client); requests are answered from what it read.
Only GET is routed. Bound to loopback, the server answers only requests that name a
loopback host (a web page elsewhere cannot read it through DNS rebinding).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import web

from rollstream.ui.feed import OUTCOMES
from rollstream.ui.view import RunView
from schemas.errors import ConfigError

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # the page's own script and style only: no inline script, nothing fetched elsewhere
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
}
MAX_LIMIT = 500
SHUTDOWN_S = 2.0  # at a stop, answers in flight get this long (each is a read from memory)
_dumps = partial(json.dumps, separators=(",", ":"), allow_nan=False)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; `ConfigError` naming what is wrong (a port in use,
    an address that is not this machine's)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"--host {host}: not an address to listen on ({exc})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--port {port}: cannot listen on {host}:{port} "
                          f"({exc.strerror or exc})") from None
    sock.setblocking(False)
    return sock


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address (`127.0.0.1`, `::1`, `[::1]`); a name that merely
    starts with 127 (`127.attacker.example`) is not."""
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def make_app(view: RunView, *, loopback_only: bool) -> web.Application:
    """The aiohttp application over `view` (no Redis reads of its own)."""
    app = web.Application(middlewares=[_guard(loopback_only)])
    app.router.add_get("/", _index)
    app.router.add_get("/api/state", partial(_state, view))
    app.router.add_get("/api/groups", partial(_groups, view))
    app.router.add_get("/api/trajectory/{uid}", partial(_trajectory, view))
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
    return app


def _guard(loopback_only: bool) -> Any:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if loopback_only and not is_loopback(_host_name(request.host)):
            return web.json_response({"error": "this server answers loopback hosts only"},
                                     status=403, headers=HEADERS)
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # a 404 or 405 of the router: the same headers
            exc.headers.update(HEADERS)
            raise
        response.headers.update(HEADERS)
        return response
    return guard


def _host_name(host: str) -> str:
    """The Host header without its port (`[::1]:8360` -> `[::1]`)."""
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def _index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html")


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=_dumps)


async def _state(view: RunView, request: web.Request) -> web.Response:
    return _json(view.state)


async def _groups(view: RunView, request: web.Request) -> web.Response:
    query = request.query
    outcome = query.get("outcome") or "all"
    if outcome not in OUTCOMES:
        return _json({"error": f"outcome {outcome!r}: one of {', '.join(OUTCOMES)}"}, 400)
    try:
        limit = int(query.get("limit") or 100)
    except ValueError:
        return _json({"error": f"limit {query.get('limit')!r}: not an integer"}, 400)
    limit = max(1, min(limit, MAX_LIMIT))
    return _json(view.groups(tag=query.get("tag") or None, outcome=outcome,
                             mode=query.get("mode") or None, limit=limit))


async def _trajectory(view: RunView, request: web.Request) -> web.Response:
    uid = request.match_info["uid"]
    found = view.trajectory(uid)
    if found is None:
        return _json({"error": f"no sampled trajectory {uid!r} here (the page keeps the "
                               f"newest {view.feed.keep})"}, 404)
    return _json(found)


class UiServer:
    """`rollstream ui`'s server: `run()` serves until SIGINT (exit 130) or SIGTERM (0);
    `request_stop()` ends it from elsewhere."""

    def __init__(self, view: RunView, sock: socket.socket, *, interval_s: float = 1.0,
                 handle_signals: bool = True):
        self.view = view
        self.sock = sock
        self.interval_s = interval_s
        self.handle_signals = handle_signals
        host, port = sock.getsockname()[:2]
        self.loopback_only = is_loopback(host)
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task[Any] | None = None
        self._code = 0
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ui-refresh")

    def run(self) -> int:
        try:
            asyncio.run(self._main())
        except asyncio.CancelledError:  # a second signal cut the shutdown short
            pass
        finally:
            self.close()
        return self._code

    def request_stop(self, code: int = 0) -> None:
        loop = self._loop
        if loop is not None and self._stop is not None and not loop.is_closed():
            self._code = code
            loop.call_soon_threadsafe(self._stop.set)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.sock.close()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._main_task = asyncio.current_task()
        if self.handle_signals:
            self._loop.add_signal_handler(signal.SIGINT, self._on_signal, 130)
            self._loop.add_signal_handler(signal.SIGTERM, self._on_signal, 0)
        runner = web.AppRunner(make_app(self.view, loopback_only=self.loopback_only),
                               access_log=None, handle_signals=False,
                               shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        refresher = asyncio.create_task(self._refresh_loop())
        try:
            await web.SockSite(runner, self.sock).start()
            await self._stop.wait()
        finally:
            refresher.cancel()
            await runner.cleanup()

    def _on_signal(self, code: int) -> None:
        assert self._stop is not None
        if self._stop.is_set() and self._main_task is not None:  # a second one: go now
            self._main_task.cancel()
            return
        self._code = code
        self._stop.set()

    async def _refresh_loop(self) -> None:
        assert self._loop is not None and self._stop is not None
        while not self._stop.is_set():
            await self._loop.run_in_executor(self._executor, self.view.refresh)
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass
