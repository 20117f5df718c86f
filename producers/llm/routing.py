"""Sticky sessions: which server a session's requests go to.

A session is what shares a prompt prefix: the turns of one episode, and the members of its
group, which start from the same first prompt. Its key is `session_key(mode, group, episode)`
= `"{mode}:{group}:{episode}"`: `episode` is the group's episode counter `k`, the same for
every member of the group (a member's own index is not in the key), so all members of a
group's k-th episode and all their turns share one key, hence one server.

The server is chosen by rendezvous (highest-random-weight) hashing: each server scores
`blake2b(key, server URL)` and the session prefers the servers in falling score order. It
needs no ring or virtual nodes, the same key ranks the servers the same way in every
producer process, and a server set aside moves only the sessions that ranked it first (each
to its own next choice); when it comes back they return to it.

Overload bound (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam
2018): a server takes a session's request only while its requests in flight, counting this
one, stay within `ceil(load_factor * (in flight on the candidates + 1) / candidates)`;
otherwise the request goes to the session's next server in rank order that is within the
bound (one always is: they cannot all be above the mean). The default `load_factor` is 2 (the
paper's example is 1.25): a group's members arrive together and a few dozen sessions hash
unevenly over 4 servers, so 1.25 moved 3.5% of sticky requests off their server in
`bench/bench_sticky.py` (16 groups of 4) and 2 moved 0.2% (docs/decisions/llm.md); either
way no server carries more than that factor times the mean while others idle.

`route` returns the server and the outcome counted in `/metrics` and `rollstream status`:
`preferred` (the session's first-ranked server among all of the pool's), `down` (that one
is set aside or lacks the required weights), `overloaded` (over the bound).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

LOAD_FACTOR = 2.0  # a server takes a session while in flight <= ceil(2 x the mean)
SESSION_HEADER = "X-Session-ID"  # what routers read (vLLM's router, SGLang's router, ...)
PREFERRED, DOWN, OVERLOADED = "preferred", "down", "overloaded"


class Routable(Protocol):
    base_url: str
    inflight: int


R = TypeVar("R", bound=Routable)


def session_key(mode: str, group: int, episode: int) -> str:
    """The session of a group's episode (every member, every turn): `mode:group:episode`."""
    return f"{mode}:{group}:{episode}"


def score(key: str, base_url: str) -> int:
    """The rendezvous weight of `base_url` for `key` (stable across processes)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8, key=base_url.encode()[:64]).digest()
    return int.from_bytes(digest, "little")


def ranked(key: str, servers: Sequence[R]) -> list[R]:
    """The servers in the session's order of preference (highest weight first)."""
    return sorted(servers, key=lambda s: score(key, s.base_url), reverse=True)


def bound(candidates: Sequence[Routable], load_factor: float) -> int:
    """The most requests in flight a candidate may hold after taking this one."""
    total = sum(s.inflight for s in candidates) + 1
    return max(1, math.ceil(load_factor * total / len(candidates)))


def route(key: str, candidates: Sequence[R], every: Sequence[R],
          load_factor: float = LOAD_FACTOR) -> tuple[R, str]:
    """The server for a request of session `key` among `candidates` (the usable up servers:
    some of `every`, not none), and its outcome against the session's first choice among
    `every` server."""
    every_order = ranked(key, every)  # hashed once: the candidates keep this order
    first = every_order[0]
    limit = bound(candidates, load_factor)
    ids = {id(s) for s in candidates}
    order = [s for s in every_order if id(s) in ids]
    chosen = next((s for s in order if s.inflight + 1 <= limit), order[0])
    if chosen is first:
        return chosen, PREFERRED
    return chosen, (OVERLOADED if first in candidates else DOWN)


def outcome(key: str, chosen: Routable, every: Sequence[Routable]) -> str:
    """The outcome of a request sent to `chosen` outside `route` (a down server's probe)."""
    return PREFERRED if ranked(key, every)[0] is chosen else DOWN
