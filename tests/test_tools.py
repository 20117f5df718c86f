"""Tool calls (docs/tools.md): the parsers, the python sandbox as real processes, the tool
loop against the stand-in server, and the checked math task end to end."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
from typing import Any

import pytest
import redis
from helpers import small_config
from llm_helpers import MODEL, fake_llm_factory

from consumer import Batcher
from producers.envs import build_env
from producers.policies import StepContext, make_policy
from producers.tools import parsers
from producers.tools.sandbox import network_isolation, run_python
from schemas.tools import PYTHON_SCHEMA, PythonLimits, ToolsSpec

fake_llm = pytest.fixture(fake_llm_factory)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def unshare_works() -> bool:
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0 \
        if os.path.exists("/usr/bin/unshare") else False


# -- parsers (pure) --------------------------------------------------------------------------
def test_hermes_reads_every_block_and_keeps_the_text_before_them() -> None:
    text = ('<think>two</think><tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n'
            '</tool_call><tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"2\\"}"}'
            '\n</tool_call>')
    parsed = parsers.parse_hermes(text, "c")
    assert parsed.content == "<think>two</think>"
    assert [(c.id, c.arguments["code"]) for c in parsed.calls] == [("c_0", "1"), ("c_1", "2")]
    assert parsed.malformed == []
    assert parsers.parse_hermes("no calls here").calls == []


def test_hermes_marks_a_bad_block_malformed_and_keeps_the_others() -> None:
    text = ('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>'
            '<tool_call>{"name": "python", "arguments": {"code": print(1)}}</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "python"')
    parsed = parsers.parse_hermes(text)
    assert [c.name for c in parsed.calls] == ["python"]
    assert [m.kind for m in parsed.malformed] == ["bad_json", "no_name", "bad_json"]
    assert 'print(1)' in parsed.malformed[0].raw  # the raw text, for the log line


def test_server_calls_keep_their_ids_and_unparsed_blocks_are_malformed() -> None:
    message = {"content": None, "tool_calls": [
        {"id": "chatcmpl-tool-abc", "type": "function",
         "function": {"name": "python", "arguments": '{"code": "print(2)"}'}}]}
    parsed = parsers.from_server(message)
    assert [(c.id, c.arguments) for c in parsed.calls] == [("chatcmpl-tool-abc",
                                                            {"code": "print(2)"})]
    # vLLM's hermes parser gives up on a reply with a bad block: it stays in the content
    gave_up = parsers.from_server({"content": 'ok <tool_call>{"name": x}</tool_call>'})
    assert gave_up.calls == [] and [m.kind for m in gave_up.malformed] == ["unparsed"]
    assert gave_up.content == "ok "


def test_calls_are_checked_against_the_declared_tools() -> None:
    parsed = parsers.parse_hermes(
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": {"src": "1"}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>')
    checked = parsers.check(parsed, [PYTHON_SCHEMA])
    assert [c.arguments for c in checked.calls] == [{"code": "1"}]
    assert [m.kind for m in checked.malformed] == ["unknown_tool", "bad_arguments"]


def test_a_registered_text_parser_is_accepted_by_configs(monkeypatch) -> None:
    from schemas import tools as tool_schemas

    monkeypatch.setattr(tool_schemas, "TEXT_PARSERS", list(tool_schemas.TEXT_PARSERS))
    monkeypatch.setattr(parsers, "TEXT_PARSERS", dict(parsers.TEXT_PARSERS))
    with pytest.raises(ValueError, match="tools.parser 'mine' is unknown"):
        ToolsSpec(parser="mine")
    parsers.register("mine", lambda text, prefix: parsers.Parsed(text))
    assert ToolsSpec(parser="mine").parser == "mine"


# -- the sandbox: real processes -------------------------------------------------------------
LIMITS = PythonLimits(timeout_s=20, cpu_s=1, memory_mb=256, output_bytes=1000)


def sandbox(code: str, limits: PythonLimits = LIMITS) -> Any:
    return asyncio.run(run_python(code, limits))


def test_the_sandbox_runs_code_and_returns_what_it_prints() -> None:
    result = sandbox("print(6 * 7)")
    assert (result.status, result.output, result.returncode) == ("ok", "42\n", 0)
    failed = sandbox("raise SystemExit(3)")
    assert failed.status == "error" and failed.for_model().endswith("[exit code 3]")


def test_an_infinite_loop_is_killed_by_its_cpu_limit() -> None:
    result = sandbox("while True: pass")
    assert result.status == "cpu_limit" and result.returncode is not None
    assert result.for_model().endswith("[killed: CPU time limit]")


def test_a_sleeping_program_is_killed_at_its_timeout() -> None:
    result = sandbox("import time\nprint('started', flush=True)\ntime.sleep(600)",
                     PythonLimits(timeout_s=1, cpu_s=5))
    assert result.status == "timeout" and result.returncode == -9


def test_a_memory_hog_gets_a_memory_error() -> None:
    code = "x = bytearray(600 * 1024 * 1024)\nprint('allocated')"
    hog = sandbox(code)
    assert hog.status == "error" and "MemoryError" in hog.output
    assert "allocated" in sandbox(code, PythonLimits(memory_mb=2048)).output  # the control


def test_output_is_capped_and_the_writer_killed() -> None:
    result = sandbox("import sys\nwhile True: sys.stdout.write('a' * 100)")
    assert result.status == "output_limit" and len(result.output) == 1000
    assert set(result.output) == {"a"}


def test_each_call_gets_a_fresh_directory_and_none_of_our_environment() -> None:
    os.environ["ROLLSTREAM_TEST_SECRET"] = "s3cret"
    try:
        first = sandbox("import os\nopen('kept.txt', 'w').write('x')\nprint(os.getcwd())\n"
                        "print(sorted(os.environ))")
    finally:
        del os.environ["ROLLSTREAM_TEST_SECRET"]
    second = sandbox("import os\nprint(os.path.exists('kept.txt'))\nprint(os.getcwd())")
    assert "ROLLSTREAM_TEST_SECRET" not in first.output and "s3cret" not in first.output
    cwd = first.output.splitlines()[0]
    assert second.output.splitlines() == ["False", second.output.splitlines()[1]]
    assert second.output.splitlines()[1] != cwd and not os.path.exists(cwd)


@pytest.mark.skipif(not unshare_works(), reason="unshare -rn is not allowed here")
def test_the_sandbox_has_no_network() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), "
            "timeout=5)\n    print('connected')\nexcept OSError as e:\n    print('failed', e)")
    try:
        assert asyncio.run(network_isolation()) == ""
        isolated = sandbox(code)
        assert isolated.isolated and isolated.output.startswith("failed")
        allowed = sandbox(code, PythonLimits(network=True))  # the control: the listener is up
        assert not allowed.isolated and allowed.output.startswith("connected")
    finally:
        listener.close()


def test_the_event_loop_runs_on_while_a_tool_runs(tmp_path) -> None:
    """A program that waits for a file only a second sandbox call makes finishes: the loop
    started that call while the first one ran."""
    flag = tmp_path / "flag"
    waiter = (f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)\n"
              "print('saw it')")
    maker = f"open({str(flag)!r}, 'w').write('x')"

    async def both() -> Any:
        first = asyncio.ensure_future(run_python(waiter, PythonLimits(timeout_s=30)))
        await asyncio.sleep(0)
        await run_python(maker, PythonLimits())
        return await first

    assert asyncio.run(both()).output == "saw it\n"


# -- the tool loop against the stand-in ------------------------------------------------------
class Sums:
    """A text env whose question holds several sums (built without a config tag)."""

    def __init__(self, question: str, spec: ToolsSpec) -> None:
        self.question, self.tool_spec, self.unwrapped = question, spec, self
        self.spec, self.max_steps, self.instruction = None, 1, question
        self.seen: list[str] = []

    def parse_action(self, text: str) -> str | None:
        self.seen.append(text)
        return text


def act(server: Any, env: Any, observation: str,
        ctx: StepContext | None = None) -> tuple[Any, StepContext]:
    policy = make_policy(small_config(policy={"type": "openai", "base_urls": [server.base_url],
                                              "model": MODEL, "max_tokens": 256}).policy)
    ctx = ctx or StepContext(env=env, seed=3, version=0, mode="train", group_id=0,
                             episode_id=0, member=0, tag="Sums")

    async def go() -> Any:
        await policy.start()
        try:
            return await policy.act(observation, ctx)
        finally:
            await policy.close()

    return asyncio.run(go())[1], ctx


def test_a_turn_that_fails_between_tool_rounds_leaves_no_half_turn(fake_llm) -> None:
    """The request after the tool results fails (a 4xx, not retried): the conversation is
    as it was before the turn, tool messages and all removed, so the turn can be sent again."""
    server = fake_llm(latency_s=0.001, malformed_share=0.0)
    server.fail_marked("tool_call_id", status=400)
    env = Sums("", ToolsSpec(functions=["python"]))
    ctx = StepContext(env=env, seed=3, version=0, mode="train", group_id=0, episode_id=0,
                      member=0, tag="Sums")
    with pytest.raises(Exception, match="400"):
        act(server, env, "Calculate 2 + 2.", ctx)
    assert len(server.requests) >= 1 and [m["role"] for m in ctx.scratch["chat"]] == ["system"]
    server.fail_marked(None)
    turn, _ = act(server, env, "Calculate 2 + 2.", ctx)
    assert "\\boxed{4}" in turn.text
    assert [m["role"] for m in ctx.scratch["chat"]] == ["system", "user", "assistant", "tool",
                                                         "assistant"]


@pytest.mark.parametrize(("flavor", "id_prefix"), [("vllm", "chatcmpl-tool-"),
                                                   ("sglang", "call_")])
def test_several_calls_in_one_turn_run_up_to_the_cap(fake_llm, flavor, id_prefix) -> None:
    server = fake_llm(flavor=flavor, latency_s=0.001, malformed_share=0.0)
    env = Sums("", ToolsSpec(functions=["python"], max_calls_per_turn=2))
    turn, ctx = act(server, env, "Calculate 1 + 2 and 3 * 4 and 5 - 6.")
    first, second = server.requests[0], server.requests[1]
    assert first["tools"][0]["function"]["name"] == "python" and first["tool_choice"] == "auto"
    called = second["messages"][-4]
    assert called["role"] == "assistant" and len(called["tool_calls"]) == 3
    results = second["messages"][-3:]
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in called["tool_calls"]]
    assert all(c["id"].startswith(id_prefix) for c in called["tool_calls"])  # the server's
    assert [m["content"] for m in results] == ["3\n", "12\n", "not run: at most 2 tool "
                                               "calls per turn"]
    assert turn.extra["tool_calls"] == 2 and turn.extra["tool_malformed"] == 0
    assert turn.extra["tool_rounds"][0]["not_run"] == 1
    assert "\\boxed{" in turn.text and ctx.scratch["chat"][-1]["content"] == turn.text


class EnvTools(Sums):
    """An env that runs its own tool (a `python` schema of its own, not the built-in)."""

    tools = [{"type": "function", "function": {
        "name": "python", "parameters": {"type": "object", "required": ["code"]}}}]

    def __init__(self, fail: bool) -> None:
        super().__init__("", None)  # type: ignore[arg-type]
        self.fail, self.calls = fail, []

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        self.calls.append((name, arguments))
        if self.fail:
            raise ValueError("the index is down")
        return {"value": 99}


@pytest.mark.parametrize("fail", [False, True], ids=["answers", "raises"])
def test_an_env_runs_its_own_tools(fake_llm, fail: bool) -> None:
    server = fake_llm(latency_s=0.001, malformed_share=0.0)
    env = EnvTools(fail)
    turn, _ = act(server, env, "Calculate 5 * 5.")
    assert env.calls and env.calls[0][0] == "python" and "5 * 5" in env.calls[0][1]["code"]
    result = server.requests[1]["messages"][-1]
    assert result["role"] == "tool"
    assert result["content"] == ("error: ValueError: the index is down" if fail
                                 else '{"value": 99}')
    assert turn.extra["tool_calls"] == 1


def test_without_namespaces_the_sandbox_warns_once_and_runs(monkeypatch, caplog) -> None:
    """Where unshare cannot make namespaces (its reason as found), the program runs with the
    machine's network, every other limit in force, and the producer says so once."""
    from producers.tools import sandbox as box

    monkeypatch.setattr(box, "_isolation", "unshare: unshare failed: Operation not permitted")
    monkeypatch.setattr(box, "_warned", False)
    caplog.set_level(logging.WARNING, logger="producers.tools.sandbox")
    first, second = sandbox("print(1)"), sandbox("while True: pass")
    assert (first.output, first.isolated) == ("1\n", False)
    assert second.status == "cpu_limit"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "Operation not permitted" in lines[0]


