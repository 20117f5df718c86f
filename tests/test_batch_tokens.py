"""The trainer's token view of a batch, on hand-built trajectories with known token ids."""

from __future__ import annotations

from typing import Any

import numpy as np

from consumer.batch import Batch
from schemas.codec import decode_trajectory, encode_trajectory


def step(prompt: list[int] | None, response: list[int] | None, logprobs: list[float] | None,
         reward: float = 0.0) -> dict[str, Any]:
    out: dict[str, Any] = {"observation": "o", "action": 0, "reward": reward, "version": 0,
                           "info": {}, "response": "text"}
    if prompt is not None:
        out["prompt_ids"] = np.array(prompt, dtype=np.int32)
    if response is not None:
        out["response_ids"] = np.array(response, dtype=np.int32)
    if logprobs is not None:
        out["logprobs"] = np.array(logprobs, dtype=np.float32)
    return out


def traj(group: int, member: int, steps: list[dict[str, Any]], score: float) -> dict[str, Any]:
    """A trajectory message as the batcher decodes it (through the real codec)."""
    msg = {
        "traj_id": f"train-{group}-0-{member}", "traj_group_id": f"train-{group}-0",
        "mode": "train", "group_id": group, "episode_id": 0, "member": member, "env_id": member,
        "tag": "FrozenLake", "seed": 1, "version_start": 0, "version_end": 0,
        "episode_score": score, "success": False, "terminated": True, "truncated": False,
        "num_actions": len(steps), "steps": steps, "producer": "p",
    }
    return decode_trajectory(encode_trajectory(msg))


def make_batch(trajs: list[dict[str, Any]]) -> Batch:
    return Batch("train", 0, trajs, [], {})


# Trajectory A extends: turn 2's prompt = turn 1's prompt + reply + [20, 21] (env text, glue).
A = [step([1, 2, 3], [10, 11], [-0.1, -0.2], reward=0.5),
     step([1, 2, 3, 10, 11, 20, 21], [12], [-0.3], reward=1.0)]
# Trajectory B does not: turn 2's prompt dropped the earlier reply's first token (as a chat
# template that removes earlier thinking does).
B = [step([1, 2, 4], [13, 14], [-0.4, -0.5]),
     step([1, 2, 4, 14, 22], [15], [-0.6])]
# Trajectory C: one turn from a server that returned no token ids.
C = [step(None, None, None, reward=0.25)]


def test_turn_form_has_every_turn_with_ids() -> None:
    batch = make_batch([traj(0, 0, A, 1.5), traj(0, 1, B, 0.0), traj(1, 0, C, 0.25)])
    tokens = batch.turn_tokens(pad_id=-1)
    assert len(tokens) == 4 and tokens.missing == 1
    assert batch.metrics["tokens/turns_without_ids"] == 1.0
    assert tokens.prompt_ids.dtype == np.int32 and tokens.prompt_ids.shape == (4, 7)
    np.testing.assert_array_equal(tokens.prompt_lengths, [3, 7, 3, 5])
    np.testing.assert_array_equal(tokens.prompt_ids[0], [1, 2, 3, -1, -1, -1, -1])
    np.testing.assert_array_equal(tokens.prompt_ids[3], [1, 2, 4, 14, 22, -1, -1])
    np.testing.assert_array_equal(tokens.response_ids, [[10, 11], [12, -1], [13, 14], [15, -1]])
    np.testing.assert_array_equal(tokens.response_lengths, [2, 1, 2, 1])
    np.testing.assert_allclose(tokens.logprobs, [[-0.1, -0.2], [-0.3, 0], [-0.4, -0.5],
                                                 [-0.6, 0]], rtol=1e-6)
    np.testing.assert_allclose(tokens.rewards, [0.5, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(tokens.scores, [1.5, 1.5, 0.0, 0.0])
    np.testing.assert_array_equal(tokens.traj_index, [0, 0, 1, 1])
    np.testing.assert_array_equal(tokens.turn_index, [0, 1, 0, 1])
    np.testing.assert_array_equal(tokens.group_index, [0, 0, 0, 0])


def test_trajectory_form_joins_only_extending_trajectories() -> None:
    batch = make_batch([traj(0, 0, A, 1.5), traj(0, 1, B, 0.0), traj(1, 0, C, 0.25)])
    tokens = batch.trajectory_tokens(pad_id=0)
    assert len(tokens) == 1
    assert tokens.non_extending == 1 and tokens.missing_ids == 1
    assert batch.metrics["tokens/non_extending"] == 1.0
    assert batch.metrics["tokens/trajectories_without_ids"] == 1.0
    np.testing.assert_array_equal(tokens.traj_index, [0])
    np.testing.assert_array_equal(tokens.input_ids[0], [1, 2, 3, 10, 11, 20, 21, 12])
    np.testing.assert_array_equal(tokens.loss_mask[0], [0, 0, 0, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(tokens.attention_mask[0], [1] * 8)
    np.testing.assert_allclose(tokens.rollout_logprobs[0],
                               [0, 0, 0, -0.1, -0.2, 0, 0, -0.3], rtol=1e-6)
    np.testing.assert_allclose(tokens.scores, [1.5])


def test_trajectory_form_pads_to_the_longest() -> None:
    short = [step([1, 2], [9], [-1.0])]
    batch = make_batch([traj(0, 0, A, 1.5), traj(0, 1, short, 0.0)])
    tokens = batch.trajectory_tokens(pad_id=-7)
    assert tokens.input_ids.shape == (2, 8) and tokens.non_extending == 0
    np.testing.assert_array_equal(tokens.lengths, [8, 3])
    np.testing.assert_array_equal(tokens.input_ids[1], [1, 2, 9, -7, -7, -7, -7, -7])
    np.testing.assert_array_equal(tokens.attention_mask[1], [1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(tokens.loss_mask[1], [0, 0, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(tokens.group_index, [0, 0])


def test_a_prompt_shorter_than_the_history_is_not_extending() -> None:
    shrunk = [step([1, 2, 3], [10, 11], [-0.1, -0.2]), step([1, 2, 3, 10], [12], [-0.3])]
    tokens = make_batch([traj(0, 0, shrunk, 0.0)]).trajectory_tokens()
    assert len(tokens) == 0 and tokens.non_extending == 1
    assert tokens.input_ids.shape == (0, 0)


def test_logprobs_are_fitted_to_the_response() -> None:
    uneven = [step([1], [5, 6, 7], [-0.5])]  # fewer logprobs than tokens: the rest are 0
    tokens = make_batch([traj(0, 0, uneven, 0.0)]).turn_tokens()
    np.testing.assert_allclose(tokens.logprobs, [[-0.5, 0.0, 0.0]])


def test_step_arrays_are_padded_per_trajectory_in_order() -> None:
    # ragged lengths: every row holds its own steps from column 0, the rest masked out
    short = traj(0, 0, [step(None, None, None, reward=1.0)], 1.0)
    long = traj(0, 1, [step(None, None, None, reward=r) for r in (0.25, 0.5, 2.0)], 2.75)
    long["steps"][2]["action"] = 3
    batch = make_batch([long, short])
    assert batch.mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.rewards.tolist() == [[0.25, 0.5, 2.0], [1.0, 0.0, 0.0]]
    assert batch.actions is not None and batch.actions.tolist() == [[0, 0, 3], [0, 0, 0]]
    # an action that is not an integer anywhere: no actions array (the trajectories keep them)
    long["steps"][1]["action"] = "Up"
    assert make_batch([long, short]).actions is None
    empty = make_batch([])
    assert empty.mask.shape == (0, 0) and empty.actions is not None
