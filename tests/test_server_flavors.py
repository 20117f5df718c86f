"""Conformance of the stand-in's flavors to the servers they reproduce, so a flavor that
drifts from the real thing goes red:

- against the servers' released code: the fields of their answers and the wording of their
  context errors, read by scripts/server_shapes.py into tests/data/servers/shapes.json
  (vLLM 0.33.0 and 0.10.2, SGLang 0.5.23 and 0.4.10, llama-cpp-python 0.3.36, transformers
  serve 5.24);
- against real answers: every request recorded from llama-server and llama-cpp-python's
  server (tests/data/servers/) sent to its flavor, the answers compared shape for shape;
- against a real llama-server (when built: scripts/build_llama_server.sh): the same
  properties checked on the `llamacpp` flavor and on the server itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_helpers import fake_llm_factory, http

from rollstream.fake_llm import FLAVORS, FakeLLMOptions, FakeLLMServer

DATA = Path(__file__).parent / "data/servers"
SHAPES = json.loads((DATA / "shapes.json").read_text())
RELEASE = {"vllm": "vllm-0.33.0", "vllm010": "vllm-0.10.2", "sglang": "sglang-0.5.23",
           "sglang04": "sglang-0.4.10"}
# fields a serializer leaves out when None (so an answer may lack them):
# vLLM's ChatMessage drops an empty tool_calls (chat_completion/protocol.py:87-93);
# SGLang's ChatMessage drops tool_calls, its choice the ids, hidden_states and meta_info, its
# response sglext (sglang/srt/entrypoints/openai/protocol.py:1293-1352)
OPTIONAL = {
    "message": {"tool_calls"},
    "choice": {"hidden_states", "prompt_token_ids", "response_token_ids", "meta_info"},
    "response": {"sglext"},
}
MESSAGES = [{"role": "system", "content": "You are playing FrozenLake."},
            {"role": "user", "content": "Grid:\nP_\n_G\nAnswer with one action."}]

fake_llm = pytest.fixture(fake_llm_factory)


def fields(release: str, name: str) -> set[str]:
    return set(SHAPES[release]["classes"][name]["fields"])


def template(release: str, name: str) -> re.Pattern[str]:
    """A server's message template as a pattern ({} matches any value)."""
    text = SHAPES[release]["messages"][name]["template"]
    return re.compile(".*?".join(re.escape(part) for part in text.split("{}")) + "$")


def keys_match(answer: dict[str, Any], release: str, name: str) -> None:
    """`answer` has every field of the release's class (but those its serializer drops when
    None) and no other."""
    declared = fields(release, name)
    assert set(answer) <= declared, (release, name, set(answer) - declared)
    missing = declared - set(answer) - OPTIONAL.get(name, set())
    assert not missing, (release, name, missing)


@pytest.mark.parametrize("flavor", sorted(RELEASE))
def test_answers_have_the_fields_of_the_servers_classes(fake_llm, flavor: str) -> None:
    release = RELEASE[flavor]
    server = fake_llm(flavor=flavor)
    status, data = http(f"{server.base_url}/chat/completions",
                        {"model": "fake-model", "messages": MESSAGES, "logprobs": True,
                         "top_logprobs": 1, "return_token_ids": True,
                         "return_weight_versions": True})
    assert status == 200, data
    keys_match(data, release, "response")
    choice = data["choices"][0]
    keys_match(choice, release, "choice")
    keys_match(choice["message"], release, "message")
    keys_match(data["usage"], release, "usage")
    for entry in choice["logprobs"]["content"]:
        keys_match(entry, release, "logprob_content")
        for top in entry["top_logprobs"]:
            keys_match(top, release, "logprob")
    if flavor == "vllm":
        for span in choice["weight_versions"]:
            keys_match(span, release, "weight_version_span")
    _, models = http(f"{server.base_url}/models")
    for card in models["data"]:
        keys_match(card, release, "model_card")
    status, error = http(f"{server.base_url}/chat/completions",
                         {"model": "fake-model", "messages": MESSAGES, "max_tokens": 10**6})
    assert status == 400
    keys_match(error.get("error", error), release, "error")