@pytest.mark.parametrize(("flavor", "parser", "kind"), [("vllm", "server", "unparsed"),
                                                        ("sglang", "hermes", "bad_json")])
def test_a_malformed_call_ends_the_turn_counted_and_first_logged(fake_llm, caplog, flavor,
                                                                 parser, kind) -> None:
    server = fake_llm(flavor=flavor, latency_s=0.001, malformed_share=1.0)
    env = Sums("", ToolsSpec(functions=["python"], parser=parser))
    caplog.set_level(logging.WARNING, logger="producers.tools.loop")
    turn, _ = act(server, env, "Calculate 4 * 4.")
    assert len(server.requests) == 1  # no tool ran, the env got the reply as written
    assert turn.extra["tool_malformed"] == 1 and turn.extra["tool_calls"] == 0
    assert env.seen == [turn.text] and "<tool_call>" in turn.text
    if parser == "hermes":
        assert server.requests[0]["tool_choice"] == "none"
    lines = [r.getMessage() for r in caplog.records if "malformed tool call" in r.getMessage()]
    assert len(lines) == 1 and kind in lines[0] and "print(4 * 4)" in lines[0]


# -- the example agent task: a checked math task with the python tool, end to end -------------
def math_config(base_url: str) -> Any:
    return small_config(
        rollout_batch_size=8,
        train_env_manager={"max_env_num_per_worker": 8, "num_env_groups": 4, "group_size": 2,
                           "tags": ["Math"]},
        val_env_manager={"max_env_num_per_worker": 8, "num_env_groups": 2, "group_size": 1,
                         "tags": ["Math"]},
        custom_envs={"Math": {"env_type": "rg:basic_arithmetic", "env_config": {"size": 100},
                              "tools": {"functions": ["python"],
                                        "python": {"timeout_s": 20}}}},
        policy={"type": "openai", "base_urls": [base_url], "model": MODEL, "max_tokens": 256,
                "timeout_s": 10.0})


