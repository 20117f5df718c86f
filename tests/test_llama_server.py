"""A real llama.cpp llama-server serving the tiny model: the facts about its answers that
rollstream's server pool relies on (docs/servers.md, "llama-server run here").

Skips without the binary (scripts/build_llama_server.sh), fails instead when
ROLLSTREAM_REQUIRE_REAL_SERVERS=1 (CI).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_servers import (
    free_port,
    llama_server_argv,
    llama_server_binary,
    load_tiny_model_script,
    render_chat_template,
    request,
    running,
)

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

N_CTX = 256
MESSAGES = [
    {"role": "system", "content": "You are playing FrozenLake."},
    {"role": "user", "content": "Grid:\nP_\n_G\nAnswer with one action."},
]
CHAT = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    load_tiny_model_script().generate(out, seed=0)
    return out


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    return tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory) -> Iterator[str]:
    binary = llama_server_binary()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    argv = llama_server_argv(binary, model_dir / "tiny.gguf", port, n_ctx=N_CTX)
    with running(argv, url, log):
        yield url


def chatml(messages: list[dict]) -> str:
    """The tiny model's ChatML template, rendered by hand (add_generation_prompt)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def test_models_lists_the_alias_and_the_context(server: str) -> None:
    status, body = request(server, "/v1/models", method="GET")
    assert status == 200
    assert [m["id"] for m in body["data"]] == ["tiny"]
    meta = body["data"][0]["meta"]
    assert meta["n_ctx"] == N_CTX and meta["n_ctx_train"] == 4096 and meta["n_vocab"] == 1024


def test_tokenize_agrees_with_the_tokenizer(server: str, tokenizer) -> None:
    text = chatml(MESSAGES)
    status, body = request(server, "/tokenize", {"content": text, "add_special": False})
    assert status == 200
    assert body["tokens"] == tokenizer.encode(text).ids


def test_chat_prompt_is_the_rendered_template(server: str, tokenizer) -> None:
    status, body = request(server, "/v1/chat/completions", CHAT)
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(chatml(MESSAGES)).ids)


def test_chat_gives_no_ids_and_ignores_return_token_ids(server: str) -> None:
    status, body = request(server, "/v1/chat/completions", {**CHAT, "return_token_ids": True})
    assert status == 200, body
    choice = body["choices"][0]
    for key in ("prompt_token_ids", "token_ids", "response_token_ids"):
        assert key not in body and key not in choice
    assert choice.get("logprobs") is None
    assert choice["finish_reason"] in ("stop", "length")


def test_logprobs_carry_the_sampled_ids(server: str, tokenizer) -> None:
    status, body = request(server, "/v1/chat/completions",
                           {**CHAT, "logprobs": True, "top_logprobs": 2})
    assert status == 200, body
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    ids = [entry["id"] for entry in content]
    assert all(isinstance(i, int) for i in ids)
    assert all(len(entry["top_logprobs"]) == 2 for entry in content)
    assert all(entry["logprob"] <= 0 for entry in content)
    # the ids are the tokenizer's: their text is the answer (special tokens are not shown)
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]


def test_logprobs_default_to_twenty_and_vanish_with_top_logprobs_zero(server: str) -> None:
    status, body = request(server, "/v1/chat/completions", {**CHAT, "logprobs": True})
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert content and all(len(entry["top_logprobs"]) == 20 for entry in content)
    status, body = request(server, "/v1/chat/completions",
                           {**CHAT, "logprobs": True, "top_logprobs": 0})
    assert status == 200, body
    assert body["choices"][0].get("logprobs") is None


def test_top_logprobs_without_logprobs_is_refused(server: str) -> None:
    status, body = request(server, "/v1/chat/completions", {**CHAT, "top_logprobs": 2})
    assert status == 400
    assert "top_logprobs requires logprobs" in body["error"]["message"]


def test_completions_take_a_token_id_prompt(server: str, tokenizer) -> None:
    ids = tokenizer.encode(chatml(MESSAGES)).ids
    status, body = request(server, "/v1/completions",
                           {"model": "tiny", "prompt": ids, "max_tokens": 8, "temperature": 0,
                            "logprobs": 1})
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == len(ids)
    # the same prompt through chat samples the same tokens (greedy)
    chat = request(server, "/v1/chat/completions", {**CHAT, "logprobs": True,
                                                    "top_logprobs": 1})[1]
    chat_ids = [e["id"] for e in chat["choices"][0]["logprobs"]["content"]]
    completion_ids = [e["id"] for e in body["choices"][0]["logprobs"]["content"]]
    assert completion_ids == chat_ids