# flavor, release, message name, (prompt tokens, max_tokens, window) that draws it
WORDINGS = [
    ("vllm", "vllm-0.33.0", "prompt_too_long", (120, 8, 100)),
    ("vllm", "vllm-0.33.0", "max_tokens_over_limit", (10, 200, 100)),
    ("vllm", "vllm-0.33.0", "max_tokens_zero", (100, 8, 100)),
    ("vllm010", "vllm-0.10.2", "prompt_too_long", (100, 8, 100)),
    ("vllm010", "vllm-0.10.2", "max_tokens_too_large", (50, 80, 100)),
    ("sglang", "sglang-0.5.23", "prompt_too_long", (100, 8, 100)),
    ("sglang", "sglang-0.5.23", "total_too_long", (50, 80, 100)),
    ("sglang", "sglang-0.5.23", "input_over_allowed", (95, 2, 100)),
    ("sglang04", "sglang-0.4.10", "prompt_too_long", (100, 8, 100)),
    ("sglang04", "sglang-0.4.10", "total_too_long", (50, 50, 100)),  # >= in 0.4.10
    ("sglang04", "sglang-0.4.10", "input_over_allowed", (95, 2, 100)),
    ("llama-cpp-python", "llama-cpp-python-0.3.36", "prompt_too_long", (100, 8, 100)),
]


@pytest.mark.parametrize("flavor, release, name, case", WORDINGS,
                         ids=[f"{w[0]}-{w[2]}" for w in WORDINGS])
def test_context_errors_are_worded_as_the_servers_code_words_them(
        flavor: str, release: str, name: str, case: tuple[int, int, int]) -> None:
    prompt, max_tokens, window = case
    refusal = FLAVORS[flavor].fit(prompt, max_tokens, window)
    assert not isinstance(refusal, int), f"{flavor} let {case} through"
    assert template(release, name).match(refusal.message), refusal.message
    assert refusal.status == 400


def test_the_paused_and_strict_wordings_are_the_servers() -> None:
    assert template("vllm-0.33.0", "paused").match(
        "Generation is paused. Please retry after it resumes.")
    refusal = FLAVORS["strict"].refuse({"model": "m", "messages": [], "return_token_ids": 1})
    assert refusal is not None and refusal.status == 422
    assert template("transformers-5.24.0", "unexpected_fields").match(refusal.message)
    # what transformers serve accepts: OpenAI's chat fields (openai 3.57.0) and its own
    from rollstream.fake_llm.flavors import OPENAI_CHAT_FIELDS

    openai = fields("openai-3.57.0", "chat_request")
    assert OPENAI_CHAT_FIELDS == openai | {"stream", "generation_config", "seed",
                                           "chat_template_kwargs"}


# -- recorded answers of real servers ----------------------------------------------------------
VOLATILE = {"id", "created", "timings", "system_fingerprint"}
UNSERVED = {"completion_token_ids.json", "tokenize.json"}  # /v1/completions, /tokenize: not
# reproduced by the stand-in (chat only)


