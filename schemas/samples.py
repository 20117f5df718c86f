"""The sample stream: a few finished trajectories of a run, slimmed, for a person to read.

Producers choose group episodes by a hash of (seed, mode, group, episode), so every member of
a chosen group episode is sampled (and a producer that replays an episode after a takeover
chooses the same). A sampled trajectory is written by the commit script itself, in the same
call as its commit and only when that commit lands (`producers/commit.py`): a commit fenced
off, refused while paused, or a duplicate leaves no sample. The stream `{RUN}:samples` is
trimmed on every write (`XADD MAXLEN ~ sample_stream_len`).

A sample is a msgpack map under the entry field `data`: the trajectory's own fields, its
steps without the token arrays (their lengths instead: `prompt_tokens`, `response_tokens`),
every string cut at `MAX_TEXT_CHARS`, arrays as lists (large ones as their shape), and when the
whole is still past `MAX_SAMPLE_BYTES`, steps left out from the middle (`steps_omitted`). Plus
`sample: SAMPLE_SCHEMA`, `run_version` (the run's version when it was committed) and, for a
text env, each step's `action_name`. Readers: `rollstream ui` (`rollstream/ui/`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import ormsgpack

from schemas.codec import unpack
from schemas.errors import DecodeError

SAMPLE_SCHEMA = 1
MAX_TEXT_CHARS = 4096  # a string longer than this is cut, with a note of what was cut
MAX_ARRAY_ITEMS = 1024  # an array up to this size travels as nested lists (grids), else shape
MAX_ITEMS = 64  # a list or map keeps this many items
MAX_SAMPLE_BYTES = 32 * 1024  # steps are left out from the middle until a sample fits
TOKEN_FIELDS = {"prompt_ids": "prompt_tokens", "response_ids": "response_tokens",
                "logprobs": None}  # dropped from a sample; the ids' lengths kept
_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer (Steele, Lea, Flood 2014): a well spread 64-bit hash."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


class Sampler:
    """Which group episodes are sampled: `sampler(mode, group_id, episode_id)`, the same
    answer for every member, every producer and every replay. The members of a group ask in
    turn about the same episode: its answer is kept, so the hash runs once per group episode."""

    __slots__ = ("_groups", "_seed", "_threshold")

    def __init__(self, rate: float, seed: int):
        self._threshold = int(min(max(rate, 0.0), 1.0) * 2.0**64)  # hash < threshold: chosen
        self._seed = _mix(seed & _MASK64)
        self._groups: dict[tuple[str, int], list[Any]] = {}  # -> [base, episode, answer]

    @property
    def enabled(self) -> bool:
        return self._threshold > 0

    def __call__(self, mode: str, group_id: int, episode_id: int) -> bool:
        if self._threshold <= 0:
            return False
        known = self._groups.get((mode, group_id))
        if known is None:
            base = _mix(self._seed ^ (group_id * 0x9E3779B97F4A7C15 & _MASK64)
                        ^ (mode == "val") << 63)
            known = self._groups[(mode, group_id)] = [base, -1, False]
        elif known[1] == episode_id:
            return known[2]
        answer = _mix(known[0] ^ (episode_id & _MASK64)) < self._threshold
        known[1], known[2] = episode_id, answer
        return answer


def sample_of(traj: dict[str, Any], *, run_version: int,
              action_names: Sequence[str] | None = None) -> dict[str, Any]:
    """A trajectory message (not yet encoded) as a sample (see the module docstring)."""
    out: dict[str, Any] = {"sample": SAMPLE_SCHEMA, "run_version": int(run_version)}
    for name, value in traj.items():
        if name == "steps":
            out["steps"] = [_step(step, action_names) for step in value]
        else:
            out[name] = _slim(value)
    return out


def pack(sample: dict[str, Any]) -> bytes:
    """msgpack of a slimmed sample (plain types only): ormsgpack, as trajectories are."""
    return ormsgpack.packb(sample, option=ormsgpack.OPT_NON_STR_KEYS)


def encode_sample(sample: dict[str, Any]) -> bytes:
    """msgpack bytes of at most `MAX_SAMPLE_BYTES` (steps left out from the middle as
    needed; in the end only the trajectory's own fields)."""
    data = pack(sample)
    steps = sample.get("steps") or []
    if len(data) <= MAX_SAMPLE_BYTES:
        return data
    keep = len(steps)
    while keep > 0:
        keep //= 2
        head = (keep + 1) // 2
        tail = keep - head
        trimmed = {**sample, "steps": steps[:head] + (steps[len(steps) - tail:] if tail else []),
                   "steps_omitted": {"from": head, "count": len(steps) - keep}}
        data = pack(trimmed)
        if len(data) <= MAX_SAMPLE_BYTES:
            return data
    bare = {name: value for name, value in sample.items()
            if not isinstance(value, dict | list) or name == "steps"}
    bare["steps"] = []
    bare["steps_omitted"] = {"from": 0, "count": len(steps)}
    data = pack(bare)
    if len(data) <= MAX_SAMPLE_BYTES:
        return data
    return pack({name: bare[name] for name in ("sample", "run_version", "traj_id", "mode",
                                                "group_id", "episode_id", "member", "tag",
                                                "steps", "steps_omitted") if name in bare})


def decode_sample(data: bytes) -> dict[str, Any]:
    """A sample's map; `DecodeError` naming what is wrong with one that is not."""
    try:
        sample = unpack(data)
    except Exception as exc:  # garbage raises several types
        raise DecodeError(f"sample is not msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(sample, dict):
        raise DecodeError(f"sample: expected a map, got {type(sample).__name__}")
    if sample.get("sample") != SAMPLE_SCHEMA:
        raise DecodeError(f"sample: unsupported sample schema {sample.get('sample')!r}")
    for name, kind in (("traj_id", str), ("mode", str), ("group_id", int),
                       ("episode_id", int), ("member", int), ("steps", list)):
        if not isinstance(sample.get(name), kind):
            raise DecodeError(f"sample: field {name!r} missing or not {kind.__name__}")
    return sample


def _step(step: dict[str, Any], action_names: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in step.items():
        if name in TOKEN_FIELDS:
            counted = TOKEN_FIELDS[name]
            if counted is not None and value is not None:
                out[counted] = len(value)
            continue
        if name == "model_calls" and type(value) is list:  # an agent's calls: counts too
            out[name] = [_step(call, None) if type(call) is dict else _slim(call, 1)
                         for call in value[:MAX_ITEMS]]
            continue
        out[name] = _slim(value)
    action = step.get("action")
    if action_names and isinstance(action, int | np.integer) \
            and 0 <= int(action) < len(action_names):
        out["action_name"] = str(action_names[int(action)])
    return out


_PLAIN = frozenset((int, float, bool, type(None)))


def _slim(value: Any, depth: int = 0) -> Any:
    """`value` made small and plain: strings cut, arrays as lists or their shape, nesting
    and lengths bounded. (Exact type checks first: this runs for every field of a sample.)"""
    kind = type(value)
    if kind is str:
        if len(value) <= MAX_TEXT_CHARS:
            return value
        return f"{value[:MAX_TEXT_CHARS]}... [{len(value) - MAX_TEXT_CHARS} more characters]"
    if kind in _PLAIN:
        return value
    if kind is dict and depth < 4:
        if len(value) > MAX_ITEMS:
            items = list(value.items())
            out = {str(k): _slim(v, depth + 1) for k, v in items[:MAX_ITEMS]}
            out["..."] = f"{len(items) - MAX_ITEMS} more"
            return out
        return {k if type(k) is str else str(k): _slim(v, depth + 1) for k, v in value.items()}
    if kind is list or kind is tuple:
        if depth >= 4:
            return f"<{kind.__name__}>"
        out_list = [_slim(v, depth + 1) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            out_list.append(f"... {len(value) - MAX_ITEMS} more")
        return out_list
    return _slim_other(value, depth)


def _slim_other(value: Any, depth: int) -> Any:
    """`_slim` of the rarer kinds: numpy values, bytes, subclasses, sets, anything else."""
    if isinstance(value, np.ndarray):
        if value.size <= MAX_ARRAY_ITEMS and not value.dtype.hasobject:
            return value.tolist()
        return {"array": list(value.shape), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    if isinstance(value, str | bool | int | float):  # a subclass (an IntEnum, a str enum)
        return _slim(str(value) if isinstance(value, str) else value.real, depth)
    if depth >= 4:
        return f"<{type(value).__name__}>"
    if isinstance(value, dict):
        return _slim(dict(value), depth)
    if isinstance(value, list | tuple | set | frozenset):
        return _slim(list(value), depth)
    return _slim(str(value), depth)
