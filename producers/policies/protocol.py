"""The protocol a policy follows, and what it is given: `StepContext` each step, `Turn` for a
model's reply, `PolicyContext` at start. The policies (`random`, `python`, `openai`) and
the producer import these from here; `producers.policies.make_policy` builds one from the
config.

The protocol (only `act` is required):

- `async act(observation, ctx) -> (action, response)`: `response` is None (no model text),
  the model's reply as a `str`, or a `Turn` (the reply with its token ids, logprobs and the
  weight version that generated it). With a response and a text env, the env parses the
  reply itself (`step_text`), so a malformed answer gets the env's format penalty.
- `act_now(observation, ctx)`: the same pair without an await, or None to fall back to
  `act`; a random or numpy policy then costs no coroutine per step.
- `async start(context)` (or `async start()`): once, before any episode (check servers,
  load a model); `context` is a `PolicyContext` (the run's Redis client, keys and config;
  `context.llm`, the model client of a python policy with `policy.llm`).
  Raise `PolicyError` to make the producer exit 1 with that one line.
- `async close()`: once, when the producer stops.

An awaited `act` can be cut short: when a pause (sync or operator), the episode's expiry or
a stop lands while it runs, the producer cancels it (an HTTP request in flight is closed, so
the server stops generating it) and, unless the episode is abandoned, calls `act` again for
the same turn once the pause is over. So `act` must leave `ctx.scratch` as it found it
unless it returns: no half turn. A turn that was not generated (the server aborted it)
raises `TurnAborted`: it is sent again the same way, through the same gate.

Weights by version, for a policy that learns through the stream (`producers/weights.py`):
- `set_weights(version, decoded)`: cheap, on the event loop, between steps; from then on the
  policy acts with the weights the trainer published for `version`
  (`Batcher.publish_version(weights=...)`, stored at `{RUN}:weights:VERSION`).
- `decode_weights(data: bytes) -> decoded`: optional, pure, may be slow: the producer runs it
  in a worker thread, off the event loop (without it, `set_weights` gets the bytes).
The producer fetches each version once (not once per env); a policy without `set_weights`
ignores weights (random, openai).

The version a step records is the `Turn`'s own `version` when the policy knows it (an
inference server reported it, or `{RUN}:servers` records what the server holds), else
`ctx.version`: the version the producer acts with, which for a policy with `set_weights` is
the version of the weights it holds (0: the factory's).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from schemas.config import RolloutConfig
from schemas.keys import Keys
from schemas.seeding import member_seed


@dataclass
class StepContext:
    """What a policy may look at besides the observation."""

    env: Any  # the gymnasium env (its action_space; `unwrapped.instruction` for text envs)
    seed: int  # the episode's env seed (shared by the group)
    version: int  # the policy version the producer acts with now
    mode: str
    group_id: int
    episode_id: int
    member: int
    tag: str
    turn: int = 0  # index of the action within the episode
    scratch: dict[str, Any] = field(default_factory=dict)  # the policy's per-episode state
    # what the env said with the observation: the reset's info, then each step's (ROLL's
    # `suffix`, `env_instruction`)
    info: dict[str, Any] = field(default_factory=dict, repr=False)
    # the episode's steps so far, as recorded (observation, action, reward, info, response):
    # what ROLL's step-wise env managers show as history
    steps: list[dict[str, Any]] = field(default_factory=list, repr=False)
    _rng: np.random.Generator | None = field(default=None, repr=False)

    @property
    def rng(self) -> np.random.Generator:
        """The member's own numpy generator for this episode (made on first use)."""
        if self._rng is None:
            self._rng = np.random.default_rng(member_seed(self.seed, self.member))
        return self._rng


@dataclass
class Turn:
    """A model's reply to one turn, with what a trainer needs to learn from it token by
    token: the prompt and response token ids as the server saw and produced them, the
    response logprobs, and the weight version that generated it."""

    text: str
    prompt_ids: Sequence[int] | None = None
    response_ids: Sequence[int] | None = None
    logprobs: Sequence[float] | None = None
    finish_reason: str | None = None
    server: str | None = None  # base URL of the server that answered
    latency_s: float | None = None
    version: int | None = None  # weight version that generated it, where known
    version_source: str | None = None  # how `version` is known: server, recorded, producer
    extra: dict[str, Any] = field(default_factory=dict)  # more step fields for the wire

    def wire_fields(self) -> dict[str, Any]:
        """The step's fields besides `response` and `version` (token arrays as numpy)."""
        out: dict[str, Any] = {}
        if self.prompt_ids is not None:
            out["prompt_ids"] = np.asarray(self.prompt_ids, dtype=np.int32)
        if self.response_ids is not None:
            out["response_ids"] = np.asarray(self.response_ids, dtype=np.int32)
        if self.logprobs is not None:
            out["logprobs"] = np.asarray(self.logprobs, dtype=np.float32)
        for name in ("finish_reason", "server", "latency_s", "version_source"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out.update(self.extra)
        return out

    def call_record(self) -> dict[str, Any]:
        """This reply as one of a step's earlier model calls (`model_calls`: an agent's
        calls, a turn's tool rounds), which a trainer expands before the step's own."""
        return {"response": self.text, "version": self.version, **self.wire_fields()}


@dataclass
class PolicyContext:
    """What `start(context)` gets: where the run lives and how it is set up."""

    redis: Any  # the producer's redis.asyncio client (shared: do not close it)
    keys: Keys  # the run's key names (`keys.servers`: the versions model servers hold)
    config: RolloutConfig  # the run's config (`config.ratio`: the staleness bound)
    producer_id: str
    poll_interval_s: float = 0.2  # how often the producer polls its control state
    # a python policy with `policy.llm`: its model client (`producers.policies.agent.LLM`:
    # `await llm.chat(messages, ctx)`, one model call through the producer's server pool,
    # recorded on the step token for token); None otherwise
    llm: Any = None


async def start_policy(policy: Any, context: PolicyContext) -> None:
    """Call the policy's `start(context)`, or `start()` when it takes no argument."""
    start = getattr(policy, "start", None)
    if start is None:
        return
    try:
        takes_context = bool(inspect.signature(start).parameters)
    except (TypeError, ValueError):  # a callable without a signature: try the protocol's
        takes_context = True
    await (start(context) if takes_context else start())


class Policy(Protocol):
    """See the module docstring: `act` is required, the rest optional."""

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, str | Turn | None]:
        ...


def one_line(exc: BaseException) -> str:
    """An exception as `Type: message` on one line (for a `PolicyError`)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
