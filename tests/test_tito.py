"""Token-in/token-out turns (`policy.tokenizer`, producers/llm/tito.py) with the repository's
generated tokenizer (scripts/tiny_model.py): each turn's prompt ids start with the previous
turn's prompt ids and sampled ids exactly, with the append-only ChatML template and with the
Qwen3-style template that drops earlier thinking; the reply's ids from the server where it
gives them, else from the tokenizer; a run through the stand-in's `/v1/completions`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from llm_helpers import MODEL, fake_llm_factory, http, lake_config
from real_servers import load_tiny_model_script, render_chat_template

from consumer import Batcher
from producers.llm import tito
from producers.llm.template import ChatTemplate
from schemas.errors import PolicyError

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

fake_llm = pytest.fixture(fake_llm_factory)

SYSTEM = {"role": "system", "content": "You are playing FrozenLake."}
USERS = ["Grid:\nP_\n_G\nAnswer with one action.", "Grid:\n_P\n_G\nAgain.",
         "Grid:\n__\n_P\nOnce more."]
REPLIES = ["<think>the goal is right</think>\n<answer>Right</answer>",
           "<think>now down</think>\n<answer>Down</answer>",
           "<think>done</think>\n<answer>Up</answer>"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    load_tiny_model_script().generate(out, seed=0)
    return out


def play(template: ChatTemplate, *, eos: bool = True) -> list[tuple[list[int], list[int]]]:
    """Three turns of one conversation as the policy plays them: (prompt ids, sampled ids)
    per turn, the sampled ids being the reply's tokens (and the end-of-turn token)."""
    scratch: dict[str, Any] = {}
    messages: list[dict[str, str]] = [SYSTEM]
    end = template.tokenizer.token_to_id("<|im_end|>")
    turns = []
    for user, answer in zip(USERS, REPLIES, strict=True):
        messages.append({"role": "user", "content": user})
        prompt = tito.prompt_ids(template, scratch, messages).tolist()  # an int32 array
        sampled = template.encode(answer) + ([end] if eos else [])
        messages.append({"role": "assistant", "content": answer})
        tito.remember(scratch, messages, prompt, sampled)
        turns.append((prompt, sampled))
    return turns


def assert_extends(turns: list[tuple[list[int], list[int]]]) -> None:
    for (before, sampled), (after, _) in zip(turns, turns[1:], strict=False):
        assert after[:len(before) + len(sampled)] == before + sampled
        assert len(after) > len(before) + len(sampled)


def test_chatml_turns_are_the_rendered_conversation(model_dir: Path) -> None:
    template = ChatTemplate.load(str(model_dir))
    assert template.decode(template.close_ids) == "\n"  # <|im_end|> is special: skipped
    assert template.close_ids == template.encode("<|im_end|>\n")
    turns = play(template)
    assert_extends(turns)
    # append-only template, canonical sampled tokens: exactly what re-rendering gives
    messages: list[dict[str, str]] = [SYSTEM]
    for (prompt, _), user, answer in zip(turns, USERS, REPLIES, strict=True):
        messages.append({"role": "user", "content": user})
        assert prompt == template.encode(render_chat_template(model_dir, messages))
        messages.append({"role": "assistant", "content": answer})


def test_thinking_template_turns_extend_what_was_sampled(model_dir: Path) -> None:
    template = ChatTemplate.load(str(model_dir / "thinking"))
    turns = play(template)
    assert_extends(turns)
    # the template itself is not append-only: re-rendered, turn 2 loses turn 1's thinking
    rendered = template.encode(render_chat_template(
        model_dir / "thinking", [SYSTEM, {"role": "user", "content": USERS[0]},
                                 {"role": "assistant", "content": REPLIES[0]},
                                 {"role": "user", "content": USERS[1]}]))
    before, sampled = turns[0]
    assert rendered[:len(before) + len(sampled)] != before + sampled
    assert "the goal is right" in template.decode(turns[1][0])  # kept as sampled
    assert "the goal is right" not in template.decode(rendered)
    # the first prompt is the template's own
    assert turns[0][0] == template.encode(render_chat_template(
        model_dir / "thinking", [SYSTEM, {"role": "user", "content": USERS[0]}]))


def test_a_reply_without_its_end_token_is_closed_by_the_template(model_dir: Path) -> None:
    # llama-server leaves the end-of-turn token out of its ids; a cut reply has none either
    template = ChatTemplate.load(str(model_dir))
    with_end, without = play(template), play(template, eos=False)
    assert_extends(without)
    assert [p for p, _ in without] == [p for p, _ in with_end]  # the same prompts


