"""GEM's code tasks from a tiny on-disk dataset, and the limited program runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

from producers.envs import make_env
from producers.envs.coderun import forbidden, run_program
from producers.envs.codetasks import parse_tests
from producers.envs.roll_tasks import GEM_ID
from producers.envs.task import TERMINAL_STATE
from schemas.errors import ConfigError

CODE = str(Path(__file__).parent / "data" / "gem" / "code.jsonl")
SUM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
GCD = "Here it is:\n```\na = int(input())\nb = int(input())\nprint(gcd(a, b))\n```"  # no import


def code_env(task: str = "code:CodeContest", **overrides):
    return make_env(GEM_ID, {"task": task, "dataset_name": CODE, "timeout_s": 20, **overrides})


def reset_to(env, words: str) -> None:
    for seed in range(100):
        if words in env.reset(seed=seed)[0]:
            return
    raise AssertionError(words)


def test_check_env_passes() -> None:
    check_env(code_env(disable_env_checker=False).unwrapped)


def test_a_right_program_scores_one_and_ends_the_episode() -> None:
    env = code_env(max_steps=10)
    reset_to(env, "sum")
    assert env.unwrapped.step_text(SUM) == (
        TERMINAL_STATE, 1.0, True, False, {"success": True, "action_is_valid": True})
    assert env.unwrapped.parse_action(SUM).startswith("a, b = map")


def test_gems_retry_with_common_imports_and_list_tests_as_lines() -> None:
    env = code_env()
    reset_to(env, "greatest common divisor")
    assert env.step(GCD)[1] == 1.0


@pytest.mark.parametrize("program", [
    "```python\nprint(3)\n```",  # wrong output
    "```python\nraise SystemExit(1)\n```",  # non-zero exit
    "```python\nimport subprocess\nprint(3)\n```",  # refused by GEM's check
])
def test_a_wrong_program_scores_zero(program: str) -> None:
    env = code_env()
    reset_to(env, "sum")
    assert env.step(program) == (
        TERMINAL_STATE, 0.0, True, False, {"success": False, "action_is_valid": True})


@pytest.mark.parametrize(("task", "reward"), [("code:CodeContest", -0.1), ("roll_code", 0.0)])
def test_a_reply_without_code_gets_gems_or_rolls_reward(task: str, reward: float) -> None:
    env = code_env(task)
    env.reset(seed=0)
    assert env.step("print(3)") == (
        TERMINAL_STATE, reward, True, False, {"success": False, "action_is_valid": False})


def test_the_runner_bounds_time_memory_and_output() -> None:
    looping = run_program("while True:\n    pass\n", "", timeout_s=1)
    assert not looping.ok and looping.reason.startswith(("timed out", "exit code"))
    hog = run_program("x = bytearray(8 << 30)\nprint('done')\n", "", memory_mb=256)
    assert not hog.ok and "MemoryError" in hog.stderr and hog.stdout == ""
    flood = run_program("while True:\n    print('x' * 4096)\n", "", timeout_s=60)
    assert not flood.ok and len(flood.stdout) <= 16 << 20
    echo = run_program("import sys\nprint(sys.stdin.read().upper(), end='')\n", "héllo\n")
    assert echo.ok and echo.stdout == "HÉLLO\n"


def test_the_runner_gives_the_program_a_fresh_folder_and_few_variables(monkeypatch) -> None:
    monkeypatch.setenv("ROLLSTREAM_TEST_SECRET", "hunter2")
    program = ("import os\nprint(os.getcwd() == os.environ['HOME'], "
               "'ROLLSTREAM_TEST_SECRET' in os.environ, sorted(os.listdir('.')))\n")
    result = run_program(program, "")
    assert result.ok and result.stdout.strip() == "True False ['program.py', 'stderr', 'stdout']"


@pytest.mark.parametrize(("code", "name"), [
    ("import socket", "socket"), ("from ctypes import CDLL", "ctypes"),
    ("os.system('ls')", "os.system"), ("sys.exit(0)", "sys.exit"), ("print(1)", None),
])
def test_gems_forbidden_names(code: str, name: str | None) -> None:
    assert forbidden(code) == name


def test_parse_tests_keeps_the_longest_inputs() -> None:
    tests = {"inputs": ["a", "bbb", ["c", "d"], "ee"], "outputs": ["1", "2", ["3", "4"], "5"]}
    assert parse_tests(json.dumps(tests), 2) == [("bbb", "2"), ("c\nd", "3\n4")]
    with pytest.raises(ValueError, match="inputs"):
        parse_tests([{"input": "1", "output": "2"}], 12)


def test_bad_tests_in_a_record_name_it(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "p", "tests": {"inputs": ["1"]}}\n')
    env = code_env(dataset_name=str(path))
    with pytest.raises(ValueError, match="code:CodeContest: record 0, tests: tests must be"):
        env.reset(seed=0)


@pytest.mark.parametrize(("overrides", "words"), [
    ({"sandbox_type": "bwrap"}, "sandbox_type 'bwrap' is not supported"),
    ({"max_tests": 0}, "max_tests must be an integer >= 1"),
    ({"test_kee": "x"}, "unknown env_config keys \\['test_kee'\\]"),
    ({"dataset_name": "axon-rl/NoSuchCode"}, "needs the dataset 'axon-rl/NoSuchCode' on disk"),
])
def test_bad_settings_are_refused_in_one_line(overrides, words, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=words) as excinfo:
        code_env(**overrides)
    assert "\n" not in str(excinfo.value)
