"""Assembly: reading trajectory entries into groups.

One XREADGROUP over a mode's streams (finite BLOCK, stream order rotated for fairness), and
each entry decoded, checked against the stream it sits in, and placed into its group (round,
episode, group id). What cannot be handed out is dropped at once (acked and deleted) and
counted: an episode already expired or whose weights are too stale, a val round that is
over, a late copy (the group was handed out or dropped, or `group_size` finishers won), a
group with a member failed past its redundancy; an entry that does not decode goes to the
dead letters. A complete group goes into its mode's ready heap, oldest episode first (a
batch recorded in flight before a restart before anything). Held groups expire as the
version moves. At hand-out the groups at the front of the heap are judged by the mode's group
filters (consumer/filters.py), once each: a filtered group is dropped and counted, and the
next complete group takes its place. And, for get_batch's wait: how many groups can still
complete, and whether nothing more can reach this batcher before the version moves.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import Any

from consumer.batch import Entry
from consumer.filters import FILTERED, REASON_COUNTERS, build_group_filters
from consumer.liveness import Heartbeat
from consumer.state import TOKENS_DISCARDED, BatcherState, GroupKey, GroupSlot, ModeState
from consumer.writes import Writer
from schemas.codec import ENTRY_FIELD, decode_trajectory
from schemas.config import RolloutConfig
from schemas.errors import DecodeError
from schemas.keys import CONSUMER_GROUP, Keys
from schemas.redisconn import transaction
from schemas.repeats import Repeats

logger = logging.getLogger(__name__)

LOOK_EVERY_S = 1.0  # a waiting train get_batch looks this often whether more can come


class Assembly:
    """Reads the streams of batcher `consumer` (one of `count`) into its modes' groups."""

    def __init__(self, redis: Any, keys: Keys, config: RolloutConfig, shared: BatcherState, *,
                 count: int, read_count: int, alive: Heartbeat, writer: Writer):
        self.redis = redis
        self.keys = keys
        self.config = config
        self._shared = shared
        self.consumer = shared.consumer
        self.count = count
        self.read_count = read_count
        self._alive = alive
        self._writer = writer
        self._repeats = Repeats(logger)  # a group failing every episode: not a line each
        self._stream_names = {(mode, g): keys.stream(mode, g) for mode in config.modes()
                              for g in range(config.manager(mode).num_env_groups)}
        self.filters = build_group_filters(config)  # ConfigError: a class that cannot be built

    # -- reading and placing -----------------------------------------------------------------
    def read(self, state: ModeState, block_ms: int | None) -> None:
        """One XREADGROUP over the mode's streams (rotated); `block_ms` None: do not block."""
        self._alive.guard()  # not into the name's pending entries once another holds it
        streams = state.streams
        state.rotate = (state.rotate + 1) % len(streams)
        order = streams[state.rotate:] + streams[: state.rotate]
        reply = self.redis.xreadgroup(CONSUMER_GROUP, self.consumer, {s: ">" for s in order},
                                      count=self.read_count, block=block_ms)
        for stream, messages in _iter_reply(reply):
            self.assemble(state, stream, messages, set())

    def read_pending(self, state: ModeState, inflight: set[Entry]) -> None:
        """Read this consumer's own pending entries again (after a restart: read, never
        acked); those in `inflight` (the batch recorded as handed out) go first."""
        cursors: dict[Any, Any] = {stream: "0" for stream in state.streams}
        while cursors:
            reply = self.redis.xreadgroup(CONSUMER_GROUP, self.consumer, cursors,
                                          count=self.read_count)
            nxt: dict[str, str] = {}
            for stream, messages in _iter_reply(reply):
                if messages:
                    nxt[stream] = messages[-1][0]
                    self.assemble(state, stream, messages, inflight)
            cursors = nxt

    def assemble(self, state: ModeState, stream: str, messages: list[Any],
                 inflight: set[Entry]) -> None:
        """Sort entries into groups; drop what is stale, late, duplicated or undecodable."""
        drop: list[Entry] = []
        dead: list[tuple[Entry, bytes, str]] = []
        for entry_id, fields in messages:
            entry = Entry(stream, _text(entry_id))
            data = (fields or {}).get(ENTRY_FIELD)
            if data is None:
                drop.append(entry)  # deleted while pending, or not ours: nothing to deliver
                continue
            try:
                msg = decode_trajectory(data)
                self._check_entry(state, stream, msg)
            except DecodeError as exc:
                dead.append((entry, data, str(exc)))
                continue
            drop.extend(self._place(state, entry, msg, entry in inflight))
        if dead:
            self._writer.dead_letter(dead)
            self._shared.totals["scheduler/dead_lettered"] += len(dead)
            self._shared.stats.count(state.mode, "scheduler/dead_lettered", len(dead))
        if drop:
            self._writer.drop_entries(drop)

    def _check_entry(self, state: ModeState, stream: str, msg: dict[str, Any]) -> None:
        where = (msg["mode"], msg["group_id"])
        expected = self._stream_names.get(where) or self.keys.stream(*where)
        if expected != stream:
            raise DecodeError(f"entry says mode {msg['mode']} group {msg['group_id']} but sits "
                              f"in {stream}")
        if not 0 <= msg["member"] < state.members:
            raise DecodeError(f"member {msg['member']} out of range [0, {state.members})")

    def _place(self, state: ModeState, entry: Entry, msg: dict[str, Any],
               priority: bool) -> list[Entry]:
        """Add one trajectory to its group; returns entries to drop at once."""
        if entry in state.held or entry in state.handed:
            return []  # read again from the pending list: already ours
        g, k, rnd = msg["group_id"], msg["episode_id"], int(msg.get("round", 0))
        if state.mode == "val" and rnd != state.round:
            self._shared.count(state, "scheduler/val_discarded")
            self._discarded(state, "val_discarded", [msg])
            return [entry]
        if state.mode == "train" and self._is_stale(state, k, msg["version_start"]):
            self._shared.count(state, "scheduler/stale_dropped")
            self._discarded(state, "stale", [msg])
            return [entry]
        if (rnd, k) in state.finished[g]:
            self._shared.count(state, "scheduler/late_dropped")
            self._discarded(state, "late", [msg])
            return [entry]
        key = (rnd, k, g)
        slot = state.groups.get(key)
        if slot is None:
            state.seq += 1
            slot = state.groups[key] = GroupSlot(key, state.seq)
        slot.priority = slot.priority or priority
        if len(slot.members) >= state.group_size or msg["member"] in slot.members:
            self._shared.count(state, "scheduler/late_dropped")
            self._discarded(state, "late", [msg])
            return [entry]  # redundancy: the first group_size finishers won; or a duplicate
        state.held.add(entry)
        if msg.get("failed"):
            slot.failed.append(entry)
            if state.members - len(slot.failed) < state.group_size:
                state.finish(slot)
                self._shared.count(state, "scheduler/failed_groups")
                self._discarded(state, "failed_group", slot.messages())
                self._repeats.warning(f"dropping group {key}: a member failed "
                                      f"({msg.get('error')})")
                return slot.entries()
            return []
        slot.members[msg["member"]] = (entry, msg)
        if state.schedule.carry and \
                self._shared.version - msg["version_start"] > state.schedule.ratio:
            self._shared.count(state, "scheduler/carried_over")  # older than the ratio lets
        slot.oldest_start = min(slot.oldest_start, msg["version_start"])
        if len(slot.members) == state.group_size:
            # oldest episode first; val orders by group so every round's batch is the same
            order = g if state.mode == "val" else slot.seq
            heapq.heappush(state.ready, (0 if slot.priority else 1, k, order, key))
            slot.ready = True
            state.ready_count += 1
        return []

    def _discarded(self, state: ModeState, reason: str, msgs: list[dict[str, Any]]) -> None:
        """Count the generated tokens of trajectories dropped for `reason`."""
        tokens = sum(len(call["response_ids"]) for msg in msgs for step in msg["steps"]
                     for call in (*step.get("model_calls", ()), step)
                     if call.get("response_ids") is not None)
        if tokens:
            self._shared.count(state, TOKENS_DISCARDED + reason, tokens)

    def _is_stale(self, state: ModeState, k: int, version_start: int) -> bool:
        """Train: an expired episode, or one whose oldest token (`version_start`: the oldest
        step's oldest token, producers/rollout.py) is more than the bound behind."""
        schedule, version = state.schedule, self._shared.version
        return schedule.expired(k, version) or version - version_start > schedule.bound

    # -- group filters -----------------------------------------------------------------------
    def judge(self, state: ModeState, needed: int) -> int:
        """Judge the complete groups at the front of the ready heap, in hand-out order, until
        `needed` kept ones lead it or it runs out; each group once (a batch recorded in flight
        before a restart was judged when it went out: not again). A filtered group is dropped
        (acked and deleted; a late copy of it is late) and counted. Returns how many were
        filtered: the batch then needs others in their place."""
        group_filter = self.filters[state.mode]
        if not group_filter.active:
            return 0
        kept: list[tuple[int, int, int, GroupKey]] = []
        filtered: list[GroupSlot] = []
        try:
            while len(kept) < needed and state.ready:
                item = heapq.heappop(state.ready)
                slot = state.groups.get(item[3])
                if slot is None:
                    continue  # dropped since (the heap keeps them lazily)
                if not (slot.judged or slot.priority):
                    _, k, g = slot.key
                    group = [msg for _, (_, msg) in sorted(slot.members.items())]
                    try:
                        reason = group_filter.reason(g, k, group)
                    except BaseException:
                        kept.append(item)  # not judged: back into the heap as it was
                        raise
                    if reason is not None:
                        filtered.append(slot)
                        self._shared.count(state, FILTERED)
                        self._shared.count(state, REASON_COUNTERS[reason])
                        logger.debug("filtered group %s (%s)", slot.key, reason)
                        continue
                    slot.judged = True
                kept.append(item)
        finally:
            for item in kept:
                heapq.heappush(state.ready, item)
            self.drop_groups(state, filtered, counter=None, tokens="filtered")
        return len(filtered)

    # -- groups leaving ----------------------------------------------------------------------
    def forget_rounds(self, state: ModeState) -> None:
        """A new val round started (`state.round`): groups of older rounds are dropped."""
        old = [slot for key, slot in state.groups.items() if key[0] != state.round]
        self.drop_groups(state, old, counter=None, tokens="val_discarded")
        state.finished.clear()  # older rounds' entries are discarded by their round number

    def evict_expired(self, state: ModeState) -> None:
        """Train: drop the held groups the version has left behind."""
        if state.mode != "train":
            return
        version = self._shared.version
        # expired episodes, and groups whose weights fell more than `ratio` behind since they
        # were placed (a member's `version_start`: a version published over their heads)
        oldest = version - state.schedule.bound  # (with a carry-over: steps more)
        stale = [slot for (_, k, _), slot in state.groups.items()
                 if state.schedule.expired(k, version)
                 or slot.oldest_start < oldest]
        self.drop_groups(state, stale, counter="scheduler/stale_dropped", tokens="stale")
        first_live = state.schedule.first_live(version)
        for done in state.finished.values():  # forget what can no longer arrive unexpired
            done.difference_update({rk for rk in done if rk[1] < first_live})

    def drop_groups(self, state: ModeState, slots: list[GroupSlot], counter: str | None,
                    tokens: str | None = None) -> None:
        """Drop these groups (ack and delete their entries), counted under `counter`, their
        generated tokens under `tokens_discarded/{tokens}`."""
        entries: list[Entry] = []
        for slot in slots:
            entries += slot.entries()
            if tokens:
                self._discarded(state, tokens, slot.messages())
            state.finish(slot)
        if counter and entries:
            self._shared.count(state, counter, len(entries))
        if entries:
            self._writer.drop_entries(entries)

    # -- whether more can come ---------------------------------------------------------------
    def most_groups(self, state: ModeState) -> int:
        """An upper bound on the complete groups that can be ready at once for this batcher:
        every group it reads, for each episode admitted and not yet expired (train: at most
        `2 * ratio + 1` steps' worth, early in a run; one in sync mode; a val round plays its
        episodes once)."""
        steps = 2 * self.config.ratio + 1 + state.schedule.carry if state.mode == "train" \
            else 1
        return len(state.streams) * self.config.episodes_per_step(state.mode) * steps

    def deliverable(self, state: ModeState, wanted: int) -> int:
        """How many of the `wanted` groups can still complete. In sync mode a step's groups
        are its only ones until the version moves, so a group dropped because a member failed
        (a model server refusing a request, an env that kept raising) cannot be replaced:
        the batch goes out without it rather than never. A val round likewise: it plays
        its episodes once, so a group dropped in it is gone for the round. Async mode:
        `wanted` (later episodes fill in)."""
        if state.mode == "val":
            dropped = sum(1 for keys in state.finished.values() for rnd, _ in keys
                          if rnd == state.round)
            return min(wanted, self.most_groups(state) - dropped)
        if self.config.ratio != 0:
            return wanted
        per_step = state.schedule.episodes_per_step
        version = self._shared.version
        low, high = (version - state.schedule.carry) * per_step, (version + 1) * per_step
        done = sum(1 for keys in state.finished.values() for _, k in keys if low <= k < high)
        return min(wanted, self.most_groups(state) - done)

    def awaits_publish(self, deliverable: int) -> bool:
        """Nothing of this step can come, and another batcher (`count` > 1) may move the
        version: wait for its publish instead of raising `StepExhausted` (a rank that does not
        publish may ask for its next batch before the rank that does has published)."""
        return deliverable <= 0 and self.count > 1

    def version_moved(self, state: ModeState) -> bool:
        """Whether another batcher published since this one last read the version (then it
        holds the new one, and what that version expired is evicted). A rank waiting for
        that publish (`awaits_publish`) asks before each read, not at `nothing_more`'s look
        every `LOOK_EVERY_S`: a sync step's groups become deliverable only at the new
        version, and learning of it a look later cost every step up to a second."""
        return self._adopt(state, int(self.redis.get(self.keys.version) or 0))

    def _adopt(self, state: ModeState, current: int) -> bool:
        """Take the run's version `current` when another batcher published a newer one
        (evicting what it expired); False when it is not newer (lower: Redis lost it; the
        next get_batch puts it back)."""
        if current <= self._shared.version:
            return False
        self._shared.version = current
        self.evict_expired(state)
        return True

    def nothing_more(self, state: ModeState) -> bool:
        """Train mode: whether nothing more can reach this batcher before the version moves:
        every env of its groups has committed every episode admitted at this version (its
        cursor is at the admission limit) and its streams hold only what it holds already.
        Read in one transaction with the version (a commit moves a cursor and adds its entry
        at once; another batcher may have published meanwhile); looked at first and then at
        most every `LOOK_EVERY_S` while waiting. This is what a batcher restarted mid-step
        knows nothing else about: a step handed out and acked but not published, or a group
        dropped before the restart."""
        now = time.monotonic()
        if state.mode != "train" or now - state.looked_at < LOOK_EVERY_S:
            return False
        state.looked_at = now
        pipe = transaction(self.redis)
        pipe.get(self.keys.version)
        pipe.hmget(self.keys.cursor(state.mode), state.env_ids)
        for stream in state.streams:
            pipe.xlen(stream)
        version, cursors, *lengths = pipe.execute()
        current = int(version or 0)
        if current != self._shared.version:
            self._adopt(state, current)  # another batcher published while it waited
            return False
        limit = state.schedule.admit_limit(current)
        if any(cursor is None or int(cursor) < limit for cursor in cursors):
            return False
        return sum(lengths) <= len(state.held) + len(state.handed)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _iter_reply(reply: Any) -> list[tuple[str, list[Any]]]:
    """XREADGROUP's reply as [(stream name, [(id, fields), ...])] for RESP2 and RESP3."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(_text(k), v[0] if v and isinstance(v[0], list) else v)
                for k, v in reply.items()]
    return [(_text(stream), messages) for stream, messages in reply]