def test_a_fresh_message_list_is_encoded_afresh(model_dir: Path) -> None:
    # a step manager renders a new list each turn: no extension of the previous ids
    template = ChatTemplate.load(str(model_dir))
    scratch: dict[str, Any] = {}
    first = [{"role": "user", "content": USERS[0]}]
    ids = tito.prompt_ids(template, scratch, first)
    tito.remember(scratch, first + [{"role": "assistant", "content": "x"}], ids, [5, 6])
    # as long as that conversation, an assistant message at the same place: still another list
    fresh = [{"role": "user", "content": USERS[1]}, {"role": "assistant", "content": "y"},
             {"role": "user", "content": USERS[2]}]
    assert tito.prompt_ids(template, scratch, fresh).tolist() == template.prompt_ids(fresh)


def test_the_prompt_echo_is_cut_before_parsing_and_nothing_else_changes() -> None:
    import orjson

    spelled = ',"prompt_token_ids":[7, 8] and "prompt_token_ids": [9]'  # text, not a key
    answer = {"prompt_token_ids": [1, 2, 3],
              "choices": [{"text": spelled, "prompt_token_ids": [4, 5], "token_ids": [6],
                           "logprobs": {"top_logprobs": [{'"prompt_token_ids': -0.5}]}},
                          {"text": "x", "prompt_token_ids": None, "token_ids": []}],
              "meta": {'"prompt_token_ids': [9, 9]}}  # a key that ends with the name
    for raw in (orjson.dumps(answer), json.dumps(answer).encode(),  # compact; ", " and ": "
                json.dumps(answer, indent=2).encode()):
        cut = tito.without_prompt_echo(raw)
        assert len(cut) < len(raw)
        want = json.loads(raw)
        want["prompt_token_ids"] = want["choices"][0]["prompt_token_ids"] = None
        assert json.loads(cut) == want
    for raw in (b'{"choices":[{"text":"a","token_ids":[1]}]}',  # nothing to cut
                b'{"prompt_token_ids":null}', b'{"prompt_token_ids":[1,2'):  # as they are
        assert tito.without_prompt_echo(raw) is raw


def test_a_token_in_token_out_answer_arrives_without_its_echo(fake_llm, model_dir: Path
                                                              ) -> None:
    """The stand-in echoes the prompt's ids, as vLLM does with return_token_ids; the pool
    hands a token-id request's answer on without them (the policy keeps what it sent), and a
    chat answer with them (its prompt ids are the server's)."""
    from llm_helpers import run_pool

    server = fake_llm(tokenizer=str(model_dir / "tokenizer.json"))
    prompt = ChatTemplate.load(str(model_dir)).prompt_ids([{"role": "user", "content": "Hi"}])

    async def scenario(pool: Any) -> tuple[Any, Any]:
        tito_body = tito.request_body(MODEL, prompt, sampling={"max_tokens": 8}, seed=1,
                                      extra_body={})
        chat_body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                     "max_tokens": 8, "return_token_ids": True}
        return (await pool.chat(tito_body)).data, (await pool.chat(chat_body)).data

    tito_answer, chat_answer = run_pool([server.base_url], scenario)
    status, direct = http(server.base_url + "/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": 8, "return_token_ids": True})
    assert status == 200 and direct["choices"][0]["prompt_token_ids"] == prompt  # echoed
    assert tito_answer["choices"][0]["prompt_token_ids"] is None
    assert tito_answer["choices"][0]["token_ids"]  # the rest as the server gave it
    assert chat_answer["prompt_token_ids"]  # vLLM's chat answer: top-level, kept
    assert server.requests[0]["prompt"] == prompt


def test_reply_ids_from_the_server_else_the_tokenizer(model_dir: Path) -> None:
    template = ChatTemplate.load(str(model_dir))
    prompt = [1, 2, 3]
    text = "<answer>Up</answer>"
    ids = template.encode(text)
    vllm = {"choices": [{"text": text, "token_ids": ids, "finish_reason": "stop",
                         "logprobs": {"token_logprobs": [-0.5] * len(ids)},
                         "weight_versions": [{"version": "3", "start": 0, "end": len(ids)}]}]}
    turn = tito.turn_from_completion(vllm, prompt, template)
    assert (turn.version, turn.version_source) == (3, "server")  # vLLM 0.33's spans
    assert turn.extra["response_ids_source"] == "server"
    assert turn.response_ids.tolist() == ids and turn.prompt_ids.tolist() == prompt
    assert turn.logprobs.tolist() == [-0.5] * len(ids)
    llama = {"choices": [{"text": text, "finish_reason": "stop", "logprobs": {"content": [
        {"id": i, "logprob": -1.0} for i in ids]}}], "usage": {"completion_tokens": len(ids)}}
    turn = tito.turn_from_completion(llama, prompt, template)
    assert turn.extra["response_ids_source"] == "server" and turn.response_ids.tolist() == ids
    bare = {"choices": [{"text": text, "finish_reason": "stop"}]}
    turn = tito.turn_from_completion(bare, prompt, template)
    assert turn.extra["response_ids_source"] == "tokenizer"
    assert turn.response_ids.tolist() == ids and turn.logprobs is None


