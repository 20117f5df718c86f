"""The test proxy itself (tests/proxy.py): pass-through, hold/release, lost reply, drop."""

from __future__ import annotations

import socket
import uuid

import pytest
from proxy import RedisProxy


def command(*parts: str) -> bytes:
    """One RESP request."""
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def connect(proxy: RedisProxy) -> socket.socket:
    port = int(proxy.url.rsplit(":", 1)[1].split("/")[0])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


@pytest.fixture
def key(r):
    name = f"proxy-test-{uuid.uuid4().hex[:8]}"
    yield name
    r.delete(name)


def test_bytes_pass_through_both_ways(redis_url, r, key):
    with RedisProxy(redis_url) as proxy:
        sock = connect(proxy)
        sock.sendall(command("SET", key, "v"))
        assert sock.recv(100) == b"+OK\r\n"
        assert r.get(key) == b"v"
        assert proxy.accepted == 1 and proxy.connections == 1


def test_a_held_request_reaches_redis_only_when_released(redis_url, r, key):
    with RedisProxy(redis_url) as proxy:
        sock = connect(proxy)
        proxy.hold(key.encode())
        sock.sendall(command("INCR", key))
        assert proxy.held.wait(10)
        other = connect(proxy)  # other connections keep flowing meanwhile
        other.sendall(command("PING"))
        assert other.recv(100) == b"+PONG\r\n"
        assert r.get(key) is None
        proxy.release()
        assert proxy.replied.wait(10)
        assert sock.recv(100) == b":1\r\n"
        assert r.get(key) == b"1"


def test_lost_reply_runs_the_request_and_cuts_the_line(redis_url, r, key):
    with RedisProxy(redis_url) as proxy:
        sock = connect(proxy)
        proxy.hold(b"INCR")
        sock.sendall(command("INCR", key))
        assert proxy.held.wait(10)
        proxy.lose_reply(then_hold=b"INCR")
        assert sock.recv(100) == b""  # closed, with no answer
        assert r.get(key) == b"1"  # but it ran
        again = connect(proxy)  # new connections are accepted as before
        again.sendall(command("INCR", key))  # the resend is held
        assert proxy.held.wait(10)
        assert r.get(key) == b"1"
        proxy.release()
        assert again.recv(100) == b":2\r\n"


def test_drop_discards_the_held_request(redis_url, r, key):
    with RedisProxy(redis_url) as proxy:
        sock = connect(proxy)
        proxy.hold(key.encode())
        sock.sendall(command("INCR", key))
        assert proxy.held.wait(10)
        proxy.drop()
        assert sock.recv(100) == b""
        assert r.get(key) is None
        assert proxy.connections == 0


def test_a_marker_split_across_reads_is_found(redis_url, r, key):
    with RedisProxy(redis_url) as proxy:
        sock = connect(proxy)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        proxy.hold(key.encode())
        request = command("INCR", key)
        cut = request.index(key.encode()) + 3
        sock.sendall(request[:cut])
        assert not proxy.held.wait(0.2)  # hold fires only once the marker is complete
        sock.sendall(request[cut:])
        assert proxy.held.wait(10)
        assert r.get(key) is None
        proxy.release()
        assert sock.recv(100) == b":1\r\n"


def test_urls_keep_credentials_and_database():
    with RedisProxy("unix:///tmp/none.sock?db=3") as proxy:
        assert proxy.url.startswith("redis://127.0.0.1:") and proxy.url.endswith("/3")
    with RedisProxy("redis://:secret@127.0.0.1:6390/2") as proxy:
        assert proxy.url.startswith("redis://:secret@127.0.0.1:") and proxy.url.endswith("/2")
    with pytest.raises(ValueError, match="rediss"):
        RedisProxy("rediss://127.0.0.1:6379/0")