def shape(value: Any) -> Any:
    """The structure of a JSON value: keys, the shape of a list's first item, and kinds."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items()) if k not in VOLATILE}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool) or value is None:
        return value
    return "number" if isinstance(value, int | float) else "text"


def recorded(folder: str) -> list[str]:
    return sorted(p.name for p in (DATA / folder).glob("*.json") if p.name not in UNSERVED)


@pytest.fixture(scope="module")
def recorded_flavors() -> Iterator[dict[str, FakeLLMServer]]:
    """The two flavors recorded answers exist for, set up as the recordings were (model
    alias "tiny", a context of 256 tokens, replies that run on: the tiny random model never
    says its end token)."""
    servers = {name: FakeLLMServer(FakeLLMOptions(flavor=name, model="tiny", max_model_len=256,
                                                  think_words=300)).start()
               for name in ("llamacpp", "llama-cpp-python")}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.mark.parametrize("folder, flavor, fixture", [
    *[("llamacpp", "llamacpp", name) for name in recorded("llamacpp")],
    *[("llama_cpp_python", "llama-cpp-python", name) for name in recorded("llama_cpp_python")],
])
def test_each_recorded_request_is_answered_as_the_real_server_answered(
        recorded_flavors: dict[str, FakeLLMServer], folder: str, flavor: str,
        fixture: str) -> None:
    record = json.loads((DATA / folder / fixture).read_text())
    server = recorded_flavors[flavor]
    path, body = record["request"]["path"], record["request"]["body"]
    status, answer = http(f"{server.url}{path}", body)
    real = record["response"]
    assert status == record["status"], answer
    if fixture == "models.json":  # the stand-in lists a subset of what llama-server does
        assert answer["data"][0]["id"] == real["data"][0]["id"]
        card, real_card = answer["data"][0], real["data"][0]
        assert set(card) <= set(real_card) and set(card.get("meta", {})) <= set(
            real_card.get("meta", {}))
        assert card.get("meta", {}).get("n_ctx") == real_card.get("meta", {}).get("n_ctx")
        assert card["owned_by"] == real_card["owned_by"]
        return
    assert shape(answer) == shape(real)
    if status != 200:
        mine, theirs = answer.get("error", answer), real.get("error", real)
        assert re.sub(r"\d+", "N", str(mine.get("message"))) == re.sub(
            r"\d+", "N", str(theirs.get("message")))
        return
    choice, real_choice = answer["choices"][0], real["choices"][0]
    assert choice["finish_reason"] == real_choice["finish_reason"]
    if real_choice.get("logprobs"):
        tops = {len(e["top_logprobs"]) for e in real_choice["logprobs"]["content"]}
        assert {len(e["top_logprobs"]) for e in choice["logprobs"]["content"]} == tops
    if fixture == "chat_fills_context.json":
        usage = answer["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 256


# -- the llamacpp flavor and a real llama-server, the same checks -------------------------------
@pytest.fixture(scope="module", params=["flavor", "real"])
def llama(request, tmp_path_factory) -> Iterator[str]:
    """The base URL (no /v1) of the `llamacpp` flavor, or of a real llama-server serving the
    tiny model with `-c 256` (skips without the binary, fails in CI)."""
    if request.param == "flavor":
        with FakeLLMServer(FakeLLMOptions(flavor="llamacpp", model="tiny", max_model_len=256,
                                          think_words=300)) as server:
            yield server.url
        return
    from real_servers import (
        free_port,
        llama_server_argv,
        llama_server_binary,
        load_tiny_model_script,
        running,
    )

    pytest.importorskip("tokenizers")
    pytest.importorskip("gguf")
    binary = llama_server_binary()
    out = tmp_path_factory.mktemp("tiny")
    load_tiny_model_script().generate(out, seed=0)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(llama_server_argv(binary, out / "tiny.gguf", port, n_ctx=256), url,
                 out / "server.log"):
        yield url


CHAT = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}


def test_llama_logprobs_rules(llama: str) -> None:
    """20 top logprobs by default, none with top_logprobs 0, a 400 for top_logprobs alone;
    the sampled ids in the entries, one per completion token."""
    url = f"{llama}/v1/chat/completions"
    _, data = http(url, {**CHAT, "logprobs": True})
    content = data["choices"][0]["logprobs"]["content"]
    assert len(content) == data["usage"]["completion_tokens"]
    assert all(len(e["top_logprobs"]) == 20 and isinstance(e["id"], int) for e in content)
    _, data = http(url, {**CHAT, "logprobs": True, "top_logprobs": 1})
    assert all(len(e["top_logprobs"]) == 1 for e in data["choices"][0]["logprobs"]["content"])
    _, data = http(url, {**CHAT, "logprobs": True, "top_logprobs": 0})
    assert "logprobs" not in data["choices"][0]
    status, data = http(url, {**CHAT, "top_logprobs": 2})
    assert status == 400 and data["error"]["message"] == \
        "top_logprobs requires logprobs to be set to true"


def test_llama_gives_no_ids_otherwise_and_reports_its_context(llama: str) -> None:
    _, data = http(f"{llama}/v1/chat/completions", {**CHAT, "return_token_ids": True})
    assert not {"prompt_token_ids", "token_ids", "response_token_ids"} & (
        set(data) | set(data["choices"][0]))
    _, models = http(f"{llama}/v1/models")
    assert models["data"][0]["owned_by"] == "llamacpp"
    assert models["data"][0]["meta"]["n_ctx"] == 256


def test_llama_context_rules(llama: str) -> None:
    """A prompt past the context: 400 exceed_context_size_error with both sizes; a turn that
    runs into the end stops there, `length`, prompt + completion = the context."""
    url = f"{llama}/v1/chat/completions"
    long = [{"role": "user", "content": "Up Down Left Right " * 100}]
    status, data = http(url, {**CHAT, "messages": long})
    assert status == 400 and data["error"]["type"] == "exceed_context_size_error"
    assert data["error"]["n_ctx"] == 256 and data["error"]["n_prompt_tokens"] > 256
    _, data = http(url, {**CHAT, "max_tokens": 1000})
    usage = data["usage"]
    assert data["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 256
