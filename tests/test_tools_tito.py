"""Tool calls under token-in/token-out (`policy.tokenizer`, docs/tools.md): the tools rendered
into the prompt by the producer (the generated tokenizer's `tools/` template, ChatML with
Qwen3's tool parts), the calls read from the sampled text, the results as `tool` messages
whose tokens come from the template's suffix, every round recorded with its own prompt
(`model_calls`), and the checked math task end to end through the stand-in's
`/v1/completions`: the trajectory's tokens extend across the rounds, the sampled tokens are
trainable, the tool results are not."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from helpers import ROOT, run_cli, small_config
from llm_helpers import MODEL, fake_llm_factory
from real_servers import load_tiny_model_script

from consumer import Batcher
from producers.llm import tito
from producers.llm.template import ChatTemplate
from producers.policies import StepContext, make_policy
from schemas.config import RolloutConfig
from schemas.errors import ConfigError, PolicyError
from schemas.tools import PYTHON_SCHEMA, ToolsSpec

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
fake_llm = pytest.fixture(fake_llm_factory)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    load_tiny_model_script().generate(out, seed=0)
    return out


# -- the template: tools as the server renders them ---------------------------------------
def test_tools_render_as_transformers_renders_them(model_dir: Path) -> None:
    """The schemas go in through transformers' own `tojson` (json.dumps: keys in their order,
    no HTML escaping), as a server applying the template to a chat request's `tools` writes
    them; jinja2's own filter would sort the keys and escape `<`, `>`, `&` and `'`."""
    template = ChatTemplate.load(str(model_dir / "tools"))
    schema = {"type": "function", "function": {
        "name": "python", "description": "Run <code> & print it: 'é'",
        "parameters": {"type": "object", "required": ["code"],
                       "properties": {"code": {"type": "string"}}}}}
    messages = [{"role": "system", "content": "Solve."}, {"role": "user", "content": "2 + 2?"}]
    text = template.render(messages, add_generation_prompt=True, tools=[schema])
    assert f"<tools>\n{json.dumps(schema, ensure_ascii=False)}\n</tools>" in text
    assert text.startswith("<|im_start|>system\nSolve.\n\n# Tools\n")
    assert text.endswith("<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    # without tools, the tools template renders plain ChatML exactly
    plain = ChatTemplate.load(str(model_dir))
    assert template.prompt_ids(messages) == plain.prompt_ids(messages)
    assert template.prompt_ids(messages, [schema]) == template.encode(text)


def test_tool_messages_follow_a_reply_as_qwen_renders_them(model_dir: Path) -> None:
    template = ChatTemplate.load(str(model_dir / "tools"))
    results = [{"role": "tool", "tool_call_id": "call_0_0_0", "content": "5"},
               {"role": "tool", "tool_call_id": "call_0_0_1", "content": "12"}]
    # consecutive tool messages share one user turn, each result a <tool_response>
    assert template.decode(template.suffix_ids(results)) == (
        "user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n12\n"
        "</tool_response>\nassistant\n")  # <|im_start|>, <|im_end|> are special: skipped


def test_a_qwen3_template_extends_its_turns(model_dir: Path) -> None:
    """Qwen3's template renders a reply that is last with an empty <think> block and one
    followed by messages without: the suffix is cut after the reply's close, and each next
    prompt extends the last prompt and sampled ids exactly (the thinking kept as sampled)."""
    template = ChatTemplate.load(str(model_dir / "tools"))
    exchange = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    last = template.render(exchange, add_generation_prompt=False)
    assert "<think>\n\n</think>" in last  # Qwen3's: the last reply gets an empty block
    followed = template.render([*exchange, {"role": "user", "content": "z"}], True)
    assert not followed.startswith(last)  # so the exchange is no prefix
    scratch: dict[str, Any] = {}
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Solve."}]
    end = template.tokenizer.token_to_id("<|im_end|>")
    turns = []
    for user, reply in [("2 + 2?", "<think>easy</think>\n4"), ("Again?", "<think>so</think>5"),
                        ("Once more.", "6")]:
        messages.append({"role": "user", "content": user})
        prompt = tito.prompt_ids(template, scratch, messages, [PYTHON_SCHEMA]).tolist()
        sampled = [*template.encode(reply), end]
        messages.append({"role": "assistant", "content": reply})
        tito.remember(scratch, messages, prompt, sampled)
        turns.append((prompt, sampled))
    for (before, sampled), (after, _) in zip(turns, turns[1:], strict=False):
        assert after[:len(before) + len(sampled)] == before + sampled
    assert template.decode(turns[2][0][len(turns[1][0]) + len(turns[1][1]):]) == (
        "\nuser\nOnce more.\nassistant\n")
    assert "easy" in template.decode(turns[2][0])  # re-rendered, Qwen3 would drop it


# -- the stand-in: scripted Hermes calls in completions ---------------------------------------
def ask(server: Any, template: ChatTemplate, ids: list[int]) -> str:
    from llm_helpers import http
    status, body = http(f"{server.base_url}/completions", {
        "model": MODEL, "prompt": ids, "max_tokens": 256, "temperature": 0,
        "return_token_ids": True, "logprobs": 1})
    assert status == 200, body
    choice = body["choices"][0]
    assert template.decode(choice["token_ids"]) == choice["text"]
    return str(choice["text"])


def test_the_stand_in_calls_a_rendered_tool_and_answers_its_result(fake_llm,
                                                                   model_dir: Path) -> None:
    server = fake_llm(tokenizer=str(model_dir / "tokenizer.json"), malformed_share=0.0)
    template = ChatTemplate.load(str(model_dir / "tools"))
    messages = [{"role": "user", "content": "Calculate 6 * 7."}]
    assert "<tool_call>" not in ask(server, template, template.prompt_ids(messages))
    first = ask(server, template, template.prompt_ids(messages, [PYTHON_SCHEMA]))
    (block,) = [b.split("</tool_call>")[0] for b in first.split("<tool_call>")[1:]]
    assert json.loads(block)["name"] == "python" and "6 * 7" in block
    messages += [{"role": "assistant", "content": first},
                 {"role": "tool", "tool_call_id": "c", "content": "42\n"}]
    assert "\\boxed{42}" in ask(server, template, template.prompt_ids(messages, [PYTHON_SCHEMA]))


# -- the policy's tool rounds ------------------------------------------------------------------
class Sums:
    """A bare env with the python tool: the reply is the action."""

    def __init__(self, spec: ToolsSpec) -> None:
        self.tool_spec, self.unwrapped = spec, self
        self.spec, self.max_steps, self.instruction = None, 5, "Compute."

    def parse_action(self, text: str) -> str:
        return text


def policy_for(server: Any, tokenizer: Path) -> Any:
    return make_policy(small_config(policy={
        "type": "openai", "base_urls": [server.base_url], "model": MODEL, "max_tokens": 256,
        "tokenizer": str(tokenizer)}).policy)


def test_a_turn_cut_short_between_rounds_leaves_the_conversation_ids(fake_llm,
                                                                     model_dir: Path) -> None:
    """Turn 2 calls the tool; its second request is cut short: the episode's ids are those
    turn 1 left (never the round's), and the turn sent again extends them as before."""
    server = fake_llm(tokenizer=str(model_dir / "tokenizer.json"), malformed_share=0.0,
                      latency_s=1.0)
    env = Sums(ToolsSpec(functions=["python"]))
    ctx = StepContext(env=env, seed=3, version=0, mode="train", group_id=0, episode_id=0,
                      member=0, tag="Sums")
    policy = policy_for(server, model_dir / "tools")

    async def go() -> tuple[Any, Any, Any]:
        await policy.start()
        try:
            await policy.act("Nothing to compute here.", ctx)  # no call: one request
            before = ctx.scratch[tito.TITO_KEY]
            ctx.turn = 1
            task = asyncio.create_task(policy.act("Calculate 2 + 3.", ctx))
            while len(server.requests) < 3:  # the tool ran; the round's request is out
                assert not task.done(), task
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            kept = ctx.scratch[tito.TITO_KEY]
            _, again = await policy.act("Calculate 2 + 3.", ctx)
            return before, kept, again
        finally:
            await policy.close()

    before, kept, again = asyncio.run(go())
    assert kept is before  # the round's ids stayed in the turn
    assert [m["role"] for m in ctx.scratch["chat"]] == [
        "system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    sent = [*before.prompt, *before.sampled]
    (call,) = again.extra["model_calls"]
    assert call["prompt_ids"].tolist()[:len(sent)] == sent
    assert "\\boxed{5}" in again.text


def test_a_policy_built_without_a_config_check_refuses_the_server_parser(
        fake_llm, model_dir: Path) -> None:
    server = fake_llm(tokenizer=str(model_dir / "tokenizer.json"))
    env = Sums(ToolsSpec(functions=["python"], parser="server"))
    ctx = StepContext(env=env, seed=3, version=0, mode="train", group_id=0, episode_id=0,
                      member=0, tag="Sums")
    policy = policy_for(server, model_dir / "tools")

    async def go() -> None:
        await policy.start()
        try:
            await policy.act("Calculate 2 + 3.", ctx)
        finally:
            await policy.close()

    with pytest.raises(PolicyError, match=r"custom_envs\.Sums\.tools\.parser: server"):
        asyncio.run(go())
    assert not server.requests


# -- the config: which parser reads the calls ------------------------------------------------
def math_config(base_url: str, tokenizer: str | None = None, **tools: Any) -> RolloutConfig:
    policy: dict[str, Any] = {"type": "openai", "base_urls": [base_url], "model": MODEL,
                              "max_tokens": 256, "timeout_s": 10.0}
    if tokenizer is not None:
        policy["tokenizer"] = tokenizer
    return small_config(
        rollout_batch_size=8,
        train_env_manager={"max_env_num_per_worker": 8, "num_env_groups": 4, "group_size": 2,
                           "tags": ["Math"]},
        val_env_manager={"max_env_num_per_worker": 8, "num_env_groups": 2, "group_size": 1,
                         "tags": ["Math"]},
        custom_envs={"Math": {"env_type": "rg:basic_arithmetic", "env_config": {"size": 100},
                              "tools": {"functions": ["python"],
                                        "python": {"timeout_s": 20}, **tools}}},
        policy=policy)


def test_an_unset_parser_reads_by_the_turns_kind_and_server_needs_chat() -> None:
    assert ToolsSpec().reader(token_exact=False) == "server"
    assert ToolsSpec().reader(token_exact=True) == "hermes"
    assert ToolsSpec(parser="hermes").reader(token_exact=False) == "hermes"
    config = math_config("http://127.0.0.1:1", tokenizer="/nowhere")
    again = RolloutConfig.from_json(config.to_json())  # published and read back: still fine
    assert again.custom_envs["Math"].tools.parser is None
    math_config("http://127.0.0.1:1", parser="server")  # chat requests: fine
    with pytest.raises(ConfigError, match=r"custom_envs\.Math\.tools\.parser: server reads"):
        RolloutConfig.from_dict(math_config("http://127.0.0.1:1", tokenizer="/nowhere",
                                            parser="server").model_dump())


def test_the_server_parser_under_a_tokenizer_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text("rollout_batch_size: 8\n"
                    "train_env_manager: {num_env_groups: 4, group_size: 2, tags: [Math]}\n"
                    "val_env_manager: {num_env_groups: 2, group_size: 1, tags: [Math]}\n"
                    "custom_envs:\n  Math:\n    env_type: 'rg:basic_arithmetic'\n"
                    "    tools: {functions: [python], parser: server}\n"
                    "policy: {type: openai, base_urls: ['http://127.0.0.1:1/v1'], model: m,\n"
                    "         tokenizer: Qwen/Qwen3-0.6B}\n")
    out = run_cli("config", "check", str(path), timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"rollstream: error: {path}: custom_envs.Math.tools.parser: server reads the server's "
        "parsed tool calls, which token-in/token-out turns (policy.tokenizer) do not have; "
        "name a text parser (hermes) or leave it out"]


# -- the example agent task under token-in/token-out, end to end ----------------------------
@pytest.mark.parametrize(("malformed_share", "spelled"), [(0.0, False), (0.5, False),
                                                       (0.0, True)],
                         ids=["clean", "malformed", "spelled"])
def test_the_math_task_with_the_python_tool_token_in_token_out(
        fake_llm, producer_thread, r: redis.Redis, run: str, model_dir: Path,
        malformed_share: float, spelled: bool) -> None:
    """`spelled`: the replies' ids are not the tokenizer's own (one character each), so a
    round re-encoded from its text would not be the one sampled."""
    pytest.importorskip("reasoning_gym")
    server = fake_llm(tokenizer=str(model_dir / "tokenizer.json"), latency_s=0.001,
                      malformed_share=malformed_share, spell_replies=spelled)
    batcher = Batcher(r, math_config(server.base_url, str(model_dir / "tools")), run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    template = ChatTemplate.load(str(model_dir / "tools"))
    end = template.tokenizer.token_to_id("<|im_end|>")
    steps = [s for t in batch.trajectories for s in t["steps"]]
    assert len(steps) == len(batch.trajectories) == 8  # one answer per question
    assert batch.metrics["tools/malformed"] == sum(s["tool_malformed"] for s in steps)
    # every request: a token-id prompt to /v1/completions, no chat fields, no `tools`
    assert all(isinstance(b["prompt"], list) and "messages" not in b and "tools" not in b
               for b in server.requests)
    assert server.stats["completions"] == server.stats["requests"] > 0
    called = 0
    for step in steps:
        if step["tool_malformed"]:  # the env judged the reply as written
            assert step["reward"] == 0.0 and "model_calls" not in step
            assert "<tool_call>" in step["response"]
            continue
        called += 1
        assert step["tool_calls"] == 1 and step["reward"] == 1.0
        (round_,), (call,) = step["tool_rounds"], step["model_calls"]
        first = template.decode(call["prompt_ids"].tolist())
        assert "<tools>\n" + json.dumps(PYTHON_SCHEMA) + "\n</tools>" in first
        assert call["response_ids"][-1] == end and "<tool_call>" in call["response"]
        assert template.decode(call["response_ids"].tolist()) == call["response"]
        assert (call["response_ids"][:-1].tolist() == template.encode(call["response"])) \
            is not spelled
        assert len(call["logprobs"]) == len(call["response_ids"])
        assert (call["version"], call["version_source"]) == (0, "producer")
        # the answer's prompt is the round's prompt + its sampled ids + the tool's turn
        sent = np.concatenate([call["prompt_ids"], call["response_ids"]])
        assert np.array_equal(step["prompt_ids"][:len(sent)], sent)
        added = template.decode(step["prompt_ids"][len(sent):].tolist())
        assert added == (f"\nuser\n<tool_response>\n{round_['results'][0]}\n</tool_response>"
                         "\nassistant\n")
        assert round_["results"][0].strip() in step["response"]
    assert called if malformed_share == 0.0 else 0 < called < len(steps)
    tokens = batch.trajectory_tokens()
    assert tokens.non_extending == 0 and tokens.missing_ids == 0 and len(tokens) == 8
    for row, i in enumerate(tokens.traj_index):
        (step,) = batch.trajectories[i]["steps"]
        n = tokens.lengths[row]
        ids, mask = tokens.input_ids[row, :n], tokens.loss_mask[row, :n].astype(bool)
        replies = [c["response_ids"] for c in step.get("model_calls", [])]
        replies.append(step["response_ids"])
        # trainable: exactly the sampled tokens of every round, in order, with their versions
        assert np.array_equal(ids[mask], np.concatenate(replies))
        assert (tokens.token_versions[row, :n][mask] == 0).all()
        assert (tokens.token_versions[row, :n][~mask] == -1).all()
        assert np.array_equal(tokens.rollout_logprobs[row, :n][mask], np.concatenate(
            [c["logprobs"] for c in step.get("model_calls", [])] + [step["logprobs"]]))
        # not trainable: the prompt, and the tool's result between the rounds
        assert np.array_equal(ids, step["prompt_ids"].tolist() + step["response_ids"].tolist())
        if replies[:-1]:
            gap = ids[len(step["model_calls"][0]["prompt_ids"]) + len(replies[0]):
                      len(step["prompt_ids"])]
            assert not mask[len(step["model_calls"][0]["prompt_ids"]) + len(replies[0]):
                            len(step["prompt_ids"])].any()
            assert "<tool_response>" in template.decode(gap.tolist())
    rows = batch.turn_tokens()
    assert len(rows) == 8 + called and sorted(set(rows.call_index.tolist())) == (
        [0, 1] if called else [0])
    batcher.ack(batch)


def test_the_example_agent_under_a_tokenizer_renders_its_tools(
        fake_llm, producer_thread, r: redis.Redis, run: str, model_dir: Path) -> None:
    """A python policy's own agent loop (examples/agent_policy.py) with `policy.llm.tokenizer`:
    the tools it passes are rendered into its first prompt, its second call extends the first
    exactly (replies spelled one character per token), the program's output untrained."""
    pytest.importorskip("reasoning_gym")
    server = fake_llm(tokenizer=str(model_dir / "tokenizer.json"), latency_s=0.001,
                      malformed_share=0.0, spell_replies=True)
    config = math_config(server.base_url).model_dump()
    config["custom_envs"]["Math"]["tools"] = None
    config["policy"] = {"type": "python",
                        "entrypoint": f"{ROOT}/examples/agent_policy.py:make_agent",
                        "llm": {"base_urls": [server.base_url], "model": MODEL,
                                "max_tokens": 256, "timeout_s": 10.0,
                                "tokenizer": str(model_dir / "tools")}}
    batcher = Batcher(r, RolloutConfig.from_dict(config), run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    template = ChatTemplate.load(str(model_dir / "tools"))
    assert all(isinstance(b["prompt"], list) and "tools" not in b and "tool_choice" not in b
               for b in server.requests)
    for traj in batch.trajectories:
        (step,) = traj["steps"]
        (call,) = step["model_calls"]  # the program, then the boxed answer
        assert step["reward"] == 1.0 and "<tool_call>" in call["response"]
        assert "<tools>\n" + json.dumps(PYTHON_SCHEMA) + "\n</tools>" in template.decode(
            call["prompt_ids"].tolist())
        sent = np.concatenate([call["prompt_ids"], call["response_ids"]])
        assert np.array_equal(step["prompt_ids"][:len(sent)], sent)
        assert "<tool_response>" in template.decode(step["prompt_ids"][len(sent):].tolist())
    tokens = batch.trajectory_tokens()
    assert tokens.non_extending == 0 and len(tokens) == len(batch.trajectories)
    for row, i in enumerate(tokens.traj_index):
        (step,) = batch.trajectories[i]["steps"]
        n = tokens.lengths[row]
        mask = tokens.loss_mask[row, :n].astype(bool)
        assert np.array_equal(tokens.input_ids[row, :n][mask], np.concatenate(
            [step["model_calls"][0]["response_ids"], step["response_ids"]]))
    batcher.ack(batch)
