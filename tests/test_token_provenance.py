"""Per-token provenance (issue 31): the version that sampled each token, the staleness bound
counted on a trajectory's oldest token, and the trainer's token arrays lining up turn
boundaries, per-token versions, last-token rewards and behaviour logprobs.

- the token arrays: hand-built trajectories through the real codec (pure logic);
- the oldest-token rule: an episode played by `play_episode` with a turn that spans two
  versions, committed to the real Redis and judged by a real Batcher (its tokens counted as
  discarded, on `/metrics` and in `rollstream status`); a held group expired by a publish;
- an episode abandoned after a turn (the gate gives it up once the version moved) counts that
  turn's tokens on the producer's side;
- a full-weights turn that a server without spans answers across a recorded update (the
  stand-in's vLLM 0.10.2 flavor): labelled with both ends, never the newer alone;
- across a real async weight update with the stand-in server: in
  tests/test_partial_rollout.py (the per-token versions of a kept turn, and the tokens of
  aborted turns counted as discarded).
"""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import redis
from helpers import ONE_STEP_ENV_ID, publish, small_config
from llm_helpers import fake_llm_factory

from consumer import Batcher
from consumer.batch import Batch, turn_versions
from consumer.metrics import batcher_families
from producers import metrics
from producers.control import ControlState
from producers.envs import make_env
from producers.policies.protocol import StepContext, Turn
from producers.rollout import EnvSlot, play_episode
from rollstream.status.render import render_text
from rollstream.status.snapshot import snapshot
from schemas.codec import ENTRY_FIELD, decode_trajectory, encode_trajectory, traj_ids
from schemas.errors import BatchTimeout

fake_llm = pytest.fixture(fake_llm_factory)