def test_a_folder_without_a_tokenizer_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="has no tokenizer.json"):
        ChatTemplate.load(str(tmp_path))


@pytest.mark.parametrize("flavor,folder", [("vllm", ""), ("sglang", "thinking"),
                                           ("llamacpp", "thinking")])
def test_a_run_token_in_token_out_through_the_stand_in(
        fake_llm, producer_thread, r: redis.Redis, run: str, model_dir: Path, flavor: str,
        folder: str) -> None:
    tokenizer = str(model_dir / folder) if folder else str(model_dir)
    server = fake_llm(flavor=flavor, tokenizer=str(model_dir / "tokenizer.json"),
                      latency_s=0.001, p_good=0.5)
    config = lake_config([server.base_url], tokenizer=tokenizer)
    batcher = Batcher(r, config, run=run)
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    template = ChatTemplate.load(tokenizer)
    end = template.tokenizer.token_to_id("<|im_end|>")
    multi = 0
    for traj in batch.trajectories:
        steps = traj["steps"]
        multi += len(steps) > 1
        for step in steps:
            assert step["response_ids_source"] == "server"
            assert step["prompt_ids"].dtype == np.int32
            assert len(step["logprobs"]) == len(step["response_ids"]) > 0
            assert template.decode(step["response_ids"].tolist()) == step["response"]
        for before, after in zip(steps, steps[1:], strict=False):
            sent = np.concatenate([before["prompt_ids"], before["response_ids"]])
            assert np.array_equal(after["prompt_ids"][:len(sent)], sent)
            assert before["response_ids"][-1] == end  # every server gives the end-of-turn id
    assert multi, "no episode had a second turn"
    tokens = batch.trajectory_tokens()
    assert tokens.non_extending == 0
    assert all("prompt" in body and "messages" not in body for body in server.requests)
    if flavor == "llamacpp":  # its own /completion, for the exact ids
        assert all(body["return_tokens"] is True for body in server.requests)
        assert server.stats["native_completions"] == server.stats["requests"]
    assert server.stats["completions"] == server.stats["requests"] > 0
    batcher.ack(batch)


def test_suffixes_are_cached_by_the_messages_and_unhashable_ones_still_render(
        model_dir: Path) -> None:
    template = ChatTemplate.load(str(model_dir))
    user = [{"role": "user", "content": USERS[0]}]
    first = template.suffix_ids(user)
    assert template.suffix_ids([dict(m) for m in user]) is first  # the same messages: cached
    with_list = [{"role": "user", "content": USERS[0], "tool_calls": []}]
    assert template.suffix_ids(with_list) == first  # not hashable: rendered, same tokens
    assert template.decode(first).startswith("user\n")


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "llamacpp"])
def test_the_stand_in_tokenizes_and_completes_token_ids_as_its_flavor(
        fake_llm, model_dir: Path, flavor: str) -> None:
    server = fake_llm(flavor=flavor, tokenizer=str(model_dir / "tokenizer.json"))
    template = ChatTemplate.load(str(model_dir))
    text = render_chat_template(model_dir, [SYSTEM, {"role": "user", "content": USERS[0]}])
    ids = template.encode(text)
    root = server.base_url.removesuffix("/v1")
    if flavor == "llamacpp":  # llama-server's /tokenize takes `content`, answers `tokens`
        status, body = http(f"{root}/tokenize", {"content": text})
        assert status == 200 and body == {"tokens": ids}
    else:
        status, body = http(f"{root}/tokenize", {"model": MODEL, "prompt": text})
        assert status == 200 and body["tokens"] == ids and body["count"] == len(ids)
        assert "max_model_len" in body and ("token_strs" in body) == (flavor == "vllm")
    status, body = http(f"{server.base_url}/completions", {
        "model": MODEL, "prompt": ids, "max_tokens": 64, "temperature": 0, "logprobs": 1,
        "return_token_ids": True})
    assert status == 200, body
    choice = body["choices"][0]
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert "<answer>" in choice["text"]  # the player read the decoded prompt
    if flavor == "llamacpp":
        assert "token_ids" not in choice and choice["logprobs"]["content"][0]["id"] >= 0
    else:
        assert template.decode(choice["token_ids"]) == choice["text"]
        assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])


@pytest.mark.parametrize("flavor,status", [("strict", 400), ("llama-cpp-python", 422)])
def test_servers_without_token_id_prompts_refuse_them(fake_llm, flavor: str,
                                                      status: int) -> None:
    server = fake_llm(flavor=flavor)
    got, body = http(f"{server.base_url}/completions",
                     {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4})
    assert got == status and "prompt must be a string" in json.dumps(body)
