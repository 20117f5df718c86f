"""A loopback TCP proxy in front of the test Redis, to make network situations happen on cue.

Point any client that takes a Redis URL (a producer thread or process, a Batcher's client)
at `proxy.url` instead of the server's URL; bytes flow both ways unchanged until a test says
otherwise:

    proxy = RedisProxy(redis_url).start()   # listens on 127.0.0.1:<free port>
    producer = Producer(proxy.url, run)
    proxy.hold(b"{run}:traj:train:")        # arm: hold the next request carrying these bytes
    assert proxy.held.wait(10)              # evidence: such a request is held, unsent
    proxy.release()                         # send it on; the connection flows again
    assert proxy.replied.wait(10)           # Redis has answered the released request
    proxy.lose_reply(then_hold=marker)      # or: send it on, swallow the answer, cut the
                                            # line (and hold the resend)
    proxy.drop()                            # or: cut every connection; held bytes are lost
    proxy.close()                           # also a context manager

`hold(marker)` is one-shot: the first connection whose client-to-server bytes contain
`marker` (also across reads) stops forwarding from the read that completes it; that read and
everything after it on that connection wait in the proxy (Redis cannot run a command before
its last byte arrives, so the request is held whole). Other connections keep flowing, so a
client's other pooled connections (heartbeats, pub/sub) are untouched. A client that dies
while held (SIGKILL) closes its socket; the held bytes are then discarded, never sent.
Markers are plain bytes of the RESP request: a key name, a command name (b"EVALSHA"), or a
string inside a msgpack payload (b"train-0-2-").

`drop()` closes every open connection at once (clients see a connection error);
`lose_reply()` is the "lost reply": Redis receives and runs the held request, its reply is
read and thrown away, and then the connection is closed, so the client cannot know whether
its request ran. New connections are accepted as before after either.

Upstream URLs: `redis://[user:pass@]host:port/db` (TCP) and `unix://[user:pass@]/path?db=N`
(the suite's embedded server); the proxy's own URL is `redis://` on loopback with the same
credentials and database. TLS (`rediss://`) is not supported.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import parse_qs, urlsplit

_CHUNK = 65536


class _Link:
    """One client connection and its upstream connection, with a thread each way."""

    def __init__(self, proxy: RedisProxy, client: socket.socket, upstream: socket.socket):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.tail = b""  # the last bytes sent on, so a marker split across reads is found
        self.holding = False
        self.buffer: list[bytes] = []  # held client-to-server bytes
        self.awaiting_reply = False  # released: the next server bytes answer the held request
        self.swallow = False  # lose_reply: read the server's answer and throw it away
        self.swallowed = threading.Event()
        self.closed = False

    def start(self) -> None:
        for target, name in ((self._client_to_server, "c2s"), (self._server_to_client, "s2c")):
            threading.Thread(target=target, name=f"proxy-{name}", daemon=True).start()

    def _client_to_server(self) -> None:
        proxy = self.proxy
        while True:
            try:
                data = self.client.recv(_CHUNK)
            except OSError:
                data = b""
            if not data:
                self.close()  # held bytes die with the client: they never reach Redis
                return
            with proxy.lock:
                if not self.holding and proxy.marker is not None:
                    window = self.tail + data
                    if proxy.marker in window:
                        self.holding = True
                        proxy.marker = None
                        proxy.held_link = self
                        proxy.held.set()
                    else:
                        self.tail = window[-len(proxy.marker):]
                if self.holding:
                    self.buffer.append(data)
                    continue
                if not self._send(self.upstream, data):
                    return

    def _server_to_client(self) -> None:
        proxy = self.proxy
        while True:
            try:
                data = self.upstream.recv(_CHUNK)
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            with proxy.lock:
                if self.awaiting_reply:
                    self.awaiting_reply = False
                    proxy.replied.set()
                if self.swallow:
                    self.swallowed.set()
                    continue
                if not self._send(self.client, data):
                    return

    def flush_held(self) -> None:
        """Send the held bytes on and stop holding (call with the proxy's lock held)."""
        data = b"".join(self.buffer)
        self.buffer.clear()
        self.holding = False
        self.awaiting_reply = bool(data)
        if data:
            self._send(self.upstream, data)

    def _send(self, sock: socket.socket, data: bytes) -> bool:
        try:
            sock.sendall(data)
            return True
        except OSError:
            self.close()
            return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.buffer.clear()
        for sock in (self.client, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        with self.proxy.links_lock:
            self.proxy.links.discard(self)


class RedisProxy:
    """A threaded loopback proxy in front of the Redis at `upstream_url` (see the module doc)."""

    def __init__(self, upstream_url: str):
        parts = urlsplit(upstream_url)
        userinfo = parts.netloc.rpartition("@")[0]
        self._auth = f"{userinfo}@" if userinfo else ""
        if parts.scheme == "unix":
            self._family, self._address = socket.AF_UNIX, parts.path
            self._db = parse_qs(parts.query).get("db", ["0"])[0]
        elif parts.scheme == "redis":
            self._family = socket.AF_INET
            self._address = (parts.hostname or "127.0.0.1", parts.port or 6379)
            self._db = parts.path.lstrip("/") or "0"
        else:
            raise ValueError(f"RedisProxy: unsupported Redis URL scheme {parts.scheme!r}")
        self.lock = threading.Lock()  # guards the hold state and the order of forwarded bytes
        self.links_lock = threading.Lock()
        self.links: set[_Link] = set()
        self.marker: bytes | None = None  # armed hold
        self.held_link: _Link | None = None
        self.held = threading.Event()  # a request is held
        self.replied = threading.Event()  # Redis answered the last released request
        self.accepted = 0  # client connections accepted so far
        self._server: socket.socket | None = None
        self.url = ""

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> RedisProxy:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        self._server = server
        self.url = f"redis://{self._auth}127.0.0.1:{server.getsockname()[1]}/{self._db}"
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop listening and cut every connection."""
        if self._server is not None:
            try:
                self._server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._server.close()
            self._server = None
        self.drop()

    def __enter__(self) -> RedisProxy:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while self._server is not None:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.socket(self._family, socket.SOCK_STREAM)
                upstream.connect(self._address)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                if self._family == socket.AF_INET or sock is client:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, upstream)
            with self.links_lock:
                self.links.add(link)
                self.accepted += 1
            link.start()

    # -- controls ---------------------------------------------------------------------------
    def hold(self, marker: bytes) -> None:
        """Arm: hold the next request (on any connection) whose bytes contain `marker`."""
        if not marker:
            raise ValueError("hold needs a non-empty marker")
        with self.lock:
            self.held.clear()
            self.replied.clear()
            self.held_link = None
            self.marker = marker

    def release(self) -> None:
        """Send the held request on; `replied` is set when Redis answers it."""
        with self.lock:
            self.marker = None
            link, self.held_link = self.held_link, None
            if link is not None and not link.closed:
                link.flush_held()

    def lose_reply(self, timeout_s: float = 10.0, *, then_hold: bytes | None = None) -> None:
        """Send the held request on, wait for Redis's answer, throw it away, cut the line.

        `then_hold` arms the next hold before the line is cut, so a client that resends at
        once cannot slip past it."""
        with self.lock:
            self.marker = None
            link, self.held_link = self.held_link, None
            if link is None or link.closed:
                raise RuntimeError("lose_reply: no request is held")
            link.swallow = True
            link.flush_held()
        if not link.swallowed.wait(timeout_s):
            raise TimeoutError(f"lose_reply: Redis did not answer within {timeout_s}s")
        if then_hold is not None:
            self.hold(then_hold)
        link.close()

    def drop(self) -> None:
        """Cut every open connection now; held bytes are discarded."""
        with self.lock:
            self.marker = None
            self.held_link = None
        with self.links_lock:
            links = list(self.links)
        for link in links:
            link.close()

    @property
    def connections(self) -> int:
        """Client connections open now."""
        with self.links_lock:
            return len(self.links)
