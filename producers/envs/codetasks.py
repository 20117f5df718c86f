"""GEM's code tasks as single-turn text envs, from data on disk: ROLL's `code:*`, `roll_code`.

As GEM's `CodeEnv` (gem-llm 0.0.4 `gem/envs/code_env.py`) and ROLL's (`roll/pipeline/agentic/
env/gem/code_env.py`): a reset picks a record (by the reset seed); the observation is its
`question_key` field; the program is the last fenced code block of the reply; the record's
`test_key` field holds `{"inputs": [...], "outputs": [...]}` (or that as JSON text), of which
the `max_tests` (12) with the longest inputs are run; the program is right when every run
exits 0 and prints the expected output (both stripped; a list is its items a line each).
Reward 1.0 when right, 0.0 when not; a reply with no code block earns -0.1 from GEM's
`code:*` tasks and 0.0 (`action_is_valid` false) from ROLL's `roll_code`. One step.

Where ours differs (decisions): the runs go one after another and stop at the first failure
(GEM runs them all, five at a time; the verdict is the same), with the limits of
`producers.envs.coderun`. A step can take many seconds: give code tags `threaded: true`.
GEM also only grades datasets whose name mentions taco, apps, codecontest or primeintellect;
here any dataset in the format is graded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from producers.envs.answers import last_code_block
from producers.envs.coderun import MEMORY_MB, TIMEOUT_S, run_program
from producers.envs.localdata import load_records
from producers.envs.task import TERMINAL_STATE, TextTaskEnv
from schemas.errors import ConfigError

GEM_NO_CODE_REWARD = -0.1  # gem-llm 0.0.4 CodeEnv.step, a reply without a code block
IGNORED_KEYS = frozenset({"mode", "max_workers", "verbose", "dataset"})


@dataclass(frozen=True)
class CodeTask:
    dataset_name: str = ""
    split: str | None = None
    no_code_reward: float = GEM_NO_CODE_REWARD


TASKS = {
    "roll_code": CodeTask(no_code_reward=0.0),
    "code:CodeContest": CodeTask("axon-rl/CodeContest", "train"),
    "code:Taco8k": CodeTask("axon-rl/TACO-8k", "train"),
    "code:PrimeIntellect15k": CodeTask("axon-rl/PrimeIntellect-15k", "train"),
    "eval:CodeContest": CodeTask("axon-rl/CodeContest", "test"),
}


def as_text(value: object) -> str:
    """A test input or output as the program sees it: text as is, a list a line per item."""
    if isinstance(value, list):
        return "\n".join(map(str, value))
    return str(value)


def parse_tests(tests: object, max_tests: int) -> list[tuple[str, str]]:
    """(input, expected output) pairs: the `max_tests` with the longest inputs."""
    if isinstance(tests, str):
        tests = json.loads(tests)
    if not (isinstance(tests, dict) and isinstance(tests.get("inputs"), list)
            and isinstance(tests.get("outputs"), list)
            and len(tests["inputs"]) == len(tests["outputs"])):
        raise ValueError('tests must be {"inputs": [...], "outputs": [...]} of equal length')
    pairs = list(zip(tests["inputs"], tests["outputs"], strict=True))
    if len(pairs) > max_tests:
        pairs = sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)[:max_tests]
    return [(as_text(given), as_text(expected)) for given, expected in pairs]


class CodeEnv(TextTaskEnv):
    """One programming problem per episode (`task`: a key of `TASKS`)."""

    def __init__(self, task: str, dataset_name: str | None = None, split: str | None = None,
                 question_key: str = "problem", test_key: str = "tests", seed: int = 0,
                 max_tests: int = 12, sandbox_type: str = "none", timeout_s: float = TIMEOUT_S,
                 memory_mb: int = MEMORY_MB, max_steps: int | None = None,
                 render_mode: str | None = None, **other: Any) -> None:
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        if task not in TASKS:
            raise ConfigError(f"{task} is not a code task (known: {', '.join(TASKS)})")
        unknown = sorted(set(other) - IGNORED_KEYS)
        if unknown:
            raise ConfigError(f"{task}: unknown env_config keys {unknown} (known: dataset_name, "
                              "split, question_key, test_key, seed, max_tests, sandbox_type, "
                              "timeout_s, memory_mb, max_steps)")
        if sandbox_type != "none":
            raise ConfigError(f"{task}: sandbox_type {sandbox_type!r} is not supported (only "
                              "'none': a limited child process)")
        if isinstance(max_tests, bool) or not isinstance(max_tests, int) or max_tests < 1:
            raise ConfigError(f"{task}: max_tests must be an integer >= 1, got {max_tests!r}")
        if not float(timeout_s) > 0 or int(memory_mb) < 64:
            raise ConfigError(f"{task}: timeout_s must be > 0 and memory_mb >= 64")
        spec = TASKS[task]
        self.task, self.no_code_reward = task, spec.no_code_reward
        self.question_key, self.test_key, self.max_tests = question_key, test_key, max_tests
        self.timeout_s, self.memory_mb = float(timeout_s), int(memory_mb)
        self.records = load_records(dataset_name or spec.dataset_name,
                                    split if split is not None else spec.split,
                                    (question_key, test_key), task)
        self.index = 0
        self.tests: list[tuple[str, str]] = []

    def _start(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.index = int(np.random.default_rng(seed).integers(len(self.records)))
        record = self.records[self.index]
        try:
            self.tests = parse_tests(record[self.test_key], self.max_tests)
        except ValueError as exc:
            raise ValueError(f"{self.task}: record {self.index}, {self.test_key}: {exc}") from None
        return str(record[self.question_key]), {}

    def _act(self, reply: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        program = last_code_block(reply)
        if program is None:
            info = {"success": False, "action_is_valid": False}
            return TERMINAL_STATE, self.no_code_reward, True, False, info
        right = self._passes(program)
        info = {"success": right, "action_is_valid": True}
        return TERMINAL_STATE, 1.0 if right else 0.0, True, False, info

    def _answer(self, reply: str) -> str | None:
        return last_code_block(reply)

    def _passes(self, program: str) -> bool:
        for given, expected in self.tests:
            result = run_program(program, given, timeout_s=self.timeout_s,
                                 memory_mb=self.memory_mb)
            if not result.ok or result.stdout.strip() != expected.strip():
                return False
        return True
