"""The stand-in LLM server: its tokenizer and template, the scripted model, faults,
cancellations, weight updates and pauses, over real HTTP on loopback (each server's shapes:
tests/test_server_flavors.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import ROOT, clean_env, wait_for
from llm_helpers import MODEL, fake_llm_factory, http

from producers.envs import make_env
from rollstream.fake_llm import encode, read_board, render_prompt
from schemas.envspec import DEFAULT_CUSTOM_ENVS

fake_llm = pytest.fixture(fake_llm_factory)


def chat_body(messages: list[dict], **extra) -> dict:
    return {"model": MODEL, "messages": messages, "logprobs": True, "return_token_ids": True,
            **extra}


def game_messages(tag: str, seed: int = 3) -> tuple[list[dict], object]:
    spec = DEFAULT_CUSTOM_ENVS[tag]
    env = make_env(spec["env_id"], spec["env_config"])
    obs, _ = env.reset(seed=seed)
    # placed as ROLL places it: the instruction opens the first user message
    return [{"role": "system", "content": "Play well."},
            {"role": "user", "content": f"{env.unwrapped.instruction}\nTurn 1:\nState:\n{obs}\n"
                                        "Your next action:"}], env


def test_chat_completion_has_vllm_shapes(fake_llm) -> None:
    server = fake_llm()
    messages, _ = game_messages("FrozenLake")
    status, data = http(f"{server.base_url}/chat/completions", chat_body(messages))
    assert status == 200
    assert data["object"] == "chat.completion" and data["model"] == MODEL
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    ids, content = choice["token_ids"], choice["logprobs"]["content"]
    assert len(ids) == len(content) == data["usage"]["completion_tokens"]
    assert all(isinstance(item["token"], str) and item["logprob"] <= 0 for item in content)
    assert data["prompt_token_ids"] == [
        *encode_prompt(messages)] and data["usage"]["prompt_tokens"] == len(
        data["prompt_token_ids"])
    assert data["usage"]["total_tokens"] == len(ids) + len(data["prompt_token_ids"])
    assert "metadata" not in data and choice["weight_versions"] is None  # not asked

    status, plain = http(f"{server.base_url}/chat/completions",
                         {"model": MODEL, "messages": messages})
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None
    assert plain["choices"][0]["logprobs"] is None

    status, models = http(f"{server.base_url}/models")
    assert status == 200 and [card["id"] for card in models["data"]] == [MODEL]
    assert http(f"{server.url}/health")[0] == 200
    status, error = http(f"{server.base_url}/chat/completions",
                         {"model": "other", "messages": messages})
    assert status == 404 and "other" in error["error"]["message"]


def encode_prompt(messages: list[dict]) -> list[int]:
    from rollstream.fake_llm import token_id

    return [token_id(piece) for piece in render_prompt(messages)]


def test_a_server_without_token_ids(fake_llm) -> None:
    server = fake_llm(token_ids=False)
    messages, _ = game_messages("FrozenLake")
    _, data = http(f"{server.base_url}/chat/completions", chat_body(messages))
    assert data["prompt_token_ids"] is None and data["choices"][0]["token_ids"] is None
    assert data["choices"][0]["logprobs"]["content"]  # logprobs still come


def test_prompts_extend_unless_the_template_drops_thinking() -> None:
    reply = "<think>go down</think><answer>Down</answer>"
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}]
    second = [*first, {"role": "assistant", "content": reply},
              {"role": "user", "content": "u2"}]
    turn1 = [p for p in render_prompt(first)] + [*_pieces(reply), "<|im_end|>"]
    assert render_prompt(second)[: len(turn1)] == turn1
    dropped = render_prompt(second, drop_thinking=True)
    assert dropped[: len(turn1)] != turn1
    assert encode("<answer>Down</answer>") == encode("<answer>Down</answer>")


def _pieces(text: str) -> list[str]:
    from rollstream.fake_llm import pieces

    return pieces(text)


def test_reads_the_board_from_the_instruction_and_observation() -> None:
    messages, env = game_messages("SokobanDifferentGridVocab")
    board = read_board(messages)
    assert board.game == "sokoban"
    assert board.symbols["player"] == "A" and board.symbols["wall"] == "W"
    assert board.actions == ["Up", "Down", "Left", "Right"]
    assert "\n".join(board.grid) == env.render()


@pytest.mark.parametrize("tag", ["FrozenLake", "SimpleSokoban"])
def test_temperature_zero_plays_good_moves(fake_llm, tag: str) -> None:
    """FrozenLake at temperature 0 walks to the goal; Sokoban moves are always legal."""
    server = fake_llm()
    solved = 0
    for seed in range(5):
        messages, env = game_messages(tag, seed)
        for _ in range(10):
            _, data = http(f"{server.base_url}/chat/completions",
                           chat_body(messages, temperature=0))
            text = data["choices"][0]["message"]["content"]
            obs, _, terminated, truncated, info = env.unwrapped.step_text(text)
            assert info["action_is_valid"]
            if tag == "SimpleSokoban":
                assert info["action_is_effective"]  # never into a wall
            if terminated or truncated:
                break
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"State:\n{obs}\nYour next action:"}]
        solved += bool(info["success"])
    if tag == "FrozenLake":
        assert solved == 5


def test_sampling_is_seeded_by_the_request(fake_llm) -> None:
    server = fake_llm(p_good=0.0, malformed_share=1.0)
    messages, _ = game_messages("FrozenLake")
    replies = {http(f"{server.base_url}/chat/completions",
                    chat_body(messages, seed=s))[1]["choices"][0]["message"]["content"]
               for s in (1, 1, 2)}
    assert all("<answer>" not in text for text in replies)  # p_good 0: malformed only
    again = http(f"{server.base_url}/chat/completions", chat_body(messages, seed=1))[1]
    assert again["choices"][0]["message"]["content"] in replies


def test_max_tokens_cuts_the_reply(fake_llm) -> None:
    server = fake_llm()
    messages, _ = game_messages("FrozenLake")
    _, data = http(f"{server.base_url}/chat/completions", chat_body(messages, max_tokens=3))
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 3


def test_scripted_faults_and_stats(fake_llm) -> None:
    server = fake_llm()
    messages, _ = game_messages("FrozenLake")
    url = f"{server.base_url}/chat/completions"
    assert http(f"{server.url}/admin/faults", {"kind": "500", "count": 2})[0] == 200
    server.fail_next("400")
    assert [http(url, chat_body(messages))[0] for _ in range(4)] == [500, 500, 400, 200]
    server.fail_next("drop")
    with pytest.raises((ConnectionError, OSError)):
        http(url, chat_body(messages))
    _, stats = http(f"{server.url}/admin/stats")
    assert stats["fault:500"] == 2 and stats["fault:400"] == 1 and stats["fault:drop"] == 1
    assert stats["completed"] == 1


def test_a_hang_is_seen_closed_by_the_client(fake_llm) -> None:
    server = fake_llm()
    server.fail_next("hang")
    messages, _ = game_messages("FrozenLake")
    with pytest.raises(TimeoutError):
        http(f"{server.base_url}/chat/completions", chat_body(messages), timeout_s=0.5)
    wait_for(lambda: server.stats["cancelled"] == 1, 5, what="the server to see the close")
    assert server.in_flight == 0


def test_weight_update_aborts_in_flight_and_reports_the_version(fake_llm) -> None:
    server = fake_llm(flavor="sglang", latency_s=30.0, load_time_s=0.3)
    messages, _ = game_messages("FrozenLake")
    results: list[dict] = []
    thread = threading.Thread(target=lambda: results.append(
        http(f"{server.base_url}/chat/completions", chat_body(messages))[1]))
    thread.start()
    wait_for(lambda: server.in_flight == 1, 5, what="a request in flight")
    status, answer = http(f"{server.url}/update_weights_from_disk",
                          {"model_path": "/ckpt/v3", "weight_version": "3",
                           "abort_all_requests": True})
    assert status == 200 and answer["success"] and answer["num_paused_requests"] == 1
    thread.join(5)
    aborted = results[0]["choices"][0]
    # the tokens sampled before the abort (SGLang 0.5.23 answers them: fake_llm/completions.py)
    assert aborted["finish_reason"] == "abort" and len(aborted["response_token_ids"]) > 0
    server.options.latency_s = 0.0
    _, data = http(f"{server.base_url}/chat/completions", chat_body(messages))
    assert data["metadata"]["weight_version"] == "3"
    assert data["metadata"]["weight_versions"] == [
        {"version": "3", "start": 0, "end": data["usage"]["completion_tokens"]}]
    assert http(f"{server.url}/model_info")[1]["weight_version"] == "3"
    # SGLang serves the checkpoint path as the model's name now; chat takes any name
    assert [card["id"] for card in http(f"{server.base_url}/models")[1]["data"]] == ["/ckpt/v3"]


def test_an_sglang_update_without_abort_waits_for_the_requests_in_flight(fake_llm) -> None:
    server = fake_llm(flavor="sglang", latency_s=0.5)
    messages, _ = game_messages("FrozenLake")
    results: list[dict] = []
    thread = threading.Thread(target=lambda: results.append(
        http(f"{server.base_url}/chat/completions", chat_body(messages))[1]))
    thread.start()
    wait_for(lambda: server.in_flight == 1, 5, what="a request in flight")
    status, answer = http(f"{server.url}/update_weights_from_disk",
                          {"model_path": "/ckpt/v1", "weight_version": "1"})
    assert status == 200 and answer["num_paused_requests"] == 0
    thread.join(5)
    assert results[0]["choices"][0]["finish_reason"] == "stop"  # finished, under the old label
    assert results[0]["metadata"]["weight_version"] == "default"


def start_loading(server, version: str) -> threading.Thread:
    """An update to `version` posted from a thread; returns once the server is loading."""
    updater = threading.Thread(target=lambda: http(
        f"{server.url}/update_weights_from_disk", {"model_path": "p", "weight_version": version}))
    updater.start()
    wait_for(lambda: server._loaded is not None and not server._loaded.is_set(), 5,
             what="the update to start")
    return updater


def test_new_requests_wait_while_weights_load(fake_llm) -> None:
    server = fake_llm(flavor="sglang", load_time_s=1.0)
    messages, _ = game_messages("FrozenLake")
    updater = start_loading(server, "1")
    _, data = http(f"{server.base_url}/chat/completions", chat_body(messages))
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["metadata"]["weight_version"] == "1"  # answered after the load
    updater.join(5)


def test_lora_adapters_load_serve_and_unload(fake_llm) -> None:
    server = fake_llm()
    messages, _ = game_messages("FrozenLake")
    load = f"{server.base_url}/load_lora_adapter"
    assert http(load, {"lora_name": "v1", "lora_path": "/ckpt/v1"})[0] == 200
    assert http(load, {"lora_name": "v1", "lora_path": "/ckpt/v1"})[0] == 400
    _, models = http(f"{server.base_url}/models")
    assert {card["id"]: card["parent"] for card in models["data"]} == {MODEL: None, "v1": MODEL}
    _, data = http(f"{server.base_url}/chat/completions",
                   {"model": "v1", "messages": messages})
    assert data["model"] == "v1"
    assert server.stats["model:v1"] == 1
    unload = f"{server.base_url}/unload_lora_adapter"
    assert http(unload, {"lora_name": "v1"})[0] == 200
    assert http(unload, {"lora_name": "v1"})[0] == 404
    assert http(f"{server.base_url}/chat/completions",
                {"model": "v1", "messages": messages})[0] == 404


def test_api_key_is_required_when_set(fake_llm) -> None:
    server = fake_llm(api_key="s3cret")
    assert http(f"{server.base_url}/models")[0] == 401
    status, _ = http(f"{server.base_url}/models", headers={"Authorization": "Bearer s3cret"})
    assert status == 200


@pytest.mark.slow
def test_command_line_serves_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "rollstream", "fake-llm", "--port", "0",
                             "--p-good", "1", "--latency-s", "0.01"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("fake-llm: serving model 'fake-model' as vLLM 0.33.0 at "
                               "http://127.0.0.1:")
        base_url = line.rsplit(" ", 1)[1].strip()
        messages, _ = game_messages("FrozenLake")
        status, data = http(f"{base_url}/chat/completions", chat_body(messages))
        assert status == 200 and "<answer>" in data["choices"][0]["message"]["content"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_command_line_refuses_bad_options_and_a_busy_port() -> None:
    from helpers import run_cli

    result = run_cli("fake-llm", "--p-good", "2")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--p-good must be in [0, 1]" in result.stderr
    result = run_cli("fake-llm", "--flavor", "trtllm")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--flavor 'trtllm' is not one of llama-cpp-python, llamacpp, sglang" in result.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        result = run_cli("fake-llm", "--port", str(port))
        assert time.monotonic() - start < 30
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_during_load_abort_answers_new_requests_with_abort(fake_llm) -> None:
    server = fake_llm(flavor="sglang", load_time_s=1.0, during_load="abort")
    messages, _ = game_messages("FrozenLake")
    updater = start_loading(server, "2")
    status, data = http(f"{server.base_url}/chat/completions", chat_body(messages))
    assert status == 200 and data["choices"][0]["finish_reason"] == "abort"
    assert data["choices"][0]["message"]["content"] == ""
    updater.join(5)
    _, data = http(f"{server.base_url}/chat/completions", chat_body(messages))
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["metadata"]["weight_version"] == "2"


def test_every_fake_llm_option_says_what_it_does() -> None:
    import argparse
    from dataclasses import fields

    from rollstream.fake_llm import FakeLLMOptions, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    helps = {action.dest: action.help for action in parser._actions}
    for spec in fields(FakeLLMOptions):
        if spec.name != "api_key":
            assert helps[spec.name], spec.name
    assert "(default: 0.8)" in helps["p_good"]