def test_a_prompt_longer_than_the_context_is_a_400_naming_both_sizes(server: str) -> None:
    long = [{"role": "user", "content": "Up Down Left Right " * 200}]
    status, body = request(server, "/v1/chat/completions", {**CHAT, "messages": long})
    assert status == 400
    error = body["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["n_ctx"] == N_CTX and error["n_prompt_tokens"] > N_CTX
    assert re.fullmatch(r"request \(\d+ tokens\) exceeds the available context size "
                        r"\(\d+ tokens\), try increasing it", error["message"])


def test_generation_stops_at_the_end_of_the_context(server: str) -> None:
    status, body = request(server, "/v1/chat/completions", {**CHAT, "max_tokens": 1000})
    assert status == 200, body
    usage = body["usage"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == N_CTX


def test_usage_reports_prefix_cache_hits(server: str) -> None:
    first = request(server, "/v1/chat/completions", CHAT)[1]["usage"]
    again = request(server, "/v1/chat/completions", CHAT)[1]["usage"]
    assert again["prompt_tokens"] == first["prompt_tokens"]
    # all but the last prompt token come from the slot's cache on the second request
    assert again["prompt_tokens_details"]["cached_tokens"] == again["prompt_tokens"] - 1


def test_the_thinking_template_renders_as_transformers_does(model_dir: Path, tokenizer,
                                                            tmp_path: Path) -> None:
    """llama.cpp's own jinja engine runs the Qwen3-style template of tiny-thinking.gguf."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = llama_server_argv(llama_server_binary(), model_dir / "tiny-thinking.gguf", port,
                             n_ctx=N_CTX)
    messages = [*MESSAGES, {"role": "assistant", "content": "<think>left?</think>\nLeft"},
                {"role": "user", "content": "Again."}]
    expected = render_chat_template(model_dir / "thinking", messages)
    assert "<think>" not in expected
    with running(argv, url, tmp_path / "server.log"):
        status, body = request(url, "/v1/chat/completions", {**CHAT, "messages": messages})
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(expected).ids)


FIXTURES = Path(__file__).parent / "data/servers/llamacpp"
VOLATILE = ("id", "created", "timings")


def _stable(answer):
    """An answer without what changes from run to run (ids, clocks, cache hits)."""
    if not isinstance(answer, dict):
        return answer
    out = {k: v for k, v in answer.items() if k not in VOLATILE}
    if isinstance(out.get("usage"), dict):
        out["usage"] = {k: v for k, v in out["usage"].items() if k != "prompt_tokens_details"}
    if "data" in out:
        out["data"] = [{k: v for k, v in m.items() if k != "created"} for m in out["data"]]
    return out


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.json")))
def test_recorded_answers_are_what_the_server_answers(server: str, fixture: str) -> None:
    """tests/data/servers/llamacpp (scripts/capture_server_answers.py) still holds this
    server's answers: the stand-in's llama.cpp flavor is checked against these files."""
    record = json.loads((FIXTURES / fixture).read_text())
    body = record["request"]["body"]
    status, answer = request(server, record["request"]["path"], body,
                             method="GET" if body is None else "POST")
    assert status == record["status"]
    assert_same(_stable(answer), _stable(record["response"]))


def assert_same(got, want, where: str = "answer") -> None:
    """`got` is `want`, with logprobs equal to float32 rounding: a build for another CPU
    (GGML_NATIVE picks AVX2 or AVX-512 kernels) sums in another order, so the last digits of
    a logprob move while every token, text and count stays the same."""
    if isinstance(want, float) and isinstance(got, (int, float)):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-4), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def test_logprob_entries_merge_the_tokens_of_a_split_character(server: str) -> None:
    """One entry per piece of text sent: tokens that end inside a UTF-8 character wait for
    the next one and share its entry (the last token's id), so the entries can be fewer than
    the tokens; rollstream then takes no ids or logprobs from them
    (producers.llm.chat.merged_entries)."""
    record = json.loads((FIXTURES / "chat_merged_entries.json").read_text())
    status, body = request(server, "/v1/chat/completions", record["request"]["body"])
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) < body["usage"]["completion_tokens"]
    # the entries' bytes are the whole reply: none is lost, tokens are only grouped
    text = b"".join(bytes(entry["bytes"]) for entry in content).decode(errors="replace")
    assert text == body["choices"][0]["message"]["content"]