@pytest.mark.parametrize("malformed_share", [0.0, 0.5], ids=["clean", "malformed"])
def test_the_math_task_with_the_python_tool_end_to_end(fake_llm, producer_thread, caplog,
                                                       r: redis.Redis, run: str,
                                                       malformed_share: float) -> None:
    pytest.importorskip("reasoning_gym")
    server = fake_llm(latency_s=0.001, malformed_share=malformed_share)
    batcher = Batcher(r, math_config(server.base_url), run=run)
    caplog.set_level(logging.WARNING, logger="producers.tools.loop")
    producer_thread()
    batch = batcher.get_batch(timeout_s=60)
    steps = [s for t in batch.trajectories for s in t["steps"]]
    assert len(steps) == len(batch.trajectories) == 8  # one answer per question
    bad = [s for s in steps if s["tool_malformed"]]
    assert batch.metrics["tools/malformed"] == len(bad)
    assert batch.metrics["tools/calls"] == sum(s["tool_calls"] for s in steps)
    for s in steps:
        if s["tool_malformed"]:
            assert s["reward"] == 0.0 and "tool_rounds" not in s
        else:  # the sandbox computed it, the model boxed it, reasoning-gym scored it
            assert s["tool_calls"] == 1 and s["reward"] == 1.0
            (rounds,) = s["tool_rounds"]
            assert rounds["results"][0].strip() in s["response"]
    logged = [r.getMessage() for r in caplog.records if "malformed tool call" in r.getMessage()]
    if malformed_share == 0.0:
        assert not bad and not logged and batch.metrics["env/Math/success"] == 1.0
    else:
        assert bad and len(logged) == 1 and "<tool_call>" in logged[0]
    batcher.ack(batch)


