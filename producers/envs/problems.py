r"""GEM's math and QA datasets as single-turn text envs, from data on disk.

ROLL's env types `roll_math`, `roll_qa` and GEM's registered `math:*`, `qa:*`, `logic:*` and
`eval:*` tasks (gem-llm 0.0.4 `gem/envs/__init__.py` gives each its hub dataset, split and
keys; ROLL's `roll/pipeline/agentic/env/gem/{math,qa}_env.py` the rewards and metrics):
- a reset picks one record of the dataset (uniformly, by the reset seed); the observation is
  its `question_key` field: as it is for math, inside GEM's QA prompt (think, then
  `<answer>`) for QA;
- math: the answer is the last `\boxed{}` of the reply, right when math-verify finds it equal
  to the record's answer (or one of a list), graded in a child process with ROLL's 1 second
  deadline (`grade_timeout_s`; see `producers.envs.grader`);
- QA: the answer is the last `<answer>` tag (the last `\boxed{}` for `extract_boxed`, as
  the RuleTaker tasks set), right on a normalised exact match;
- reward 1.0 when right, 0.0 when wrong or when the reply has no answer (`action_is_valid`
  false then, as ROLL records it); `success` when right; the episode ends after the step.

The data never comes from the network: see `producers.envs.localdata` for where
`dataset_name` is looked for. Differences (decisions): ROLL's val mode walks its dataset in
order, once (its `GlobalDataset` "traversal"), which needs the episode's index that a reset
does not carry: val draws by seed as train does (a round's seeds repeat, so rounds compare).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from producers.envs.answers import exact_match, gold_answers, last_boxed, last_tagged
from producers.envs.grader import GRADE_TIMEOUT_S, shared_grader
from producers.envs.localdata import load_records
from producers.envs.task import TERMINAL_STATE, TextTaskEnv
from schemas.errors import ConfigError

logger = logging.getLogger(__name__)

# GEM's QA prompt (gem-llm 0.0.4 `gem/envs/qa_env.py` `apply_prompt`), around the question.
QA_PROMPT = (
    "For any question, always reason through your thought process using:\n"
    "<think> your reasoning here </think>\n"
    "Then, provide your final answer using:\n"
    "<answer> your answer here </answer>\n\n"
    "Question: {question}\n"
)
# env_config keys GEM's and ROLL's envs take and rollstream has no use for (ROLL: `mode`
# picks its dataset actor; `load_from_cache_file` is a `datasets` cache switch).
IGNORED_KEYS = frozenset({"mode", "load_from_cache_file", "dataset", "max_workers",
                          "verbose"})


@dataclass(frozen=True)
class Problems:
    """Where a task's records come from and how its answers are read."""

    kind: str  # "math" or "qa"
    dataset_name: str = ""
    split: str | None = None
    question_key: str = "problem"
    answer_key: str = "answer"
    extract_boxed: bool = False


def _tasks() -> dict[str, Problems]:
    """GEM's registered math and QA tasks and ROLL's two types, with their defaults."""
    tasks = {
        "roll_math": Problems("math"),
        "roll_qa": Problems("qa", question_key="question"),
        "qa:NaturalQuestions": Problems("qa", "axon-rl/NaturalQuestions", "train"),
        "qa:HotpotQA": Problems("qa", "axon-rl/HotpotQA", "train"),
        "eval:QaOpen": Problems("qa", "google-research-datasets/nq_open", "validation",
                                "question"),
    }
    for name, hub in [("ASDiv2K", "ASDIV-2k"), ("GSM8K", "GSM-8k"), ("Math12K", "MATH-12k"),
                      ("Math8K-3to5", "MATH-lvl3to5-8k"), ("Orz57K", "ORZ-57k"),
                      ("DeepScaleR40K", "DeepScaleR-40K")]:
        tasks[f"math:{name}"] = Problems("math", f"axon-rl/{hub}")
    for name, split in [("MATH500", "math"), ("AMC", "amc"), ("OlympiadBench", "olympiad_bench"),
                        ("Minerva", "minerva"), ("AIME24", "aime24")]:
        tasks[f"eval:{name}"] = Problems("math", "axon-rl/math-eval", split)
    for depth in (0, 1, 2, 3, 5):
        tasks[f"logic:RuleTaker-d{depth}"] = Problems(
            "qa", f"axon-rl/RuleTaker-d{depth}-70k", "train", "question", extract_boxed=True)
    for split, name in [("2wiki", "2Wiki"), ("popqa", "PopQA"), ("tq", "TriviaQA"),
                        ("hotpotqa", "HotpotQA"), ("bamboogle", "Bamboogle"),
                        ("nq", "NaturalQuestions"), ("musique", "Musique")]:
        tasks[f"eval:{name}"] = Problems("qa", "axon-rl/search-eval", split, "question")
    return tasks


TASKS = _tasks()


class ProblemEnv(TextTaskEnv):
    """One record of a math or QA dataset per episode (`task`: a key of `TASKS`); the
    env_config keys override the task's defaults."""

    def __init__(self, task: str, dataset_name: str | None = None, split: str | None = None,
                 question_key: str | None = None, answer_key: str | None = None,
                 extract_boxed: bool | None = None, seed: int = 0,
                 grade_timeout_s: float = GRADE_TIMEOUT_S, max_steps: int | None = None,
                 render_mode: str | None = None, **other: Any) -> None:
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        if task not in TASKS:
            raise ConfigError(f"{task} is not a math or QA task (known: {', '.join(TASKS)})")
        unknown = sorted(set(other) - IGNORED_KEYS)
        if unknown:
            raise ConfigError(f"{task}: unknown env_config keys {unknown} (known: dataset_name, "
                              "split, question_key, answer_key, extract_boxed, seed, "
                              "grade_timeout_s, max_steps)")
        spec = TASKS[task]
        self.task, self.kind = task, spec.kind
        self.question_key = question_key or spec.question_key
        self.answer_key = answer_key or spec.answer_key
        self.extract_boxed = spec.extract_boxed if extract_boxed is None else bool(extract_boxed)
        if not float(grade_timeout_s) > 0:
            raise ConfigError(f"{task}: grade_timeout_s must be > 0, got {grade_timeout_s!r}")
        self.grade_timeout_s = float(grade_timeout_s)
        if self.kind == "math" and importlib.util.find_spec("math_verify") is None:
            raise ConfigError(f"{task} grades answers with math-verify, which is not installed "
                              "(pip install 'rollstream[reasoning]')")
        self.records = load_records(dataset_name or spec.dataset_name,
                                    split if split is not None else spec.split,
                                    (self.question_key, self.answer_key), task)
        self.index = 0  # the record of the episode
        self.answer: object = None

    def _start(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.index = int(np.random.default_rng(seed).integers(len(self.records)))
        record = self.records[self.index]
        self.answer = record[self.answer_key]
        question = str(record[self.question_key])
        return (QA_PROMPT.format(question=question) if self.kind == "qa" else question), {}

    def _act(self, reply: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = self._answer(reply)
        right = answer is not None and self._right(answer)
        info = {"success": right, "action_is_valid": answer is not None}
        return TERMINAL_STATE, 1.0 if right else 0.0, True, False, info

    def _answer(self, reply: str) -> str | None:
        if self.kind == "math" or self.extract_boxed:
            return last_boxed(reply)
        return last_tagged(reply)

    def _right(self, answer: str) -> bool:
        gold = gold_answers(self.answer)
        if self.kind == "qa":
            return exact_match(answer, gold)
        return shared_grader().check(answer, gold, self.grade_timeout_s)
