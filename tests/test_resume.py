"""`policy.partial_rollout.in_flight: resume` (token-in/token-out only): a turn a weight
update aborts is continued from the tokens the aborting answer carried, against the stand-in
LLM server on loopback (vLLM 0.33 and SGLang 0.5.23 flavors, whose abort answers carry the
tokens so far as the released servers' do) with real producers, a real Batcher and the
trainer's `ModelServers` (pause mode abort):
- the finished turn's response ids are exactly what the server sampled across its requests,
  in order, each once (never doubled), and nothing generated is discarded;
- the partial's tokens keep the version that sampled them (`version_spans`);
- `resume` without `policy.tokenizer` is a one-line config error (exit 2 from the CLI);
- the counters: turns resumed (and kept, in keep mode) on `/metrics`, in the stats record and
  `rollstream status`.

Every situation is made to happen: the server holds the completions in flight (`hold`) while
the update aborts them, and the tests wait for its counters, never for a timer alone.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from helpers import stream_messages, wait_for
from llm_helpers import discarded, fake_llm_factory, lake_config, run_steps
from real_servers import load_tiny_model_script

from consumer import Batcher, ModelServers
from consumer.batch import Batch
from consumer.partial import keeping_pause_mode
from producers import metrics
from producers.llm import tito
from producers.partial import InFlightRule
from producers.policies.protocol import Turn
from schemas.config import RolloutConfig
from schemas.errors import ConfigError

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

fake_llm = pytest.fixture(fake_llm_factory)
URL = ["http://127.0.0.1:1/v1"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    load_tiny_model_script().generate(out, seed=0)
    return out


def continued(how: str) -> int:
    return sum(n for (_, h), n in list(metrics.LLM.continued.items()) if h == how)


# -- the config ---------------------------------------------------------------------------------
def test_resume_needs_token_in_token_out(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"partial_rollout\.in_flight: resume needs "
                                          r"policy\.tokenizer") as caught:
        lake_config(URL, partial_rollout={"in_flight": "resume"})
    assert "\n" not in str(caught.value)
    base = {"rollout_batch_size": 8, "val_env_manager": None,
            "train_env_manager": {"num_env_groups": 2, "group_size": 4, "tags": ["FrozenLake"]}}
    llm = {"base_urls": URL, "model": "m"}
    for policy, where in (({"type": "random"}, "policy.tokenizer"),
                          ({"type": "python", "entrypoint": "x.y:z"}, "policy.llm.tokenizer"),
                          ({"type": "python", "entrypoint": "x.y:z", "llm": llm},
                           "policy.llm.tokenizer")):
        with pytest.raises(ConfigError, match=f"resume needs {where} "):
            RolloutConfig.from_dict({**base, "policy": {
                **policy, "partial_rollout": {"in_flight": "resume"}}})
    # a python policy's agent calls resume with its llm's tokenizer (tests/test_agent_policy)
    agent = RolloutConfig.from_dict({**base, "policy": {
        "type": "python", "entrypoint": "x.y:z", "llm": {**llm, "tokenizer": "/t"},
        "partial_rollout": {"in_flight": "resume"}}})
    assert agent.policy.partial_rollout.in_flight == "resume"
    config = lake_config(URL, tokenizer="/some/tokenizer", partial_rollout={"in_flight": "resume"})
    policy = config.policy
    assert policy.partial_rollout.in_flight == "resume"
    # the trainer's side aborts (vLLM abort, SGLang's aborting update); a pause closes
    # the turns in flight (nothing to resume from), as abort does
    assert [keeping_pause_mode(m, policy) for m in ("vllm", "sglang", "vllm-lora")] == \
        ["abort", None, None]
    rule = InFlightRule(lake_config(URL, ratio=1, tokenizer="/t",
                                    partial_rollout={"in_flight": "resume"}))
    assert rule.must_cut(None, frozenset({"operator"}))


def test_the_cli_refuses_resume_without_a_tokenizer_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = tmp_path / "run.yaml"
    config.write_text("policy:\n  type: openai\n  base_urls: http://127.0.0.1:1/v1\n"
                      "  model: m\n  partial_rollout: {in_flight: resume}\n"
                      "train_env_manager: {num_env_groups: 1, group_size: 2, tags: [FrozenLake]}\n"
                      "val_env_manager: null\n")
    done = subprocess.run([sys.executable, "-m", "rollstream", "config", "check", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "partial_rollout.in_flight" in lines[0] \
        and "policy.tokenizer" in lines[0] and "Traceback" not in done.stderr


# -- the pieces of a resumed turn (pure) -----------------------------------------------------
def piece(ids: list[int], logprobs: list[float], finish: str, version: int | None,
          spans: list[list[int]] | None = None) -> Turn:
    turn = Turn(text="".join(f"<{i}>" for i in ids), response_ids=np.asarray(ids),
                logprobs=np.asarray(logprobs), finish_reason=finish, version=version,
                version_source=None if version is None else "server")
    if spans:
        turn.extra["version_spans"] = spans
    return turn


def test_a_resumed_turn_is_its_pieces_once_each_with_their_versions() -> None:
    resumed = tito.Resumed.start([1, 2, 3])
    resumed.add(piece([10, 11], [-0.1, -0.2], "abort", 4), 9, "recorded")
    assert resumed.next_prompt() == [1, 2, 3, 10, 11] and resumed.left(8) == 6
    resumed.add(piece([12], [-0.3], "abort", None), 5, "recorded")  # no label: recorded 5
    assert resumed.next_prompt() == [1, 2, 3, 10, 11, 12]
    last = piece([13, 14, 15], [-0.4, -0.5, -0.6], "stop", 5, [[5, 0, 1], [6, 1, 3]])
    turn = resumed.finish(last, 9, "recorded")
    assert turn.response_ids.tolist() == [10, 11, 12, 13, 14, 15]
    assert turn.prompt_ids.tolist() == [1, 2, 3]
    assert np.allclose(turn.logprobs, [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    assert turn.extra["version_spans"] == [[4, 0, 2], [5, 2, 4], [6, 4, 6]]
    assert turn.version == 4 and turn.version_source == "recorded"
    assert turn.finish_reason == "stop" and turn.extra["resumed"] == 2
    assert turn.text == "<10><11><12><13><14><15>"
    one = tito.Resumed.start([1])
    one.add(piece([7], [-1.0], "abort", 3), 0, "producer")
    whole = one.finish(piece([8], [-1.0], "stop", 3), 0, "producer")
    assert "version_spans" not in whole.extra and whole.version == 3  # one version: no spans
    assert whole.version_source == "server"


# -- async: a weight update aborts turns in flight, they resume ------------------------------
@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_an_aborted_turn_resumes_from_its_tokens_never_doubled(
        fake_llm, producer_thread, r: redis.Redis, run: str, model_dir: Path,
        flavor: str) -> None:
    """The server holds every completion; the update (vLLM `/pause?mode=abort`, SGLang's
    aborting `update_weights_from_disk`) aborts the held ones, each answering the first half
    of its reply at version 1; the producer sends the continuation (prompt + those ids,
    max_tokens less them), held too until the update is done, then answered at version 2.
    Every trajectory step is exactly the server's answers to its seed, in order; the first
    span keeps version 1; nothing is discarded and every generated token is carried."""
    server = fake_llm(flavor=flavor, tokenizer=str(model_dir / "tokenizer.json"),
                      latency_s=0.003, load_time_s=0.05, p_good=0.3, malformed_share=1.0)
    config = lake_config([server.base_url], ratio=1, tokenizer=str(model_dir),
                         partial_rollout={"in_flight": "resume"})
    batcher = Batcher(r, config, run=run)
    servers = ModelServers.for_batcher(batcher, flavor, watch_s=None)
    assert servers.pause_mode == {"vllm": "abort", "sglang": None}[flavor]
    lost, resumed_before = discarded(), continued("resumed")
    producer = producer_thread()
    batches = run_steps(batcher, servers, 1)  # the server holds version 1, the run too

    server.hold()
    wait_for(lambda: server.stats["held"] >= 4, what="turns held in flight at version 1")
    aborted = server.stats["aborted"]
    updater = threading.Thread(target=servers.update, args=(2, "/ckpt/2"))
    updater.start()
    wait_for(lambda: server.options.weight_version == "2", what="the update under the hold")
    wait_for(lambda: server.stats["aborted"] > aborted, what="the update to abort them")
    updater.join(30)
    server.release()
    wait_for(lambda: _cursors_at(r, batcher.keys, 3) and server.in_flight == 0,
             what="every admitted episode committed")
    trajs = [t for b in batches for t in b.trajectories] + stream_messages(r, batcher.keys,
                                                                           config)
    assert len(trajs) == 16 * 3

    by_seed: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for answer in list(server.answers):
        by_seed[answer["seed"]].append(answer)
    steps = [(step, seed) for traj in trajs
             for step, seed in zip(traj["steps"], _seeds(traj), strict=True)]
    resumed = [(step, seed) for step, seed in steps if step.get("resumed")]
    assert resumed, "no turn was resumed"
    for step, seed in steps:
        answers = by_seed[seed]
        # what the server sampled for this turn across its requests, in order, once each
        sampled = [i for a in answers for i in a["ids"]]
        assert step["response_ids"].tolist() == sampled
        assert [a["finish_reason"] for a in answers[:-1]] == ["abort"] * (len(answers) - 1)
        assert len(step["logprobs"]) == len(step["response_ids"])
        assert step.get("resumed", 0) == len(answers) - 1
    held = 0
    for step, seed in resumed:
        answers = by_seed[seed]
        assert len(answers[0]["ids"]) > 0
        # each piece keeps the version that sampled it (the old weights' before the abort,
        # the new ones' after): the spans are the answers' versions over their tokens
        spans: list[list[int]] = []
        for a in answers:
            label = a["weight_version"]  # "default": the launch weights, version 0
            version, n = (int(label) if label.isdigit() else 0), len(a["ids"])
            at = spans[-1][2] if spans else 0
            if spans and spans[-1][0] == version:
                spans[-1][2] = at + n
            elif n:
                spans.append([version, at, at + n])
        assert len(spans) > 1 and step["version_spans"] == spans
        assert step["version"] == spans[0][0] < spans[-1][0]
        held += spans[0][0] == 1  # aborted by the update under the hold (1 -> 2)
        # its latency is every piece's request (each one at least the server's own time
        # for it), not the last piece's alone: the held piece waited out the update
        assert step["latency_s"] >= sum(a["elapsed_s"] for a in answers)
    assert held, "no turn held at version 1 was resumed"
    # each continuation's prompt is the turn's prompt and every id sampled before it (never
    # the prompt alone: a reply sampled again from scratch would double the partial's span),
    # its cap the turn's less those ids
    sent: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for body in list(server.requests):
        sent[body["seed"]].append(body)
    for step, seed in resumed:
        prompt, response = step["prompt_ids"].tolist(), step["response_ids"].tolist()
        bodies = [b for b in sent[seed] if b["prompt"][:len(prompt)] == prompt]
        assert len(bodies) >= len(by_seed[seed])  # (503s during vLLM's pause: sent again)
        done = 0
        for body in bodies:
            assert body["prompt"] == prompt + response[:len(body["prompt"]) - len(prompt)]
            assert body["max_tokens"] == bodies[0]["max_tokens"] - (len(body["prompt"])
                                                                    - len(prompt))
            done = max(done, len(body["prompt"]) - len(prompt))
        assert done == sum(len(a["ids"]) for a in by_seed[seed][:-1])
    assert discarded() == lost  # nothing thrown away
    assert server.stats["tokens_generated"] == sum(len(s["response_ids"]) for s, _ in steps)
    assert continued("resumed") - resumed_before == len(resumed)
    tokens = Batch("train", 2, trajs, [], {}).trajectory_tokens()
    for row, i in enumerate(tokens.traj_index):  # per-token versions follow the spans
        for t, step in enumerate(trajs[i]["steps"]):
            got = tokens.token_versions[row][tokens.turn_ids[row] == t].tolist()
            rows = step.get("version_spans") or [[step["version"], 0,
                                                  len(step["response_ids"])]]
            assert got == [v for v, start, end in rows for _ in range(start, end)]
    record = producer.producer.stats.record()  # what `rollstream status` shows
    assert record.turns_continued["resumed"] == continued("resumed")
    page = {f.name: f for f in metrics.LLM.families()}
    assert sum(sample.value for sample in page["rollstream_turns_resumed"].samples
               if sample.name.endswith("_total")) == continued("resumed")
    # `rollstream status`: its JSON document and its text, from the producers' records
    from rollstream.status.render import render_text
    from rollstream.status.snapshot import snapshot

    wait_for(lambda: snapshot(r, batcher.keys, config)["turns_continued"]["resumed"]
             == continued("resumed"), what="the stats record to carry the resumed turns")
    snap = snapshot(r, batcher.keys, config)
    assert snap["turns_continued"] == {"kept": continued("kept"), "resumed": continued("resumed")}
    assert (f"turns across weight updates: kept {continued('kept')}, resumed "
            f"{continued('resumed')}") in render_text(snap)


def _cursors_at(r: redis.Redis, keys: Any, k: int) -> bool:
    values = r.hvals(keys.cursor("train"))
    return len(values) == 16 and all(int(v) == k for v in values)


def _seeds(traj: dict[str, Any]) -> list[int]:
    from llm_helpers import step_seeds
    return step_seeds(traj)


def test_a_continuation_aborted_while_the_server_loads_waits_and_resumes(
        fake_llm, model_dir: Path) -> None:
    """SGLang flavor that aborts what comes while it loads (`during_load: abort`): the update
    aborts the held turn (its tokens so far come back); each continuation sent during the
    1 s load is aborted at once with no token and the policy waits `RESUME_WAIT_S` before the
    next (a handful of requests, not a busy loop); after the load the continuation finishes
    the turn: the partial + the rest, each token once."""
    import asyncio

    from llm_helpers import http

    from producers.envs import build_env
    from producers.policies import make_policy
    from producers.policies.protocol import StepContext

    server = fake_llm(flavor="sglang", tokenizer=str(model_dir / "tokenizer.json"),
                      load_time_s=1.0, during_load="abort", latency_s=0.001)
    config = lake_config([server.base_url], tokenizer=str(model_dir),
                         partial_rollout={"in_flight": "resume"})
    env = build_env(config, "Lake")
    obs, _ = env.reset(seed=5)
    ctx = StepContext(env=env, seed=5, version=0, mode="train", group_id=0, episode_id=0,
                      member=0, tag="Lake")
    server.hold()

    async def scenario() -> Any:
        policy = make_policy(config.policy)
        await policy.start()
        try:
            turn = asyncio.create_task(policy.act(obs, ctx))
            while server.stats["held"] < 1:
                await asyncio.sleep(0.01)
            update = asyncio.create_task(asyncio.to_thread(
                http, f"{server.url}/update_weights_from_disk",
                {"model_path": "/ckpt/1", "weight_version": "1", "abort_all_requests": True}))
            while not (server.stats["held"] >= 1 and not server.loading and update.done()):
                await asyncio.sleep(0.01)  # the continuation held after the load
            server.release()
            return (await asyncio.wait_for(turn, 30))[1]
        finally:
            await policy.close()

    turn = asyncio.run(scenario())
    assert server.stats["completions"] <= 1.0 / 0.2 + 4  # waited between them, no busy loop
    answers = list(server.answers)
    ids = [i for a in answers for i in a["ids"]]
    assert turn.response_ids.tolist() == ids and len(answers[0]["ids"]) > 0
    empty = [a for a in answers if a["finish_reason"] == "abort" and not a["ids"]]
    assert empty, "no continuation came during the load"
    assert turn.extra["resumed"] == len(answers) - 1
    assert turn.version == 0 and turn.extra["version_spans"] == [
        [0, 0, len(answers[0]["ids"])], [1, len(answers[0]["ids"]), len(ids)]]
