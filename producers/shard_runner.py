"""The shards a producer holds, run: every env of a shard is an asyncio task playing episodes.

An env's task loops: may its next episode start (train: admitted by the version and not
paused; val: the round asked for)? Play it (`producers.rollout.play_episode`), with the gate
before each policy call; retry an env that raised with the same seed, a bounded number of
times, then commit a failed trajectory; commit, and act on the commit's outcome. A shard
that is handed over (`draining`) finishes the episodes in flight and stops; one whose lease is
lost stops at once. The lease loop (`producers.lease_loop`) decides which shards; this module
runs them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from producers.commit import Committer, Outcome
from producers.control import ControlState
from producers.envs import build_env
from producers.leases import Leases, ShardId
from producers.metrics import ProducerStats
from producers.partial import InFlightRule
from producers.policies.protocol import Policy
from producers.rollout import Abandoned, EnvSlot, InFlight, failed_trajectory, play_episode
from producers.weights import WeightsFollower
from schemas.codec import encode_trajectory
from schemas.config import RolloutConfig
from schemas.errors import EpisodeFailed
from schemas.keys import Keys
from schemas.protocol import Schedule
from schemas.repeats import Repeats
from schemas.samples import Sampler, encode_sample, sample_of

logger = logging.getLogger(__name__)

REFUSALS = {Outcome.DUPLICATE: "duplicate", Outcome.LEASE_LOST: "lease_lost",
            Outcome.PAUSED: "paused", Outcome.STALE_ROUND: "stale_round"}


@dataclass
class ShardRun:
    """A shard this producer holds: its env slots and their tasks."""

    shard: ShardId
    slots: list[EnvSlot]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    draining: bool = False  # handing over: finish the episode in flight, then stop
    lease_lost: int = 0  # commits of its envs fenced off (logged at the first)


class ShardRunner:
    """Starts and drops the shards the lease loop gives it and runs their envs (see the
    module docstring). `shards` is what the producer holds now."""

    def __init__(self, *, config: RolloutConfig, keys: Keys, producer_id: str, policy: Policy,
                 state: ControlState, schedules: dict[str, Schedule],
                 weights: WeightsFollower | None, inflight: InFlight, committer: Committer,
                 leases: Leases, stats: ProducerStats, stop: asyncio.Event):
        self.config = config
        self.keys = keys
        self.producer_id = producer_id
        self.policy = policy
        self.state = state
        self.schedules = schedules
        self.weights = weights
        self.inflight = inflight  # awaited policy calls a pause, expiry or stop cuts short
        self.committer = committer
        self.leases = leases
        self.stats = stats
        self._stop = stop
        self.shards: dict[ShardId, ShardRun] = {}
        self._sampled = Sampler(config.sample_rate, config.seed)  # for the sample stream
        self._repeats = Repeats(logger)  # an env failing every episode: not a line each
        self._in_flight = InFlightRule(config)  # what a pause cuts short (partial rollouts)

    # -- shards ------------------------------------------------------------------------------
    async def start_shard(self, shard: ShardId) -> None:
        mode, index = shard
        manager = self.config.manager(mode)
        env_ids = list(manager.envs_of_shard(index))
        cursors, val_round = await self.leases.read_start(mode, env_ids)
        slots = []
        for env_id, cursor in zip(env_ids, cursors, strict=True):
            group = manager.group_of_env(env_id)
            tag = manager.tag_of_group(group)
            slots.append(EnvSlot(
                mode=mode, env_id=env_id, group_id=group, member=manager.member_of_env(env_id),
                shard=index, tag=tag, env=build_env(self.config, tag),
                threaded=self.config.env_spec(tag).threaded,
                k=cursor, round=val_round if mode == "val" else 0,
            ))
        self.stats.resumed[mode] += sum(1 for c in cursors if int(c or 0) > 0)
        run = ShardRun(shard, slots)
        self.shards[shard] = run
        run.tasks = [asyncio.create_task(self._env_loop(run, slot)) for slot in slots]
        logger.info("claimed shard %s (%d envs)", shard, len(slots))

    def drop_shard(self, shard: ShardId, *, cancel: bool) -> None:
        run = self.shards.pop(shard, None)
        if run is None:
            return
        if cancel:
            for task in run.tasks:
                task.cancel()
        for slot in run.slots:
            slot.env.close()

    def tasks(self) -> list[asyncio.Task[None]]:
        """The env tasks of every shard held."""
        return [task for run in self.shards.values() for task in run.tasks]

    def drop_all(self) -> list[ShardId]:
        """At shutdown, once the env tasks have ended: close every shard's envs; the shards
        they were (their leases are released next)."""
        held = list(self.shards)
        for shard in held:
            self.drop_shard(shard, cancel=False)
        return held

    # -- admission ---------------------------------------------------------------------------
    @property
    def _stopping(self) -> bool:
        return self._stop.is_set()

    def _leaving(self, run: ShardRun) -> bool:
        return self._stopping or run.draining or run.shard not in self.shards

    def _train_ready(self, slot: EnvSlot) -> bool:
        """May this train env start its next episode now? Moves it past expired episodes."""
        state = self.state
        version = state.version
        schedule = self.schedules["train"]
        slot.k = max(slot.k, schedule.first_live(version))
        return not state.paused and schedule.admitted(slot.k, version)

    def _val_ready(self, slot: EnvSlot) -> bool:
        """May this val env start its next episode now? A new round starts it at k = 0."""
        current = self.state.val_round
        if current != slot.round:
            slot.round, slot.k = current, 0
        return current != 0 and slot.k < self.schedules["val"].episodes_per_step

    async def _gate(self, run: ShardRun, slot: EnvSlot, k: int) -> bool:
        """Before each policy call: wait out a pause, and wait for weights new enough (sync:
        the run version's; async: the episode's step's); False to abandon."""
        state = self.state
        weights = self.weights
        while True:
            verdict = self._verdict(run, slot, k)
            if verdict is not None:
                return verdict
            if weights is not None and self._unweighted(slot, k):
                weights.holds += 1
            await state.wait_change()

    def _verdict(self, run: ShardRun, slot: EnvSlot, k: int) -> bool | None:
        """What the gate says now: True go on, False abandon the episode, None wait."""
        state = self.state
        unweighted = self._unweighted(slot, k)
        if self._leaving(run) and (state.paused or unweighted or self._stopping):
            return False  # the next owner replays the episode with the same seed
        if slot.mode == "val":
            if state.val_round != slot.round:
                return False
            return None if unweighted else True
        if self.schedules["train"].expired(k, state.version):
            return False
        return None if (state.paused or unweighted) else True

    def _unweighted(self, slot: EnvSlot, k: int) -> bool:
        """Must this step wait for newer weights? (Sync: the run version's; async: those of
        the step train episode `k` belongs to, so it is not handed out over-stale.)"""
        weights = self.weights
        if weights is None:
            return False
        floor = self.schedules["train"].create_step(k) if slot.mode == "train" else 0
        return weights.must_wait(self.state.version, floor)

    async def interrupt_loop(self) -> None:
        """On every control change, cut short the policy calls in flight whose gate would
        no longer pass (a pause, the episode's expiry, a stop): their HTTP requests close,
        so the model servers are idle while the trainer updates them. With
        `partial_rollout.in_flight: keep` a pause whose episodes live on lets them finish
        instead (`producers.partial`)."""
        state = self.state
        while not self._stopping:
            await state.wait_change()
            hit = self.inflight.interrupt()
            if hit:
                logger.debug("%d policy calls in flight cut short", hit)

    def _acting_version(self) -> int:
        """The version a step records: the weights' for a policy that takes weights."""
        return self.weights.version if self.weights is not None else self.state.version

    # -- env loops ---------------------------------------------------------------------------
    async def _env_loop(self, run: ShardRun, slot: EnvSlot) -> None:
        """One env's task: when its next episode may start, play it and commit it; again.

        One coroutine from play to commit: every trajectory's task is resumed once by its
        commit's outcome, and each frame between the task and that await costs on every
        resume (measured with py-spy: the frames of this chain were ~10% of a producer)."""
        ready = self._train_ready if slot.mode == "train" else self._val_ready
        play_args = self._play_args(run, slot)
        seed = self.config.seed
        in_flight = self.stats.in_flight
        mode = slot.mode
        state = self.state
        committer = self.committer
        stream = self.keys.stream(mode, slot.group_id)  # an env's group never changes
        sampled = self._sampled
        while not self._leaving(run):
            if not ready(slot):
                await state.wait_change()
                continue
            in_flight[mode] += 1
            try:
                k = slot.k
                try:  # the first attempt here, retries (an env that raised) in their own frame
                    traj: dict | None = await play_episode(slot, seed=seed, **play_args)
                except Abandoned:
                    traj = None
                except Exception as exc:  # not a cancellation: that is a BaseException
                    traj = await self._play_with_retries(run, slot, exc)
                if traj is None:
                    if self._give_up(run, slot, k):
                        continue
                    return
                data = encode_trajectory(traj)
                sample = self._sample(slot, traj) if sampled(mode, slot.group_id, k) else None
                # keep what the counters need and let the trajectory go while its objects are
                # still in cache (a commit waits for its flush; freeing them cold after it,
                # measured with py-spy, was ~4% of a producer)
                failed, success = traj.get("failed", False), traj["success"]
                actions = traj["num_actions"]
                if "context_full" in traj:
                    self._context_full(slot, traj)
                traj = None
                while True:
                    outcome = await committer.submit(mode, slot.shard, slot.round, slot.env_id,
                                                      k, stream, data, sample=sample)
                    if outcome is Outcome.COMMITTED:
                        self.stats.committed(mode, slot.tag, failed, success, actions)
                    else:
                        self.stats.refused_commit(mode, REFUSALS[outcome])
                    if outcome is Outcome.COMMITTED or outcome is Outcome.DUPLICATE:
                        slot.k = k + 1
                        break
                    if outcome is Outcome.LEASE_LOST:
                        run.lease_lost += 1
                        if run.lease_lost == 1:  # its every env finds it: one line a shard
                            logger.warning("shard %s: lease lost at commit; its envs stop",
                                           run.shard)
                        return
                    if outcome is Outcome.STALE_ROUND:
                        break
                    # PAUSED: hold the trajectory; after the pause commit it unless it expired
                    if not await self._gate(run, slot, k):
                        if self._give_up(run, slot, k):
                            break
                        return
            finally:
                in_flight[mode] -= 1
                # let the bytes go before the next episode: this frame lives as long as the
                # env (the trajectory itself went once encoded)
                data = b""
                sample = None

    def _sample(self, slot: EnvSlot, traj: dict[str, Any]) -> bytes:
        """The trajectory's sample for the sample stream (`schemas.samples`)."""
        names = getattr(getattr(slot.env, "unwrapped", None), "action_names", None)
        return encode_sample(sample_of(traj, run_version=self.state.version,
                                       action_names=names if isinstance(names, tuple | list)
                                       else None))

    def _context_full(self, slot: EnvSlot, traj: dict[str, Any]) -> None:
        """An episode the model's context window ended: counted; the first one is logged."""
        if self.stats.context_full(slot.mode, slot.tag) == 1:
            logger.warning(
                "producer %s: episode %d of env %d (%s) ended truncated after %d turns: the "
                "conversation outgrew the model's context window (%s); it is committed with "
                "its turns (context_full in the trajectory), and later ones are only counted "
                "(rollstream_episodes_context_full_total)", self.producer_id, traj["episode_id"],
                slot.env_id, slot.tag, traj["num_actions"], traj["context_full"])

    def _give_up(self, run: ShardRun, slot: EnvSlot, k: int) -> bool:
        """Episode `k` was abandoned. Staying: move past it (True). Leaving: keep the cursor,
        so the next owner replays it with the same seed (False ends the env task)."""
        if self._leaving(run):
            self.stats.abandoned_episode(slot.mode, slot.tag, "leaving")
            return False
        self.stats.abandoned_episode(slot.mode, slot.tag, "expired")
        slot.k = k + 1
        return True

    def _play_args(self, run: ShardRun, slot: EnvSlot) -> dict[str, Any]:
        """`play_episode`'s arguments besides the slot and the seed."""
        return {
            "producer_id": self.producer_id, "policy": self.policy, "control": self.state,
            "gate": lambda: self._gate(run, slot, slot.k),
            "acting_version": self._acting_version, "inflight": self.inflight,
            "must_stop": lambda: self._verdict(run, slot, slot.k) is not True,
            "must_cut": lambda: self._in_flight.must_cut(self._verdict(run, slot, slot.k),
                                                         self.state.paused),
        }

    async def _play_with_retries(self, run: ShardRun, slot: EnvSlot,
                                 first: Exception) -> dict | None:
        """After the first attempt at episode `slot.k` raised `first`: the retries, with the
        same seed; a failed trajectory once they are used up (None: abandoned)."""
        attempts = self.config.env_max_retries + 1
        exc = first
        for attempt in range(attempts):
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, EpisodeFailed):  # retrying cannot help (a model server's 4xx)
                self._repeats.warning(f"env {slot.env_id} ({slot.tag}) episode {slot.k} "
                                      f"failed: {error}")
                break
            # an env bug must not kill the producer
            self.stats.env_error(slot.mode, slot.tag, retried=attempt + 1 < attempts)
            self._repeats.warning(f"env {slot.env_id} ({slot.tag}) episode {slot.k} raised "
                                  f"on attempt {attempt + 1}/{attempts}: {error}")
            if attempt + 1 == attempts:
                break
            try:
                return await play_episode(
                    slot, seed=self.config.seed, **self._play_args(run, slot))
            except Abandoned:
                return None
            except Exception as raised:  # not a cancellation: that is a BaseException
                exc = raised
        return failed_trajectory(slot, seed=self.config.seed, producer_id=self.producer_id,
                                 version=self.state.version, error=error)
