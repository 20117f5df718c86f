"""GEM's math and QA tasks from datasets on disk (ROLL's roll_math, roll_qa, math:, qa:,
logic:), the math grader process, and the dataset lookup."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

from producers.envs import make_env
from producers.envs.grader import MathGrader
from producers.envs.problems import QA_PROMPT
from producers.envs.roll_tasks import GEM_ID
from producers.envs.task import TERMINAL_STATE
from schemas.errors import ConfigError

DATA = Path(__file__).parent / "data" / "gem"
MATH = str(DATA / "math.jsonl")
QA = str(DATA / "qa.jsonl")
needs_math_verify = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                                       reason="math-verify (the reasoning extra) is missing")


def records(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def math_env(**overrides):
    # a generous deadline: a loaded test machine is slower than ROLL's 1s assumes
    return make_env(GEM_ID, {"task": "roll_math", "dataset_name": MATH, "grade_timeout_s": 30,
                             **overrides})


def qa_env(**overrides):
    return make_env(GEM_ID, {"task": "roll_qa", "dataset_name": QA, **overrides})


def reset_to(env, problem: str, key: str = "problem") -> int:
    """Reset with the first seed whose record is `problem`; the seed."""
    for seed in range(500):
        env.reset(seed=seed)
        if env.unwrapped.records[env.unwrapped.index][key] == problem:
            return seed
    raise AssertionError(f"no seed below 500 gives {problem!r}")


@needs_math_verify
def test_check_env_passes() -> None:
    check_env(math_env(disable_env_checker=False).unwrapped)
    check_env(qa_env(disable_env_checker=False).unwrapped)


def test_the_observation_is_a_record_and_reproducible_by_seed() -> None:
    env = math_env()
    problems = [r["problem"] for r in records(MATH)]
    seen = []
    for seed in range(60):
        text, info = env.reset(seed=seed)
        assert text in problems and info == {}
        seen.append(text)
    assert set(seen) == set(problems)  # every record is drawn
    again = math_env()
    assert [again.reset(seed=seed)[0] for seed in range(60)] == seen


@needs_math_verify
@pytest.mark.parametrize(("problem", "reply"), [
    ("What is 17 + 25?", "so \\boxed{42}"),
    ("What is one half of 1, as a fraction?", "\\boxed{0.5}"),  # math-verify: 1/2 == 0.5
    ("What is 2^{10}?", "\\boxed{1024}"),  # a number as the record's answer
    ("Name a root of x^2 - 5x + 6 = 0.", "\\boxed{3}"),  # one of a list of answers
    ("How many sides does a hexagon have?", "\\boxed{6.0}"),
])
def test_a_right_math_answer_scores_one_and_ends_the_episode(problem: str, reply: str) -> None:
    env = math_env(max_steps=10)
    reset_to(env, problem)
    assert env.unwrapped.step_text(reply) == (
        TERMINAL_STATE, 1.0, True, False, {"success": True, "action_is_valid": True})


@needs_math_verify
def test_a_wrong_math_answer_scores_zero() -> None:
    env = math_env()
    reset_to(env, "What is 17 + 25?")
    assert env.step("\\boxed{41}") == (
        TERMINAL_STATE, 0.0, True, False, {"success": False, "action_is_valid": True})


@pytest.mark.parametrize("reply", ["42", "\\boxed 42", "\\boxed{42", "", None])
def test_a_reply_without_a_boxed_answer_scores_zero_and_is_invalid(reply) -> None:
    env = math_env()
    reset_to(env, "What is 17 + 25?")
    assert env.step(reply) == (
        TERMINAL_STATE, 0.0, True, False, {"success": False, "action_is_valid": False})


def test_qa_wraps_the_question_in_gems_prompt_and_matches_exactly() -> None:
    env = qa_env()
    reset_to(env, "Who wrote the play Hamlet?", key="question")
    text = env.render()
    assert text == QA_PROMPT.format(question="Who wrote the play Hamlet?")
    assert text.startswith("For any question, always reason") and "<answer>" in text
    right = "<think>the bard</think> <answer> shakespeare. </answer>"
    assert env.step(right)[1:] == (1.0, True, False, {"success": True, "action_is_valid": True})
    reset_to(env, "Who wrote the play Hamlet?", key="question")
    assert env.step("<answer>Marlowe</answer>")[1] == 0.0
    reset_to(env, "Who wrote the play Hamlet?", key="question")
    assert env.step("\\boxed{Shakespeare}")[1:] == (
        0.0, True, False, {"success": False, "action_is_valid": False})


def test_rule_taker_reads_the_boxed_answer() -> None:
    env = make_env(GEM_ID, {"task": "logic:RuleTaker-d1", "dataset_name": QA})
    assert env.unwrapped.extract_boxed is True and env.unwrapped.question_key == "question"
    reset_to(env, "What is the capital city of Japan?", key="question")
    assert env.step("<answer>Tokyo</answer>")[1] == 0.0
    reset_to(env, "What is the capital city of Japan?", key="question")
    assert env.step("\\boxed{tokyo}")[1] == 1.0


def test_a_missing_dataset_is_refused_in_one_line_naming_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError) as excinfo:
        make_env(GEM_ID, {"task": "math:GSM8K"})
    message = str(excinfo.value)
    assert "\n" not in message and "math:GSM8K" in message
    assert "'axon-rl/GSM-8k'" in message and "env_config.dataset_name" in message
    with pytest.raises(ConfigError, match="roll_math needs env_config.dataset_name"):
        make_env(GEM_ID, {"task": "roll_math"})


def test_a_hub_dataset_in_the_local_cache_is_found(tmp_path, monkeypatch) -> None:
    repo = tmp_path / "datasets--axon-rl--GSM-8k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123\n")
    data = repo / "snapshots" / "abc123" / "data"
    data.mkdir(parents=True)
    (data / "train-00000-of-00001.jsonl").write_text(Path(MATH).read_text())
    (data / "test-00000-of-00001.jsonl").write_text('{"problem": "test only", "answer": "1"}\n')
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    env = make_env(GEM_ID, {"task": "math:GSM8K"})  # GEM's dataset name and keys
    assert {r["problem"] for r in env.unwrapped.records} == {
        r["problem"] for r in records(MATH)}
    test = make_env(GEM_ID, {"task": "math:GSM8K", "split": "test"})
    assert test.reset(seed=0)[0] == "test only"


def test_splits_by_file_name(tmp_path) -> None:
    (tmp_path / "train.jsonl").write_text('{"question": "q train", "answer": "a"}\n')
    (tmp_path / "validation.jsonl").write_text('{"question": "q val", "answer": "a"}\n')
    (tmp_path / "nq-0000.jsonl").write_text('{"question": "q nq", "answer": "a"}\n')
    assert qa_env(dataset_name=str(tmp_path)).unwrapped.records[0]["question"] == "q train"
    assert qa_env(dataset_name=str(tmp_path), split="validation").reset(seed=1)[0].endswith(
        "Question: q val\n")
    eval_env = make_env(GEM_ID, {"task": "eval:NaturalQuestions", "dataset_name": str(tmp_path)})
    assert eval_env.unwrapped.records[0]["question"] == "q nq"  # GEM's split "nq"
    with pytest.raises(ConfigError, match="no split .dev. \\(splits: train, validation\\)"):
        qa_env(dataset_name=str(tmp_path), split="dev")


def test_json_list_files_load(tmp_path) -> None:
    path = tmp_path / "set.json"
    path.write_text(json.dumps(records(MATH)))
    assert len(math_env(dataset_name=str(path)).unwrapped.records) == len(records(MATH))


@pytest.mark.parametrize(("content", "name", "words"), [
    ('{"problem": "p"}\n', "a.jsonl", "record 0 of .* has no answer \\(columns: problem\\)"),
    ("not json\n", "b.jsonl", "cannot read dataset file"),
    ('{"problem": "p", "answer": "1"}', "c.json", "must hold a list of records"),
    ("", "d.jsonl", "is empty"),
])
def test_bad_dataset_files_are_refused_in_one_line(tmp_path, content, name, words) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError, match=words) as excinfo:
        math_env(dataset_name=str(tmp_path / name))
    assert "\n" not in str(excinfo.value)


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch) -> None:
    (tmp_path / "train-0.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError, match="needs pyarrow \\(pip install pyarrow\\)"):
        math_env(dataset_name=str(tmp_path))


@pytest.mark.parametrize(("overrides", "words"), [
    ({"dataset_nme": MATH}, "unknown env_config keys \\['dataset_nme'\\]"),
    ({"grade_timeout_s": 0}, "grade_timeout_s must be > 0"),
    ({"question_key": "prompt"}, "has no prompt"),
])
def test_bad_settings_are_refused(overrides, words) -> None:
    with pytest.raises(ConfigError, match=words):
        math_env(**overrides)


def test_rolls_ignored_keys_are_taken() -> None:
    env = math_env(mode="val", load_from_cache_file=False, max_steps=10)
    assert env.unwrapped.max_steps == 10


@needs_math_verify
def test_the_grader_counts_a_late_answer_wrong_and_starts_again() -> None:
    grader = MathGrader()
    try:
        assert grader.check("\\frac{1}{2}", ["0.5"], timeout_s=60) is True
        first = grader.pid
        assert grader.check("\\frac{1}{2}", ["0.5"], timeout_s=1e-6) is False  # too late
        assert grader.restarts == 1 and grader.pid is None
        assert grader.check("2", ["2"], timeout_s=60) is True and grader.pid != first
    finally:
        grader.close()
    assert grader.pid is None


@needs_math_verify
def test_the_grader_serves_threads_one_answer_at_a_time() -> None:
    grader = MathGrader()
    cases = [(str(n), [str(n if n % 2 else n + 1)], bool(n % 2)) for n in range(12)]
    results: dict[int, bool] = {}

    def check(index: int) -> None:
        answer, gold, _ = cases[index]
        results[index] = grader.check(answer, gold, timeout_s=60)

    try:
        threads = [threading.Thread(target=check, args=(i,)) for i in range(len(cases))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=100)
    finally:
        grader.close()
    assert results == {i: expected for i, (_, _, expected) in enumerate(cases)}