def test_a_tool_spec_refuses_unknown_builtins_and_parsers() -> None:
    with pytest.raises(ValueError, match="'shell' is not a built-in tool"):
        ToolsSpec(functions=["shell"])
    with pytest.raises(ValueError, match="needs function.name"):
        ToolsSpec(functions=[{"type": "function"}])


def test_build_env_hands_the_tags_tools_to_the_env() -> None:
    pytest.importorskip("reasoning_gym")
    env = build_env(math_config("http://127.0.0.1:1"), "Math")
    assert env.unwrapped.tool_spec.functions == ["python"]




def test_a_bad_tools_block_is_one_line_and_exit_2(tmp_path) -> None:

    from helpers import run_cli

    path = tmp_path / "tools.yaml"
    path.write_text("rollout_batch_size: 8\n"
                    "train_env_manager: {num_env_groups: 4, group_size: 2, tags: [Math]}\n"
                    "val_env_manager: {num_env_groups: 2, group_size: 1, tags: [Math]}\n"
                    "custom_envs:\n  Math:\n    env_type: 'rg:basic_arithmetic'\n"
                    "    tools: {functions: [python], parser: qwen}\n")
    out = run_cli("config", "check", str(path), timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"rollstream: error: {path}: custom_envs.Math.tools.parser: tools.parser 'qwen' is "
        "unknown (known: server, hermes)"]


