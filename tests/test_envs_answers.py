r"""Reading answers out of replies as GEM does: `\boxed{}`, `<answer>`, code blocks, QA match."""

from __future__ import annotations

import pytest

from producers.envs.answers import (
    exact_match,
    gold_answers,
    last_boxed,
    last_code_block,
    last_tagged,
    normalize_answer,
)

BOXED_CASES = [
    ("the answer is \\boxed{42}", "42"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{{a}{b}} trailing", "{a}{b}"),
    ("\\boxed{}", ""),
    ("\\boxed {3}", None),  # a space before the brace: GEM reads nothing
    ("\\boxed{3", None),
    ("\\boxed{1} and \\boxed{2", None),  # only the last one counts, and it is unclosed
    ("\\fbox{7}", None),
    ("no answer", None),
    ("", None),
]
TAGGED_CASES = [
    ("<answer> Paris </answer>", "Paris"),
    ("<answer>a</answer> <answer>\nb\n</answer>", "b"),
    ("<answer>open", None),
    ("<ANSWER>x</ANSWER>", None),
]
CODE_CASES = [
    ("```python\nprint(1)\n```", "print(1)"),
    ("```\na = 1\n```\ntext\n```py\nb = 2\n```", "b = 2"),
    ("```print(1)```", None),  # no newline after the fence
    ("no code", None),
]


@pytest.mark.parametrize(("reply", "expected"), BOXED_CASES)
def test_last_boxed(reply: str, expected: str | None) -> None:
    assert last_boxed(reply) == expected


@pytest.mark.parametrize(("reply", "expected"), TAGGED_CASES)
def test_last_tagged(reply: str, expected: str | None) -> None:
    assert last_tagged(reply) == expected


@pytest.mark.parametrize(("reply", "expected"), CODE_CASES)
def test_last_code_block(reply: str, expected: str | None) -> None:
    assert last_code_block(reply) == expected


@pytest.mark.parametrize("reader", [last_boxed, last_tagged, last_code_block])
def test_non_text_has_no_answer(reader) -> None:
    assert reader(None) is None and reader(b"\\boxed{1}") is None


def test_the_readers_agree_with_gem_llm() -> None:
    """The oracle: gem-llm 0.0.4's own parsing functions, on every case above."""
    from producers.envs.gem import gem_module

    gem_module()
    parsing = pytest.importorskip("gem.utils.parsing")
    for reply, _ in BOXED_CASES:
        assert last_boxed(reply) == parsing.extract_last_boxed_answer(reply), reply
    for reply, _ in TAGGED_CASES:
        assert last_tagged(reply) == parsing.extract_last_tagged_answer(reply), reply
    for reply, _ in CODE_CASES:
        assert last_code_block(reply) == parsing.extract_code_from_model(reply), reply
    qa_em = pytest.importorskip("gem.utils.qa_em")
    for text in ["The  Eiffel Tower!", "an apple a day", "U.S.A.", "  Mixed CASE  "]:
        assert normalize_answer(text) == qa_em.normalize_answer(text)


@pytest.mark.parametrize(("prediction", "gold", "expected"), [
    ("Paris", ["Paris"], True),
    ("  the paris. ", ["Paris"], True),
    ("London", ["Paris"], False),
    ("Berlin", ["Paris", "Berlin"], True),
    ("42", [42], True),
    ("a b", ["ab"], False),
])
def test_exact_match(prediction: str, gold: list, expected: bool) -> None:
    assert exact_match(prediction, gold) is expected


def test_gold_answers() -> None:
    assert gold_answers("2") == ["2"] and gold_answers(3) == ["3"] and gold_answers(0.5) == ["0.5"]
    assert gold_answers(["a", 1]) == ["a", "1"]
    with pytest.raises(ValueError, match="dict"):
        gold_answers({"a": 1})
    with pytest.raises(ValueError, match="bool"):
        gold_answers(True)
