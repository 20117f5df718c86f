"""What the trainer gets: a `Batch` of complete groups, as arrays and as trajectories, and
for LLM agents the tokens of every model turn as padded arrays (`turn_tokens`,
`trajectory_tokens`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

_HEADER_FIELDS = ("traj_id", "traj_group_id", "group_id", "episode_id", "episode_score",
                  "success", "num_actions", "version_start")
_HEADER = itemgetter(*_HEADER_FIELDS)  # a trajectory's per-trajectory arrays, read in C


class Entry(NamedTuple):
    """Where a trajectory sits in Redis: its stream and entry id (a tuple: hashed in C, the
    Batcher keeps sets of thousands)."""

    stream: str
    entry_id: str


@dataclass
class Batch:
    """Complete groups of one mode, group members adjacent, oldest episode first.

    Arrays are indexed by trajectory; step arrays are padded to the longest trajectory and
    `mask` marks the real steps. `actions` is None when actions are not integers.
    """

    mode: str
    version: int
    trajectories: list[dict[str, Any]]
    entries: list[Entry] = field(repr=False)
    metrics: dict[str, float]
    round: int = 0

    def __post_init__(self) -> None:
        trajs = self.trajectories
        rows = list(map(_HEADER, trajs))
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(_HEADER_FIELDS)
        (traj_ids, group_keys, group_ids, episode_ids, scores, success, num_actions,
         version_start) = columns
        self.traj_ids: list[str] = list(traj_ids)
        self.traj_group_ids: list[str] = list(group_keys)
        self.group_ids = np.array(group_ids, dtype=np.int64)
        self.episode_ids = np.array(episode_ids, dtype=np.int64)
        self.scores = np.array(scores, dtype=np.float32)
        self.success = np.array(success, dtype=bool)
        self.num_actions = np.array(num_actions, dtype=np.int64)
        self.version_start = np.array(version_start, dtype=np.int64)
        # group_index: 0..groups-1, each trajectory's group within this batch, numbered in
        # the order the groups come (members are adjacent, so 0, 0, ..., 1, 1, ...)
        index: dict[str, int] = {}
        self.group_index = np.array([index.setdefault(key, len(index)) for key in group_keys],
                                    dtype=np.int64)
        # [trajectory, step] arrays, filled from one flat list each (row-major, as the mask)
        lengths = np.array([len(t["steps"]) for t in trajs], dtype=np.int64)
        width = int(lengths.max()) if trajs else 0
        self.mask = np.arange(width) < lengths[:, None]
        self.rewards = np.zeros((len(trajs), width), dtype=np.float32)
        self.rewards[self.mask] = [s["reward"] for t in trajs for s in t["steps"]]
        flat_actions = [s["action"] for t in trajs for s in t["steps"]]
        integer_actions = all(isinstance(a, int) for a in flat_actions)
        actions = np.zeros((len(trajs), width), dtype=np.int64)
        if integer_actions:
            actions[self.mask] = flat_actions
        self.actions: np.ndarray | None = actions if integer_actions else None

    def __len__(self) -> int:
        return len(self.trajectories)

    def turn_tokens(self, pad_id: int = 0) -> TurnTokens:
        """One sample per model turn (see `TurnTokens`); turns without token ids (a server
        that does not return them) are left out and counted in `missing`, and in
        `metrics["tokens/turns_without_ids"]`."""
        return turn_tokens(self.trajectories, self.group_index, pad_id=pad_id,
                           metrics=self.metrics)

    def trajectory_tokens(self, pad_id: int = 0) -> TrajectoryTokens:
        """One sequence per trajectory whose turns extend each other token for token (see
        `TrajectoryTokens`); the others are left out and counted in `non_extending` and
        `metrics["tokens/non_extending"]` (and `missing_ids`,
        `metrics["tokens/trajectories_without_ids"]`)."""
        return trajectory_tokens(self.trajectories, self.group_index, pad_id=pad_id,
                                 metrics=self.metrics)


@dataclass
class TurnTokens:
    """The per-turn form: sample i is one model turn. Arrays are right-padded (`pad_id`,
    logprobs 0) to the longest prompt / response, with their lengths."""

    prompt_ids: np.ndarray  # [N, P] int32: the prompt as the server tokenized it
    prompt_lengths: np.ndarray  # [N] int64
    response_ids: np.ndarray  # [N, R] int32: the tokens the model generated
    response_lengths: np.ndarray  # [N] int64
    logprobs: np.ndarray  # [N, R] float32: the sampler's logprob of each response token
    rewards: np.ndarray  # [N] float32: the env's reward for the turn
    scores: np.ndarray  # [N] float32: the trajectory's episode_score
    traj_index: np.ndarray  # [N] int64: index into batch.trajectories
    turn_index: np.ndarray  # [N] int64: the turn within its trajectory
    group_index: np.ndarray  # [N] int64: the trajectory's group within the batch
    missing: int = 0  # turns left out: no token ids
    # per-token provenance (docs/trainer-api.md): the version that sampled each response
    # token (-1 on padding), the turn's reward on its last token (0 elsewhere), and the
    # turn's oldest token's version (what the staleness bound counts)
    response_versions: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    token_rewards: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    versions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # [N] int64: the model call within its turn (an agent's `model_calls` first, in call
    # order, then the step's own: 0 for a turn of one call); the turn's reward is on its
    # last call only
    call_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.traj_index)


@dataclass
class TrajectoryTokens:
    """The per-trajectory form: one sequence per trajectory, the first prompt followed by each
    reply and the tokens the next prompt adds (the env's answer, template glue). Only
    trajectories whose every prompt starts with the previous prompt and reply, token for
    token; joining the others would train on a sequence the model never saw."""

    input_ids: np.ndarray  # [M, L] int32, right-padded with pad_id
    attention_mask: np.ndarray  # [M, L] int8: 1 on real tokens
    loss_mask: np.ndarray  # [M, L] int8: 1 on tokens the model generated
    rollout_logprobs: np.ndarray  # [M, L] float32: logprob of input_ids[j] where generated
    lengths: np.ndarray  # [M] int64
    traj_index: np.ndarray  # [M] int64: index into batch.trajectories
    scores: np.ndarray  # [M] float32: episode_score
    group_index: np.ndarray  # [M] int64
    non_extending: int = 0  # trajectories left out: a prompt does not extend the last one
    missing_ids: int = 0  # trajectories left out: a turn without token ids
    # per-token provenance (docs/trainer-api.md), [M, L] like input_ids:
    # turn_ids: the turn (step index) each generated token belongs to, -1 on prompt, env and
    #   padding tokens; a turn's tokens are `turn_ids == t`, its last one the turn's end
    # token_versions: the version that sampled each generated token (-1 elsewhere)
    # token_rewards: each turn's reward on its last generated token (0 elsewhere)
    turn_ids: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    token_versions: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    token_rewards: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))

    def __len__(self) -> int:
        return len(self.traj_index)


def model_calls(step: dict[str, Any]) -> list[dict[str, Any]]:
    """A step's model calls in order: an agent's earlier calls (`model_calls`, reward 0:
    the step's reward is its last call's), then the step itself."""
    calls = step.get("model_calls")
    if not calls:
        return [step]
    return [*({**call, "reward": 0.0} for call in calls), step]


def _ids(step: dict[str, Any], name: str) -> np.ndarray | None:
    value = step.get(name)
    if value is None:
        return None
    return np.asarray(value, dtype=np.int32)


def _turn_logprobs(step: dict[str, Any], length: int) -> np.ndarray:
    """The step's logprobs fitted to its response length (0 where the server gave none)."""
    out = np.zeros(length, dtype=np.float32)
    value = step.get("logprobs")
    if value is not None:
        given = np.asarray(value, dtype=np.float32)[:length]
        out[: len(given)] = given
    return out


def turn_versions(step: dict[str, Any], length: int) -> np.ndarray:
    """The version that sampled each of a step's `length` response tokens: its
    `version_spans` rows ([version, start, end) over the response tokens) where the server
    reported several, else the step's `version` for all. A token no span covers gets the
    oldest span's version: a turn is never labelled with weights newer than it came from."""
    spans = step.get("version_spans")
    out = np.full(length, int(step.get("version", 0)), dtype=np.int64)
    if spans:
        out[:] = min(int(row[0]) for row in spans)
        for version, start, end in spans:
            out[int(start):int(end)] = int(version)
    return out


def _last_token(length: int, value: float) -> np.ndarray:
    out = np.zeros(length, dtype=np.float32)
    if length:
        out[-1] = value
    return out


def _pad(rows: list[np.ndarray], dtype: Any, fill: float) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    width = int(lengths.max()) if len(rows) else 0
    out = np.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out, lengths


def turn_tokens(trajs: list[dict[str, Any]], group_index: np.ndarray, *, pad_id: int = 0,
                metrics: dict[str, float] | None = None) -> TurnTokens:
    """`Batch.turn_tokens` over a list of trajectories."""
    prompts, responses, logprobs, token_versions, token_rewards = [], [], [], [], []
    rewards, scores, traj_index, turn_index, groups, versions = [], [], [], [], [], []
    call_index = []
    missing = 0
    for i, traj in enumerate(trajs):
        for t, c, step in ((t, c, call) for t, whole in enumerate(traj["steps"])
                           for c, call in enumerate(model_calls(whole))):
            prompt, response = _ids(step, "prompt_ids"), _ids(step, "response_ids")
            if prompt is None or response is None:
                missing += "response" in step
                continue
            call_index.append(c)
            prompts.append(prompt)
            responses.append(response)
            logprobs.append(_turn_logprobs(step, len(response)))
            token_versions.append(turn_versions(step, len(response)))
            token_rewards.append(_last_token(len(response), step["reward"]))
            versions.append(int(token_versions[-1].min()) if len(response)
                            else int(step.get("version", 0)))
            rewards.append(step["reward"])
            scores.append(traj["episode_score"])
            traj_index.append(i)
            turn_index.append(t)
            groups.append(group_index[i])
    prompt_ids, prompt_lengths = _pad(prompts, np.int32, pad_id)
    response_ids, response_lengths = _pad(responses, np.int32, pad_id)
    logprob_array, _ = _pad(logprobs, np.float32, 0.0)
    if metrics is not None:
        metrics["tokens/turns_without_ids"] = float(missing)
    return TurnTokens(
        prompt_ids, prompt_lengths, response_ids, response_lengths, logprob_array,
        np.array(rewards, dtype=np.float32), np.array(scores, dtype=np.float32),
        np.array(traj_index, dtype=np.int64), np.array(turn_index, dtype=np.int64),
        np.array(groups, dtype=np.int64), missing, _pad(token_versions, np.int64, -1)[0],
        _pad(token_rewards, np.float32, 0.0)[0], np.array(versions, dtype=np.int64),
        np.array(call_index, dtype=np.int64))


def _joined(steps: list[dict[str, Any]]) -> tuple[list[np.ndarray], str]:
    """[input_ids, loss_mask, logprobs, turn_ids, token_versions, token_rewards] of a
    trajectory, or ([], why it cannot be joined)."""
    ids: list[np.ndarray] = []
    mask: list[np.ndarray] = []
    lps: list[np.ndarray] = []
    turns: list[np.ndarray] = []
    vers: list[np.ndarray] = []
    rews: list[np.ndarray] = []
    length = 0
    seq = np.zeros(0, dtype=np.int32)
    for t, step in ((t, call) for t, whole in enumerate(steps) for call in model_calls(whole)):
        prompt, response = _ids(step, "prompt_ids"), _ids(step, "response_ids")
        if prompt is None or response is None:
            return [], "missing"
        if len(prompt) < length or not np.array_equal(prompt[:length], seq[:length]):
            return [], "non_extending"
        added = prompt[length:]
        ids += [added, response]
        mask += [np.zeros(len(added), np.int8), np.ones(len(response), np.int8)]
        lps += [np.zeros(len(added), np.float32), _turn_logprobs(step, len(response))]
        outside = np.full(len(added), -1, np.int64)
        turns += [outside, np.full(len(response), t, np.int64)]
        vers += [outside, turn_versions(step, len(response))]
        rews += [np.zeros(len(added), np.float32), _last_token(len(response), step["reward"])]
        seq = np.concatenate([prompt, response])
        length = len(seq)
    if not ids:
        return [], "missing"
    return [np.concatenate(part) for part in (ids, mask, lps, turns, vers, rews)], ""


def trajectory_tokens(trajs: list[dict[str, Any]], group_index: np.ndarray, *,
                      pad_id: int = 0,
                      metrics: dict[str, float] | None = None) -> TrajectoryTokens:
    """`Batch.trajectory_tokens` over a list of trajectories."""
    rows: list[list[np.ndarray]] = []
    kept: list[int] = []
    left_out = {"non_extending": 0, "missing": 0}
    for i, traj in enumerate(trajs):
        joined, why = _joined(traj["steps"])
        if why:
            left_out[why] += 1
            continue
        rows.append(joined)
        kept.append(i)
    input_ids, lengths = _pad([r[0] for r in rows], np.int32, pad_id)
    loss_mask, _ = _pad([r[1] for r in rows], np.int8, 0)
    logprobs, _ = _pad([r[2] for r in rows], np.float32, 0.0)
    turn_ids, _ = _pad([r[3] for r in rows], np.int64, -1)
    token_versions, _ = _pad([r[4] for r in rows], np.int64, -1)
    token_rewards, _ = _pad([r[5] for r in rows], np.float32, 0.0)
    attention_mask = (np.arange(input_ids.shape[1]) < lengths[:, None]).astype(np.int8)
    if metrics is not None:
        metrics["tokens/non_extending"] = float(left_out["non_extending"])
        metrics["tokens/trajectories_without_ids"] = float(left_out["missing"])
    index = np.array(kept, dtype=np.int64)
    return TrajectoryTokens(
        input_ids, attention_mask, loss_mask, logprobs, lengths, index,
        np.array([trajs[i]["episode_score"] for i in kept], dtype=np.float32),
        np.asarray(group_index, dtype=np.int64)[index] if len(kept) else index,
        left_out["non_extending"], left_out["missing"], turn_ids, token_versions,
        token_rewards)


def batch_metrics(
    trajs: list[dict[str, Any]], version: int, counters: dict[str, float], wait_s: float
) -> dict[str, float]:
    """ROLL's metric names for one batch."""
    metrics: dict[str, float] = {}
    by_tag: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for traj in trajs:
        by_tag[traj["tag"]].append(traj)
    for tag, items in sorted(by_tag.items()):
        metrics[f"env/{tag}/success"] = float(np.mean([t["success"] for t in items]))
        metrics[f"env/{tag}/num_actions"] = float(np.mean([t["num_actions"] for t in items]))
        metrics[f"env/{tag}/score"] = float(np.mean([t["episode_score"] for t in items]))
    scores = np.array([t["episode_score"] for t in trajs], dtype=np.float64)
    staleness = np.array([version - t["version_start"] for t in trajs], dtype=np.float64)
    if len(trajs):
        metrics["rollout/score/mean"] = float(scores.mean())
        metrics["rollout/score/max"] = float(scores.max())
        metrics["rollout/score/min"] = float(scores.min())
        metrics["scheduler/staleness/mean"] = float(staleness.mean())
        metrics["scheduler/staleness/max"] = float(staleness.max())
        # the distribution, not only the max: trajectories per version lag (0 = current)
        lags, counts = np.unique(staleness.astype(np.int64), return_counts=True)
        for lag, count in zip(lags.tolist(), counts.tolist(), strict=True):
            metrics[f"scheduler/staleness/lag_{lag}"] = float(count)
        # ended by the model's context window (truncated with the turns that fit)
        metrics["rollout/context_full"] = float(sum(1 for t in trajs if "context_full" in t))
        metrics.update(tool_metrics(trajs))
    metrics["time/get_batch_cost"] = wait_s
    metrics.update(counters)
    return metrics


def tool_metrics(trajs: list[dict[str, Any]]) -> dict[str, float]:
    """`tools/calls` (calls run) and `tools/malformed` (calls the parser could not use) of a
    batch's steps (producers/tools/loop.py); none when no step of it had tools."""
    calls = malformed = 0
    seen = False
    for traj in trajs:
        for step in traj["steps"]:
            if "tool_calls" in step:
                seen = True
                calls += step["tool_calls"]
                malformed += step.get("tool_malformed", 0)
    return {"tools/calls": float(calls), "tools/malformed": float(malformed)} if seen else {}
