"""The sampled trajectories of a run, read from its sample stream (`{RUN}:samples`) as they
come, and kept by group episode for the page.

`SampleFeed.read(client)` reads what was added since its last read (XRANGE from the last id,
exclusive; never the trainer's trajectory streams) and keeps the newest `keep` trajectories.
A group is a group episode (`traj_group_id`; a val group also by its round, val rounds
replay the same episodes); its members are the sampled trajectories of it, each sampled
group episode having all of them.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from schemas.codec import ENTRY_FIELD
from schemas.errors import DecodeError
from schemas.keys import Keys
from schemas.redisconn import SyncClient
from schemas.samples import decode_sample

logger = logging.getLogger(__name__)

READ_COUNT = 500  # entries per XRANGE call
OUTCOMES = ("all", "success", "failed", "context_full", "stale")


@dataclass
class Group:
    """One sampled group episode: its members' samples, by member."""

    key: str
    mode: str
    tag: str
    group_id: int
    episode_id: int
    round: int
    members: dict[int, dict[str, Any]] = field(default_factory=dict)
    updated: float = 0.0  # when a member last arrived here (this process's clock)
    seq: int = 0  # arrival order of that member


def trajectory_uid(sample: dict[str, Any]) -> str:
    """A sampled trajectory's id on the page: its `traj_id`, with the round for val (a val
    round replays the same episodes, so the same ids)."""
    if sample["mode"] == "val":
        return f"{sample['traj_id']}.r{int(sample.get('round') or 0)}"
    return str(sample["traj_id"])


def staleness(sample: dict[str, Any]) -> int:
    """Versions between the run's at commit and the trajectory's oldest step."""
    return max(0, int(sample.get("run_version") or 0) - int(sample.get("version_start") or 0))


def outcome_of(sample: dict[str, Any]) -> dict[str, bool]:
    """The page's filters for one trajectory: `failed` is any episode that did not succeed
    (an env that kept raising included), `stale` one acted on by older weights than the
    run's when it was committed."""
    return {"success": bool(sample.get("success")), "failed": not sample.get("success"),
            "context_full": bool(sample.get("context_full")), "stale": staleness(sample) > 0}


class SampleFeed:
    """What the sample stream has brought so far (see the module docstring)."""

    def __init__(self, keys: Keys, keep: int = 1000):
        self.keys = keys
        self.keep = keep
        self.last_id = b"-"
        self.received = 0  # samples read since start
        self.undecodable = 0
        self.groups: OrderedDict[str, Group] = OrderedDict()  # oldest arrival first
        self.trajectories: dict[str, dict[str, Any]] = {}  # uid -> sample
        self._seq = 0
        self.recent: list[dict[str, Any]] = []  # read by the last `read()` (for the history)

    def read(self, client: SyncClient) -> int:
        """Read the samples added since the last call; returns how many."""
        self.recent = []
        while True:
            start = self.last_id if self.last_id == b"-" else b"(" + self.last_id
            entries: list[Any] = client.xrange(self.keys.samples, min=start,
                                               count=READ_COUNT) or []
            for entry_id, fields in entries:
                self.last_id = entry_id
                self._add((fields or {}).get(ENTRY_FIELD))
            if len(entries) < READ_COUNT:
                return len(self.recent)

    def _add(self, data: bytes | None) -> None:
        try:
            sample = decode_sample(data or b"")
        except DecodeError as exc:
            self.undecodable += 1
            if self.undecodable == 1:
                logger.warning("a sample could not be read (%s); later ones are counted", exc)
            return
        self.received += 1
        self.recent.append(sample)
        uid = trajectory_uid(sample)
        sample["uid"] = uid
        key = _group_key(sample)
        group = self.groups.pop(key, None) or Group(
            key=key, mode=sample["mode"], tag=str(sample.get("tag", "")),
            group_id=sample["group_id"], episode_id=sample["episode_id"],
            round=int(sample.get("round") or 0))
        old = group.members.get(sample["member"])
        if old is not None:
            self.trajectories.pop(old["uid"], None)
        group.members[sample["member"]] = sample
        self._seq += 1
        group.updated, group.seq = time.time(), self._seq
        self.groups[key] = group  # newest last
        self.trajectories[uid] = sample
        while len(self.trajectories) > self.keep and self.groups:
            _, oldest = self.groups.popitem(last=False)
            for member in oldest.members.values():
                self.trajectories.pop(member["uid"], None)

    def tags(self) -> list[str]:
        return sorted({group.tag for group in self.groups.values()})

    def groups_view(self, *, tag: str | None = None, outcome: str = "all", mode: str | None = None,
                    limit: int = 100, members: dict[str, int] | None = None
                    ) -> list[dict[str, Any]]:
        """The newest groups first, as the page lists them: those of `tag` / `mode` with a
        member of `outcome` (`OUTCOMES`). `members`: mode -> envs per group (complete when
        all came)."""
        out = []
        for group in reversed(self.groups.values()):
            if (tag and group.tag != tag) or (mode and group.mode != mode):
                continue
            rows = [_member_row(s) for _, s in sorted(group.members.items())]
            if outcome != "all" and not any(row["outcome"][outcome] for row in rows):
                continue
            expected = (members or {}).get(group.mode)
            out.append({
                "key": group.key, "mode": group.mode, "tag": group.tag,
                "group_id": group.group_id, "episode_id": group.episode_id,
                "round": group.round, "seq": group.seq, "updated": group.updated,
                "expected": expected, "members": rows,
                "mean_score": sum(r["score"] for r in rows) / len(rows),
            })
            if len(out) >= limit:
                break
        return out


def _group_key(sample: dict[str, Any]) -> str:
    group = str(sample.get("traj_group_id") or
                f"{sample['mode']}-{sample['group_id']}-{sample['episode_id']}")
    return f"{group}.r{int(sample.get('round') or 0)}" if sample["mode"] == "val" else group


def _member_row(sample: dict[str, Any]) -> dict[str, Any]:
    return {
        "uid": sample["uid"], "traj_id": sample["traj_id"], "member": sample["member"],
        "score": float(sample.get("episode_score") or 0.0),
        "num_actions": int(sample.get("num_actions") or 0),
        "version_start": sample.get("version_start"), "version_end": sample.get("version_end"),
        "run_version": sample.get("run_version"), "staleness": staleness(sample),
        "producer": sample.get("producer"), "error": sample.get("error"),
        "env_failed": bool(sample.get("failed")), "truncated": bool(sample.get("truncated")),
        "outcome": outcome_of(sample),
    }
