"""The wire format: one msgpack map per stream entry, under the entry field `data`.

A public contract, readable with any msgpack library: plain maps, lists, strings, numbers,
bytes. A numpy array travels as the map `{"dtype": str, "shape": [int], "data": bytes}`
(C order, the dtype's own byte order string, e.g. "<f4"). Never pickle.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import msgpack
import numpy as np
import ormsgpack

from schemas.errors import DecodeError

SCHEMA_VERSION = 1
ENTRY_FIELD = b"data"  # the stream entry field holding the message
# Step fields that may carry numpy arrays (an env's observation and action, an LLM turn's
# token ids and logprobs); the decoder restores arrays there and nowhere else.
STEP_ARRAY_FIELDS = ("observation", "action", "prompt_ids", "response_ids", "logprobs")
# A step's `model_calls` (an agent's earlier model calls, producers/policies/agent.py): a
# list of maps, each with its own token arrays.
CALL_ARRAY_FIELDS = ("prompt_ids", "response_ids", "logprobs")

# Fields every trajectory message carries (the decoder refuses a message missing one).
REQUIRED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": int,
    "traj_id": str,
    "traj_group_id": str,
    "mode": str,
    "group_id": int,
    "episode_id": int,
    "member": int,
    "env_id": int,
    "tag": str,
    "seed": int,
    "version_start": int,
    "version_end": int,
    "episode_score": (int, float),
    "success": bool,
    "terminated": bool,
    "truncated": bool,
    "num_actions": int,
    "steps": list,
    "producer": str,
}


def _exact_types(kind: type | tuple[type, ...]) -> set[type]:
    """The types `isinstance(value, kind)` lets through, as msgpack makes them (a bool is
    no int here: `isinstance(True, int)` is refused when `kind` is `int` alone)."""
    kinds = set(kind) if isinstance(kind, tuple) else {kind}
    if int in kinds and kind is not int:
        kinds.add(bool)
    return kinds


# The exact types msgpack decodes each required field to when the message is valid, and
# every valid row of them: a message is checked with one tuple of types and one set lookup
# (the field-by-field loop runs only to name what is wrong).
_ALLOWED = {name: _exact_types(kind) for name, kind in REQUIRED_FIELDS.items()}
_REQUIRED = operator.itemgetter(*REQUIRED_FIELDS)
_VALID_TYPE_ROWS = frozenset(itertools.product(*_ALLOWED.values()))


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.hasobject:
            raise TypeError("object arrays cannot be encoded")
        return {"dtype": arr.dtype.str, "shape": list(arr.shape), "data": arr.tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _as_array(obj: Any) -> Any:
    """`{dtype, shape, data}` back to a (read-only) numpy array; anything else unchanged."""
    if type(obj) is dict and len(obj) == 3 and "dtype" in obj and "shape" in obj:
        data = obj.get("data")
        if isinstance(data, bytes):
            return np.frombuffer(data, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"])
    return obj


def _object_hook(obj: dict[str, Any]) -> Any:
    return _as_array(obj)


def pack(obj: Any) -> bytes:
    """msgpack with numpy support (arrays as {dtype, shape, data}, scalars as numbers)."""
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, object_hook=_object_hook, raw=False, strict_map_key=False)


# Trajectory messages go through ormsgpack: byte for byte what `pack` writes (checked in
# tests/test_schemas.py), faster both ways (docs/decisions.md); they are the hot path of
# every producer and of the Batcher. Non-str map keys (an env's info) travel as in `pack`.
_ORMSGPACK_OPTIONS = ormsgpack.OPT_NON_STR_KEYS


def encode_trajectory(traj: dict[str, Any]) -> bytes:
    """Encode a trajectory message; `schema` is filled in."""
    if "schema" not in traj:
        traj = {"schema": SCHEMA_VERSION, **traj}
    return ormsgpack.packb(traj, default=_default, option=_ORMSGPACK_OPTIONS)


def decode_trajectory(data: bytes) -> dict[str, Any]:
    """Decode and check one message; raises `DecodeError` naming what is wrong.

    Arrays are restored where a trajectory carries them (observations, actions), which is
    much cheaper than inspecting every map of the message.
    """
    try:
        msg = ormsgpack.unpackb(data, option=_ORMSGPACK_OPTIONS)
    except Exception as exc:  # garbage raises several types
        raise DecodeError(f"not msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(msg, dict):
        raise DecodeError(f"expected a map, got {type(msg).__name__}")
    schema = msg.get("schema")
    if schema != SCHEMA_VERSION:
        raise DecodeError(f"unsupported schema {schema!r} (this reader knows {SCHEMA_VERSION})")
    try:
        valid = tuple(map(type, _REQUIRED(msg))) in _VALID_TYPE_ROWS
    except KeyError:
        valid = False
    if not valid:
        for name, allowed in _ALLOWED.items():
            if name not in msg:
                raise DecodeError(f"missing field {name!r}")
            if type(msg[name]) not in allowed:
                raise DecodeError(f"field {name!r} has type {type(msg[name]).__name__}")
    if msg["mode"] not in ("train", "val"):
        raise DecodeError(f"field 'mode' is {msg['mode']!r}, not train or val")
    steps = msg["steps"]
    if len(steps) != msg["num_actions"]:
        raise DecodeError(f"num_actions is {msg['num_actions']} but {len(steps)} steps came")
    for step in steps:
        if type(step) is not dict or "action" not in step or "reward" not in step:
            raise DecodeError("a step lacks 'action' or 'reward'")
    if b"dtype" in data:  # an array's map has a "dtype" key: without those bytes, no arrays
        for step in steps:
            for name in STEP_ARRAY_FIELDS:
                if type(step.get(name)) is dict:
                    step[name] = _as_array(step[name])
            for call in step.get("model_calls") or ():  # an agent's earlier calls
                for name in CALL_ARRAY_FIELDS:
                    if type(call.get(name)) is dict:
                        call[name] = _as_array(call[name])
        if type(msg.get("final_observation")) is dict:
            msg["final_observation"] = _as_array(msg["final_observation"])
    return msg


def traj_ids(mode: str, group_id: int, episode_id: int, member: int) -> tuple[str, str]:
    """(traj_group_id, traj_id) strings, as ROLL trainers group by them."""
    group = f"{mode}-{group_id}-{episode_id}"
    return group, f"{group}-{member}"
