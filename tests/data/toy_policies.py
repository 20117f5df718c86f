"""Policies for the python-policy and weights tests (loaded by entrypoint, or imported).

`WeightedPolicy` acts as its weights say: the action is `weights["action"]`, so a test can
read from each step which weights chose it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from schemas.codec import pack, unpack


def weights_for(action: int) -> bytes:
    """The msgpack weights of a `WeightedPolicy` that always takes `action`."""
    return pack({"action": action})


class WeightedPolicy:
    def __init__(self, action: int = 0):
        self.action = action  # version 0: the factory's
        self.acts = 0
        self.decoded: list[int] = []  # actions decoded, in order (one per fetch)
        self.decode_threads: set[int] = set()
        self.set_threads: set[int] = set()
        self.hold: threading.Event | None = None  # decode blocks until set (sync test)
        self.decoding = threading.Event()  # a decode has started

    def decode_weights(self, data: bytes) -> int:
        self.decode_threads.add(threading.get_ident())
        self.decoding.set()
        if self.hold is not None:
            assert self.hold.wait(30), "the test never released the decode"
        action = int(unpack(data)["action"])
        self.decoded.append(action)
        return action

    def set_weights(self, version: int, decoded: int) -> None:
        self.set_threads.add(threading.get_ident())
        self.action = decoded

    def act_now(self, observation: Any, ctx: Any) -> tuple[int, None]:
        self.acts += 1
        return self.action, None

    async def act(self, observation: Any, ctx: Any) -> tuple[int, None]:
        return self.act_now(observation, ctx)


class BadWeightsPolicy(WeightedPolicy):
    def decode_weights(self, data: bytes) -> int:
        raise ValueError("these are not my weights")


def make_weighted(action: int = 0) -> WeightedPolicy:
    return WeightedPolicy(action)


def make_raising() -> WeightedPolicy:
    raise RuntimeError("no model file here,\nlook elsewhere")


def make_actless() -> object:
    return object()


NOT_A_FACTORY = 3


class ForgetfulPolicy:
    """`act` without its `return` (None), or with the action alone (`bare`)."""

    def __init__(self, bare: bool = False):
        self.bare = bare

    async def act(self, observation: Any, ctx: Any) -> Any:
        if self.bare:
            return 1


def make_forgetful(bare: bool = False) -> ForgetfulPolicy:
    return ForgetfulPolicy(bare)


class StallingPolicy:
    """Blocks the event loop in its first `act` for `block_s` (a `time.sleep`, as a
    synchronous HTTP client would), then acts at once."""

    def __init__(self, block_s: float = 1.0):
        self.block_s = block_s
        self.blocked = threading.Event()

    async def act(self, observation: Any, ctx: Any) -> tuple[int, None]:
        if not self.blocked.is_set():
            self.blocked.set()
            time.sleep(self.block_s)
        return 1, None


def make_stalling(block_s: float = 1.0) -> StallingPolicy:
    return StallingPolicy(block_s)
