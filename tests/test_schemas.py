"""Seeds, the admission/expiry schedule, the codec and the key layout (pure logic)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from schemas.codec import decode_trajectory, encode_trajectory, pack, unpack
from schemas.errors import DecodeError
from schemas.keys import Keys
from schemas.protocol import Schedule
from schemas.seeding import episode_seed


def test_episode_seed_is_deterministic_and_distinct():
    assert episode_seed(1, "train", 3, 5) == episode_seed(1, "train", 3, 5)
    seeds = {episode_seed(1, mode, g, k) for mode in ("train", "val") for g in range(20)
             for k in range(20)}
    assert len(seeds) == 800
    assert episode_seed(1, "train", 3, 5) != episode_seed(2, "train", 3, 5)
    assert 0 <= episode_seed(1, "val", 0, 0) < 2**63


@pytest.mark.parametrize("ratio", [0, 1, 2])
@pytest.mark.parametrize("per_step", [1, 3])
def test_schedule_bounds_staleness(ratio, per_step):
    s = Schedule(per_step, ratio)
    for version in range(6):
        first = s.first_live(version)
        assert not s.expired(first, version)
        assert first == 0 or s.expired(first - 1, version)
        for k in range(s.admit_limit(version)):
            # any k admitted at version v0 has create(k) <= v0, so delivered at v it is
            # at most `ratio` stale exactly when it is not expired
            assert s.create_step(k) <= version
        assert not s.admitted(s.admit_limit(version), version)


def test_sync_schedule_admits_one_step_and_expires_the_last():
    s = Schedule(2, 0)
    assert [k for k in range(10) if s.admitted(k, 0)] == [0, 1]
    assert [k for k in range(10) if s.admitted(k, 1) and not s.expired(k, 1)] == [2, 3]


def test_async_schedule_runs_ratio_steps_ahead():
    s = Schedule(1, 2)
    assert [k for k in range(10) if s.admitted(k, 0)] == [0, 1, 2]
    assert not s.expired(0, 2) and s.expired(0, 3)


def trajectory(**overrides):
    traj = {"traj_id": "train-1-2-3", "traj_group_id": "train-1-2", "mode": "train",
            "group_id": 1, "episode_id": 2, "member": 3, "env_id": 7, "tag": "FrozenLake",
            "seed": 99, "version_start": 0, "version_end": 1, "episode_score": 1.0,
            "success": True, "terminated": True, "truncated": False, "num_actions": 1,
            "steps": [{"observation": np.arange(4, dtype=np.float32), "action": 2,
                       "reward": 1.0, "version": 1, "response": "<answer>Right</answer>"}],
            "producer": "p1"}
    traj.update(overrides)
    return traj


def test_codec_round_trip_with_numpy_arrays():
    msg = decode_trajectory(encode_trajectory(trajectory()))
    obs = msg["steps"][0]["observation"]
    assert obs.dtype == np.float32 and obs.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert msg["schema"] == 1 and msg["steps"][0]["response"] == "<answer>Right</answer>"
    grid = np.arange(12, dtype=np.int16).reshape(3, 4)
    back = unpack(pack({"x": grid, "s": np.float64(2.5)}))
    assert back["x"].shape == (3, 4) and back["x"].dtype == np.int16
    assert (back["x"] == grid).all() and back["s"] == 2.5


def test_wire_format_is_plain_msgpack():
    raw = msgpack.unpackb(encode_trajectory(trajectory()), raw=False)
    arr = raw["steps"][0]["observation"]
    assert set(arr) == {"dtype", "shape", "data"}
    assert arr["dtype"] == "<f4" and arr["shape"] == [4] and isinstance(arr["data"], bytes)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"\xc1garbage", "not msgpack"),
        (msgpack.packb([1, 2]), "expected a map"),
        (msgpack.packb({"schema": 99}), "unsupported schema 99"),
        (encode_trajectory({k: v for k, v in trajectory().items() if k != "tag"}),
         "missing field 'tag'"),
        (encode_trajectory(trajectory(group_id="one")), "field 'group_id' has type str"),
        (encode_trajectory(trajectory(episode_id=True)), "field 'episode_id' has type bool"),
        (encode_trajectory(trajectory(success=1)), "field 'success' has type int"),
        (encode_trajectory(trajectory(steps={})), "field 'steps' has type dict"),
        (encode_trajectory(trajectory(mode="test")), "field 'mode' is 'test'"),
        (encode_trajectory(trajectory(num_actions=2)), "num_actions is 2 but 1 steps came"),
    ],
)
def test_decode_refusals_say_why(data, needle):
    assert decode_trajectory(encode_trajectory(trajectory()))["episode_id"] == 2  # the base
    with pytest.raises(DecodeError, match=needle):
        decode_trajectory(data)


def test_keys_share_one_hash_slot_and_refuse_bad_run_names():
    keys = Keys("exp1")
    assert keys.stream("train", 17) == "{exp1}:traj:train:17"
    names = [keys.config, keys.version, keys.pause, keys.cursor("val"), keys.lease("train", 3),
             keys.weights(4), keys.dead, keys.control]
    assert all(name.startswith("{exp1}:") for name in names)
    for bad in ("", "a:b", "x{y}", "with space"):
        with pytest.raises(ValueError, match="run name"):
            Keys(bad)


def test_an_encoding_error_leaves_nothing_behind_for_the_next_message():
    """A message that fails half-way raises, and leaves nothing in front of the next one."""
    with pytest.raises(TypeError):
        encode_trajectory(trajectory(extra=np.array([object()], dtype=object)))
    assert decode_trajectory(encode_trajectory(trajectory()))["episode_id"] == 2


def test_trajectory_messages_are_the_bytes_msgpack_python_writes_and_reads():
    """The trajectory codec (ormsgpack, for speed) and `pack`/`unpack` (msgpack-python) agree
    byte for byte, so any msgpack library reads what producers write and writes what the
    Batcher reads."""
    msg = trajectory(
        final_observation=np.arange(6, dtype="<f4").reshape(2, 3), success=np.bool_(True),
        episode_score=np.float32(1.5), seed=2**63 - 1, tags=("a", "b"), blob=b"\x00\xff",
        info={1: "an int key", "nested": {"x": [1.0, None, "é"]}}, long="x" * 70_000,
    )
    data = encode_trajectory(msg)
    assert data == pack({"schema": msg.get("schema", 1), **msg})
    decoded = decode_trajectory(data)
    expected = unpack(data)
    for arrays in (("final_observation",), ("steps", 0, "observation")):
        *path, name = arrays
        got, want = decoded, expected
        for key in path:
            got, want = got[key], want[key]
        np.testing.assert_array_equal(got.pop(name), want.pop(name))
    assert decoded == expected
    assert decoded["info"][1] == "an int key" and decoded["blob"] == b"\x00\xff"