def step(prompt: list[int], response: list[int], logprobs: list[float], reward: float,
         version: int, spans: list[list[int]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "observation": "o", "action": 0, "reward": reward, "version": version, "info": {},
        "response": "text", "prompt_ids": np.array(prompt, dtype=np.int32),
        "response_ids": np.array(response, dtype=np.int32),
        "logprobs": np.array(logprobs, dtype=np.float32)}
    if spans is not None:
        out["version_spans"] = spans
    return out


def traj(member: int, steps: list[dict[str, Any]]) -> dict[str, Any]:
    msg = {
        "traj_id": f"train-0-0-{member}", "traj_group_id": "train-0-0", "mode": "train",
        "group_id": 0, "episode_id": 0, "member": member, "env_id": member,
        "tag": "FrozenLake", "seed": 1, "version_start": steps[0]["version"],
        "version_end": steps[-1]["version"], "episode_score": 1.0, "success": True,
        "terminated": True, "truncated": False, "num_actions": len(steps), "steps": steps,
        "producer": "p",
    }
    return decode_trajectory(encode_trajectory(msg))


def two_turns() -> list[dict[str, Any]]:
    """Member 0: turn 0 (prompt 1 2, reply 3 4 5 sampled by v4) then turn 1 (prompt adds 6,
    reply 7 8 9 10: 7 8 by v4, 9 10 by v5, a turn kept through an update). Member 1: one
    turn of v5."""
    first = step([1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], 0.5, 4)
    second = step([1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [-1.0, -2.0, -3.0, -4.0], 2.0, 4,
                  spans=[[4, 0, 2], [5, 2, 4]])
    lone = step([1, 2], [11, 12], [-0.5, -0.6], 1.0, 5)
    return [traj(0, [first, second]), traj(1, [lone])]


def test_trajectory_tokens_line_up_turns_versions_rewards_and_logprobs() -> None:
    batch = Batch("train", 6, two_turns(), [], {})
    tokens = batch.trajectory_tokens(pad_id=-9)
    assert tokens.input_ids[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert tokens.loss_mask[0].tolist() == [0, 0, 1, 1, 1, 0, 1, 1, 1, 1]
    assert tokens.turn_ids[0].tolist() == [-1, -1, 0, 0, 0, -1, 1, 1, 1, 1]
    assert tokens.token_versions[0].tolist() == [-1, -1, 4, 4, 4, -1, 4, 4, 5, 5]
    assert tokens.token_rewards[0].tolist() == [0, 0, 0, 0, 0.5, 0, 0, 0, 0, 2.0]
    np.testing.assert_allclose(tokens.rollout_logprobs[0],
                               [0, 0, -0.1, -0.2, -0.3, 0, -1, -2, -3, -4])
    # member 1 is shorter: padding is -1 turn and version, 0 reward
    assert tokens.turn_ids[1].tolist() == [-1, -1, 0, 0] + [-1] * 6
    assert tokens.token_versions[1].tolist() == [-1, -1, 5, 5] + [-1] * 6
    assert tokens.token_rewards[1].tolist() == [0, 0, 0, 1.0] + [0] * 6
    # every generated token has a version and a turn; no other token has either
    generated = tokens.loss_mask.astype(bool)
    assert ((tokens.turn_ids >= 0) == generated).all()
    assert ((tokens.token_versions >= 0) == generated).all()
    # the rewards sum to the steps' rewards, each on its turn's last token
    assert tokens.token_rewards.sum(axis=1).tolist() == [2.5, 1.0]
    for row in range(2):
        for t in set(tokens.turn_ids[row][generated[row]].tolist()):
            last = np.flatnonzero(tokens.turn_ids[row] == t)[-1]
            assert tokens.token_rewards[row, last] == batch.trajectories[row]["steps"][t][
                "reward"]


def test_turn_tokens_carry_versions_rewards_and_the_oldest_version() -> None:
    turns = Batch("train", 6, two_turns(), [], {}).turn_tokens()
    assert turns.response_versions.tolist() == [[4, 4, 4, -1], [4, 4, 5, 5], [5, 5, -1, -1]]
    assert turns.token_rewards.tolist() == [[0, 0, 0.5, 0], [0, 0, 0, 2.0], [0, 1.0, 0, 0]]
    assert turns.versions.tolist() == [4, 4, 5]  # the oldest token's, never the newest
    assert turns.rewards.tolist() == [0.5, 2.0, 1.0]  # unchanged


def test_truncated_importance_weights_need_no_glue() -> None:
    """The docs' example: behaviour logprobs and per-token versions straight from the
    arrays; the stale tokens (sampled by v4, trained at v6) are the ones a trainer may
    reweight."""
    tokens = Batch("train", 6, two_turns(), [], {}).trajectory_tokens()
    new_logprobs = tokens.rollout_logprobs + 0.5 * tokens.loss_mask  # the trainer's pass
    ratio = np.exp(new_logprobs - tokens.rollout_logprobs)
    tis = np.minimum(ratio, 2.0) * tokens.loss_mask
    assert np.allclose(tis[tokens.loss_mask == 1], np.exp(0.5))
    staleness = np.where(tokens.loss_mask == 1, 6 - tokens.token_versions, 0)
    assert staleness[0].tolist() == [0, 0, 2, 2, 2, 0, 2, 2, 1, 1]


def test_turn_versions_never_label_a_token_newer_than_it_came_from() -> None:
    """Tokens no span covers get the oldest span's version, not the step's."""
    assert turn_versions({"version": 7, "version_spans": [[3, 0, 1], [7, 1, 2]]},
                         3).tolist() == [3, 7, 3]
    assert turn_versions({"version": 2}, 2).tolist() == [2, 2]


class SpanningPolicy:
    """Answers one turn generated by versions 1 (first two tokens) and 3 (last two): a turn
    kept through updates, labelled with its oldest token as the server's spans say."""

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, Turn]:
        return 0, Turn(text="x", prompt_ids=[1, 2], response_ids=[3, 4, 5, 6],
                       logprobs=[-1.0] * 4, version=1, version_source="server",
                       extra={"version_spans": [[1, 0, 2], [3, 2, 4]]})


def test_the_staleness_bound_counts_a_trajectorys_oldest_token(r: redis.Redis,
                                                                run: str) -> None:
    """Async, ratio 1, the run at version 3. An episode of step 3 (not expired) whose one
    turn began under version 1 and finished under 3: its oldest token is 2 versions behind,
    so the Batcher drops it as stale (counted, with its 4 tokens discarded). Labelled by its
    newest token (3) it would pass."""
    config = small_config(async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    for _ in range(3):
        publish(batcher)
    assert batcher.version == 3
    k = 12  # created at step 3 (4 episodes per step): live, admitted at version 3

    async def play(member: int) -> dict[str, Any]:
        async def gate() -> bool:
            return True

        slot = EnvSlot(mode="train", env_id=member, group_id=0, member=member, shard=0,
                       tag="FrozenLake", env=make_env(ONE_STEP_ENV_ID, {}), k=k)
        control = ControlState()
        control.version = 3
        return await play_episode(slot, seed=1, producer_id="p", policy=SpanningPolicy(),
                                  control=control, gate=gate)

    trajs = [asyncio.run(play(member)) for member in range(4)]
    assert all(t["version_start"] == 1 and t["version_end"] == 3 for t in trajs)
    for t in trajs:
        group_key, traj_key = traj_ids("train", 0, k, t["member"])
        assert (t["traj_group_id"], t["traj_id"]) == (group_key, traj_key)
        r.xadd(batcher.keys.stream("train", 0), {ENTRY_FIELD: encode_trajectory(t)})
    with pytest.raises(BatchTimeout):  # looks once: the group is read and dropped
        batcher.get_batch(timeout_s=0)
    totals = batcher._shared.totals
    assert totals["scheduler/stale_dropped"] == 4
    assert totals["tokens_discarded/stale"] == 16
    # on the trainer's /metrics and in `rollstream status` (the batcher's state record)
    families = {f.name: f for f in batcher_families(batcher._shared, r, batcher.keys)}
    samples = families["rollstream_batcher_tokens_discarded"].samples
    assert [(s.labels, s.value) for s in samples] == [({"mode": "train", "reason": "stale"},
                                                       16)]
    snap = snapshot(r, batcher.keys, config)
    assert snap["tokens_discarded"]["stale"] == 16
    assert "tokens discarded: " in render_text(snap) and "stale 16" in render_text(snap)


def test_aborted_tokens_are_counted_by_mode_and_reason() -> None:
    before = dict(metrics.LLM.discarded)
    metrics.tokens_discarded("train", "aborted", 5)
    assert metrics.LLM.discarded[("train", "aborted")] == before.get(("train", "aborted"),
                                                                     0) + 5
    text = "".join(str(f) for f in metrics.LLM.families())
    assert "rollstream_tokens_discarded" in text


def test_a_full_weights_turn_updated_mid_turn_records_both_ends(fake_llm) -> None:
    """vLLM 0.10.2 (no per-token spans), full weights: the run records version 2 for the
    server while a turn sent at version 1 is held; the answer is labelled 1 (its first tokens
    are version 1's) with `version_end` 2, never 2 alone."""
    from test_llm_pool import run_pool

    from schemas.policy import ServerRecord

    server = fake_llm(flavor="vllm010", latency_s=0.001)
    server.hold()
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True, "return_token_ids": True, "seed": 1}

    async def scenario(pool: Any) -> Any:
        await pool.check_model("fake-model")
        pool.set_versions({server.base_url: ServerRecord(1, checkpoint="/ckpt/1")})
        turn = asyncio.create_task(pool.chat(body))
        while server.stats["held"] < 1:
            await asyncio.sleep(0.01)
        pool.set_versions({server.base_url: ServerRecord(2, checkpoint="/ckpt/2")})
        server.release()
        return await asyncio.wait_for(turn, 10)

    answer = run_pool([server.base_url], scenario)
    assert "weight_versions" not in answer.data["choices"][0]
    assert (answer.version, answer.version_end) == (1, 2)


def test_a_held_group_expired_by_a_publish_counts_its_tokens(r: redis.Redis, run: str) -> None:
    """Sync: three of four members of step 0's episode are held when version 1 is published;
    the batcher drops the group as expired (the sync hand-out's unfinished episode) and counts
    the 3 x 5 tokens its members generated under `tokens_discarded/stale`."""
    config = small_config()
    batcher = Batcher(r, config, run=run)
    reply = [step([1, 2], [3, 4, 5, 6, 7], [-1.0] * 5, 0.0, 0)]
    for member in range(3):
        msg = traj(member, reply)
        r.xadd(batcher.keys.stream("train", 0), {ENTRY_FIELD: encode_trajectory(msg)})
    with pytest.raises(BatchTimeout):
        batcher.get_batch(timeout_s=0)  # read and held: the group is partial
    assert batcher._shared.totals["tokens_discarded/stale"] == 0
    publish(batcher)
    with pytest.raises(BatchTimeout):
        batcher.get_batch(timeout_s=0)
    assert batcher._shared.totals["scheduler/stale_dropped"] == 3
    assert batcher._shared.totals["tokens_discarded/stale"] == 15


class TwoStepEnv(gym.Env):
    """Ends after its second step."""

    observation_space = gym.spaces.Discrete(3)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return 0, {}

    def step(self, action: int):
        self.t += 1
        return self.t, 0.0, self.t >= 2, False, {}


class ExpiringPolicy:
    """Answers a 3-token turn, then the run moves on under the episode (the control state
    changes: the gate runs again before the next turn, and gives the episode up)."""

    def __init__(self, control: ControlState):
        self.control = control

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, Turn]:
        self.control.update(1, frozenset(), 0, False)
        return 0, Turn(text="x", prompt_ids=[1], response_ids=[2, 3, 4], logprobs=[-1.0] * 3)


def test_an_abandoned_episodes_tokens_are_counted() -> None:
    """An episode given up after one turn (its gate says no once the version moved: an
    expiry) counts that turn's 3 tokens as discarded, `abandoned`, on the producer's
    /metrics."""
    from producers.rollout import Abandoned

    before = metrics.LLM.discarded.get(("train", "abandoned"), 0)
    control = ControlState()
    gates: list[int] = []

    async def gate() -> bool:
        gates.append(control.version)
        return control.version == 0

    async def play() -> None:
        slot = EnvSlot(mode="train", env_id=0, group_id=0, member=0, shard=0, tag="Two",
                       env=TwoStepEnv())
        await play_episode(slot, seed=1, producer_id="p", policy=ExpiringPolicy(control),
                           control=control, gate=gate)

    with pytest.raises(Abandoned):
        asyncio.run(play())
    assert gates == [0, 1]
    assert metrics.LLM.discarded[("train", "abandoned")] - before == 3