def test_a_tags_sandboxes_run_at_most_max_parallel_at_once(tmp_path) -> None:
    """Four calls of one reply, `max_parallel` 2: each program counts the programs running
    (files in a shared folder) until it sees a third or 1.5 s pass; none sees more than 2
    (without the cap all four start at once and each sees 3 or 4)."""
    from producers.policies import Turn
    from producers.tools.loop import ToolLoop

    program = (
        "import os, time, uuid\n"
        f"d = {str(tmp_path)!r}\n"
        "open(os.path.join(d, 'start-' + uuid.uuid4().hex), 'w').close()\n"
        "seen, end = 0, time.time() + 1.5\n"
        "while time.time() < end and seen < 3:\n"
        "    names = os.listdir(d)\n"
        "    seen = max(seen, sum(n.startswith('start-') for n in names)"
        " - sum(n.startswith('end-') for n in names))\n"
        "    time.sleep(0.01)\n"
        "open(os.path.join(d, 'end-' + uuid.uuid4().hex), 'w').close()\n"
        "print(seen)\n")
    block = json.dumps({"name": "python", "arguments": {"code": program}})
    text = f"<tool_call>{block}</tool_call>" * 4
    spec = ToolsSpec(functions=["python"], parser="hermes", max_calls_per_turn=4,
                     python={"max_parallel": 2, "timeout_s": 20})
    env = Sums("", spec)
    ctx = StepContext(env=env, seed=0, version=0, mode="train", group_id=0, episode_id=0,
                      member=0, tag="Sums")
    messages: list[dict[str, Any]] = []

    async def generate() -> Any:
        return Turn(text="done"), {}

    final = asyncio.run(ToolLoop().play(env, ctx, messages, Turn(text=text), {}, generate))
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert final.text == "done" and len(results) == 4
    assert all(1 <= int(r) <= 2 for r in results), results  # without the cap: 3 or 4


def test_a_call_cut_short_kills_its_program(tmp_path) -> None:
    """A turn cancelled while its tool runs (a pause, a stop) kills the program: once the
    cancellation is over, the FIFO it held open for writing has no writer left (EOF)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    code = (f"import time\nf = open({str(fifo)!r}, 'w')\nf.write('up\\n')\nf.flush()\n"
            "time.sleep(600)")

    async def cut_short() -> bytes:
        task = asyncio.ensure_future(run_python(code, PythonLimits(timeout_s=600, cpu_s=600)))
        got = b""
        while b"up" not in got:
            await asyncio.sleep(0.01)
            try:
                got += os.read(reader, 100)
            except BlockingIOError:
                pass
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return os.read(reader, 100)

    try:
        assert asyncio.run(cut_short()) == b""  # EOF: the writer is gone
    finally:
        os.close(reader)
