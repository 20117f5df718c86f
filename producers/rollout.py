"""One env's rollout: play an episode with the policy and build its trajectory message.

`EnvSlot` is one env of a shard; `play_episode` runs one episode on it. Gating (pause, expiry,
val round) is a callback, so this module knows the episode and not the protocol around it.
`InFlight` holds the awaited policy calls, so a control change can cut them short.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from producers import metrics
from producers.control import ControlState
from producers.policies.protocol import Policy, StepContext, Turn
from schemas.codec import SCHEMA_VERSION, traj_ids
from schemas.errors import ContextFull, EpisodeFailed, PolicyError, TurnAborted
from schemas.seeding import episode_seed

logger = logging.getLogger(__name__)

_SCALARS = frozenset((bool, int, float, str))
ABORT_RETRY_S = 0.2  # a turn the server aborted (new weights loading) is sent again after this


@dataclass
class EnvSlot:
    """One env of a shard and where it stands: the next episode `k` (of val round `round`)."""

    mode: str
    env_id: int
    group_id: int
    member: int
    shard: int
    tag: str
    env: Any
    k: int = 0
    round: int = 0
    threaded: bool = False  # reset/step in a worker thread (an env that blocks)


async def in_daemon_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in a daemon thread of its own, awaited.

    For envs that block. Not an executor: a pool's threads are joined at interpreter exit, so
    a producer stopping while an env is stuck in a long step would hang until the step ends;
    a daemon thread is left behind and the step in flight is dropped, as a stop promises.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    def work() -> None:
        try:
            outcome = (True, fn(*args, **kwargs))
        except BaseException as exc:  # travels to the awaiting task with its traceback
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=work, daemon=True, name="env-step").start()
    return await future


class InFlight:
    """The awaited policy calls in flight, each with its test of whether it must stop now.

    `interrupt()` (the producer calls it on every control change) cuts short the calls whose
    test says so (a pause, the episode's expiry, a stop): the env's task is cancelled where
    the call awaits, so an HTTP request in flight is closed and the server stops generating
    it; the caller takes that cancellation back (`take_back`: `uncancel`) and sends the turn
    again after the gate. A cancellation from anyone else (a producer stopping) goes on as
    usual. No task and no timer per call (a dict entry per awaited call), and a policy that
    answers without an await (`act_now`) never gets here.
    """

    def __init__(self) -> None:
        self.calls: dict[asyncio.Task[Any], Callable[[], bool]] = {}
        self.interrupted = 0  # calls cut short so far
        self._cut: set[asyncio.Task[Any]] = set()  # cancelled by `interrupt`, not yet back

    def take_back(self, task: asyncio.Task[Any]) -> bool:
        """After a `CancelledError` in a call of `task`: True when `interrupt()` sent it and
        nobody else cancelled the task too (the call was cut short: carry on)."""
        if task not in self._cut:
            return False
        self._cut.discard(task)
        return task.uncancel() == 0

    def leave(self, task: asyncio.Task[Any]) -> None:
        """The call of `task` is over (however it ended)."""
        del self.calls[task]
        if task in self._cut:  # cut short, but the call swallowed it and returned
            self._cut.discard(task)
            task.uncancel()

    def interrupt(self) -> int:
        """Cut short every call in flight whose test says it must stop; returns how many."""
        hit = 0
        for task, must_stop in self.calls.items():
            if task not in self._cut and must_stop():
                self._cut.add(task)
                task.cancel("interrupted: the turn is sent again after the gate")
                hit += 1
        self.interrupted += hit
        return hit


class Abandoned(Exception):
    """The episode in flight was given up (expired, paused into a drain, stopped)."""


def _clean_info(info: dict[str, Any]) -> dict[str, Any]:
    """The scalar part of a step's info (what travels on the wire)."""
    for value in info.values():
        if type(value) not in _SCALARS:
            break
    else:  # the common case: all scalars, copied as is
        return info.copy()
    out = {}
    for key, value in info.items():
        if type(value) in _SCALARS:
            out[key] = value
        elif isinstance(value, np.generic):
            out[key] = value.item()
    return out


async def play_episode(slot: EnvSlot, **kwargs: Any) -> dict[str, Any]:
    """Play episode `slot.k` (see `_play`); the tokens of an episode that does not come back
    (abandoned, failed, stopped) are counted as discarded (`metrics.tokens_discarded`)."""
    steps: list[dict[str, Any]] = []
    try:
        return await _play(slot, steps, **kwargs)
    except BaseException as exc:
        tokens = generated_tokens(steps)
        if tokens:
            reason = ("abandoned" if isinstance(exc, Abandoned) else "stopped"
                      if isinstance(exc, asyncio.CancelledError) else "failed")
            metrics.tokens_discarded(slot.mode, reason, tokens)
        raise


def generated_tokens(steps: list[dict[str, Any]]) -> int:
    """The response tokens of these steps (those that carry ids), an agent's earlier calls
    (`model_calls`) included."""
    return sum(len(call["response_ids"]) for step in steps
               for call in (*step.get("model_calls", ()), step)
               if call.get("response_ids") is not None)


async def _play(
    slot: EnvSlot,
    steps: list[dict[str, Any]],
    *,
    seed: int,
    producer_id: str,
    policy: Policy,
    control: ControlState,
    gate: Callable[[], Awaitable[bool]],
    acting_version: Callable[[], int] | None = None,
    inflight: InFlight | None = None,
    must_stop: Callable[[], bool] | None = None,
    must_cut: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Play episode `slot.k` and return its trajectory message (not yet encoded).

    `gate()` runs before the first policy call and again whenever the control state has
    changed since (version, pause, val round, stop, a shard handover, new weights): it waits
    out a pause and returns False to abandon the episode. In between, a step costs one integer
    compare. Each step records `acting_version()` as read after the gate last passed (default
    the run's version; for a policy with weights, the version of the weights it holds).
    With `inflight`, an awaited `act` runs there and `must_stop()` says when a control change
    must cut it short (False: the gate would pass now, so it is not awaited); a turn cut
    short, or one the server aborted (`TurnAborted`), is sent again once the gate passes (or
    the episode is abandoned). `must_cut()` (default `must_stop`) is what `inflight` asks
    instead when it differs: a pause that keeps turns in flight (`producers.partial`).
    Env exceptions propagate; the caller retries with the same seed.
    """
    k = slot.k
    env, env_seed = slot.env, episode_seed(seed, slot.mode, slot.group_id, k)
    ctx = StepContext(env=env, seed=env_seed, version=0, mode=slot.mode,
                      group_id=slot.group_id, episode_id=k, member=slot.member, tag=slot.tag)
    act_now = getattr(policy, "act_now", None)  # a policy that needs no await per action
    clock = time.perf_counter
    env_step, threaded = env.step, slot.threaded  # looked up once, used every step
    areset = getattr(env.unwrapped, "areset", None)  # a remote env: reset/step are awaited
    slow = threaded or areset is not None
    append = steps.append
    started = clock()
    policy_s = score = 0.0
    terminated = truncated = False
    seen = -1  # the control generation the gate last passed
    context_full: str | None = None  # why the model could take no further turn
    version_of = acting_version or (lambda: control.version)

    if areset is not None:
        observation, info = await areset(seed=env_seed)
    elif threaded:
        observation, info = await in_daemon_thread(env.reset, seed=env_seed)
    else:
        observation, info = env.reset(seed=env_seed)
    ctx.info, ctx.steps = info, steps  # what a policy's prompt may show (its env manager's)
    while not (terminated or truncated):
        if control.generation != seen:
            seen = control.generation
            # `must_stop()` False is the gate's verdict "go on": no coroutine to learn it
            if (must_stop is None or must_stop()) and not await gate():
                raise Abandoned(f"episode {k} of env {slot.env_id}")
            ctx.version = version_of()
        ctx.turn = len(steps)
        t0 = clock()
        try:
            chosen = act_now(observation, ctx) if act_now is not None else None
            if chosen is None:
                chosen = await _act(policy, observation, ctx, inflight, must_cut or must_stop)
        except ContextFull as exc:  # the conversation outgrew the model: ends truncated
            if not steps:  # not even the first turn fits: nothing to train on
                raise EpisodeFailed(f"the first prompt does not fit the model's context "
                                    f"window ({exc}): lower max_tokens or shorten the "
                                    "prompt, or give the server a longer one") from None
            policy_s += clock() - t0
            truncated = True
            context_full = str(exc)
            break
        if chosen is None:  # cut short or aborted: the gate again, then the same turn
            policy_s += clock() - t0
            seen = -1
            continue
        action, response = chosen
        policy_s += clock() - t0
        if response is None and not slow:  # an action, no model text: the common step
            next_obs, reward, terminated, truncated, info = env_step(action)
        else:
            next_obs, reward, terminated, truncated, info = await _model_step(
                response, action, env, env_step, threaded)
        reward = float(reward)
        step = {"observation": observation, "action": action, "reward": reward,
                "version": ctx.version, "info": _clean_info(info)}
        if response is not None:
            _add_reply(step, response)
            if "resumed" in step or "version_spans" in step or "version_end" in step:
                _count_continued(step, slot.mode)
        append(step)
        score += reward
        observation = next_obs
        ctx.info = info

    wall_s = clock() - started
    traj = {
        **_identity(slot, k, env_seed, producer_id),
        # the oldest and newest weights that chose a step: a step's `version` is its oldest
        # token's (the staleness bound counts it), its newest in `version_spans`/`version_end`
        "version_start": min(map(_oldest, steps)) if steps else control.version,
        "version_end": max(map(_newest, steps)) if steps else control.version,
        "episode_score": score,
        "success": bool(info.get("success", False)),
        "terminated": bool(terminated),
        "truncated": bool(truncated),
        "num_actions": len(steps),
        "steps": steps,
        "final_observation": observation,
        "failed": False,
        "env_time_s": wall_s - policy_s,  # env, bookkeeping and waits in a pause
        "policy_time_s": policy_s,
        "wall_time_s": wall_s,
        "finished_at": time.time(),
    }
    if context_full is not None:
        traj["context_full"] = context_full
    return traj


async def _model_step(response: Any, action: Any, env: Any, env_step: Callable[[Any], Any],
                      threaded: bool) -> tuple[Any, ...]:
    """Step the env with a model's reply (a text env parses it: `step_text`) or the action;
    a remote env's step is awaited (`astep_text`, `astep`)."""
    text = response.text if isinstance(response, Turn) else response
    unwrapped = env.unwrapped
    if getattr(unwrapped, "areset", None) is not None:  # a remote env (producers/envs/remote)
        return await (unwrapped.astep_text(text) if text is not None
                      else unwrapped.astep(action))
    text_step = getattr(env.unwrapped, "step_text", None) if text is not None else None
    if text_step is not None:
        step_fn, arg = text_step, text
    else:
        step_fn, arg = env_step, action
    if threaded:
        return await in_daemon_thread(step_fn, arg)
    return step_fn(arg)


def _oldest(step: dict[str, Any]) -> int:
    """The version of a step's oldest token: its `version`, or an older span's, or an older
    call's (`model_calls`: an agent's earlier calls of the step)."""
    spans = step.get("version_spans")
    if spans:
        oldest = min(int(step["version"]), *(int(row[0]) for row in spans))
    else:
        oldest = int(step["version"])
    calls = step.get("model_calls")
    return min(oldest, *map(_oldest, calls)) if calls else oldest


def _newest(step: dict[str, Any]) -> int:
    """The version of a step's newest token: its last span's, or `version_end` (a turn
    updated mid-turn on a server that reports no spans), else its `version`; an earlier
    call's where newer."""
    spans = step.get("version_spans")
    if spans:
        newest = max(int(row[0]) for row in spans)
    else:
        newest = int(step.get("version_end", step["version"]))
    calls = step.get("model_calls")
    return max(newest, *map(_newest, calls)) if calls else newest


def _count_continued(step: dict[str, Any], mode: str) -> None:
    """Count a turn continued across a weight update: resumed (aborted and continued from
    its tokens), else kept (paused through it: its tokens span versions)."""
    if step.get("resumed"):
        metrics.turn_continued(mode, "resumed")
    elif _newest(step) != _oldest(step):
        metrics.turn_continued(mode, "kept")


def _add_reply(step: dict[str, Any], response: Any) -> None:
    """Add a model's reply to a step's record: its text, and for a `Turn` its token fields
    and the version that really generated it."""
    if not isinstance(response, Turn):
        step["response"] = response
        return
    if response.version is not None:
        step["version"] = response.version  # the weights that really generated it
    step["response"] = response.text
    step.update(response.wire_fields())


async def _act(policy: Policy, observation: Any, ctx: StepContext, inflight: InFlight | None,
               must_stop: Callable[[], bool] | None) -> tuple[Any, Any] | None:
    """The policy's `act`; None when it was cut short (registered in `inflight`, see there)
    or the server aborted the turn."""
    try:
        if inflight is None or must_stop is None:
            return _checked(policy, await policy.act(observation, ctx))
        task = asyncio.current_task()
        assert task is not None
        inflight.calls[task] = must_stop
        try:
            return _checked(policy, await policy.act(observation, ctx))
        except asyncio.CancelledError:
            if inflight.take_back(task):
                return None
            raise
        finally:
            inflight.leave(task)
    except TurnAborted as exc:
        if exc.tokens:  # what the server had sampled: sent again from the start
            metrics.tokens_discarded(ctx.mode, "aborted", exc.tokens)
        logger.debug("turn %d of episode %d (group %d, member %d) aborted (%s); sending it "
                     "again", ctx.turn, ctx.episode_id, ctx.group_id, ctx.member, exc)
        await asyncio.sleep(ABORT_RETRY_S)
        return None


def _checked(policy: Policy, chosen: Any) -> tuple[Any, Any]:
    """`act`'s answer if it is the `(action, response)` pair; else `PolicyError` naming what
    came back (a forgotten `return` gave None, which read as "cut short, ask again": the
    producer spun on it for ever)."""
    if isinstance(chosen, tuple | list) and len(chosen) == 2:
        return chosen[0], chosen[1]
    raise PolicyError(f"{type(policy).__name__}.act returned {chosen!r:.80}: it must return "
                      "(action, response), response None when there is no model text")


def _identity(slot: EnvSlot, k: int, env_seed: int, producer_id: str) -> dict[str, Any]:
    """The fields that say which episode of which env a message is."""
    group_key, traj_key = traj_ids(slot.mode, slot.group_id, k, slot.member)
    return {
        "schema": SCHEMA_VERSION,
        "traj_id": traj_key,
        "traj_group_id": group_key,
        "mode": slot.mode,
        "round": slot.round,
        "group_id": slot.group_id,
        "episode_id": k,
        "member": slot.member,
        "env_id": slot.env_id,
        "tag": slot.tag,
        "seed": env_seed,
        "producer": producer_id,
    }


def failed_trajectory(slot: EnvSlot, *, seed: int, producer_id: str, version: int,
                      error: str) -> dict[str, Any]:
    """The message a member commits when its env keeps raising: its group gets dropped."""
    env_seed = episode_seed(seed, slot.mode, slot.group_id, slot.k)
    return {
        **_identity(slot, slot.k, env_seed, producer_id),
        "version_start": version,
        "version_end": version,
        "episode_score": 0.0,
        "success": False,
        "terminated": False,
        "truncated": False,
        "num_actions": 0,
        "steps": [],
        "failed": True,
        "error": error,
        "env_time_s": 0.0,
        "policy_time_s": 0.0,
        "wall_time_s": 0.0,
        "finished_at": time.time(),
    }
