r"""Reading an answer out of a model's reply, as GEM's envs read it, and QA exact match.

Facts from gem-llm 0.0.4 (the version ROLL pins), `gem/utils/parsing.py` and
`gem/utils/qa_em.py`; the code is ours:
- the boxed answer is the content of the *last* `\boxed{...}` (nested braces counted); a
  `\boxed` not directly followed by `{`, or with unbalanced braces, gives none, and so does
  `\fbox{...}` (GEM looks for it but never accepts it);
- the tagged answer is the last `<answer>...</answer>`, stripped;
- the code is the last fenced block (a language word after the fence allowed), stripped;
- QA exact match: lower case, punctuation removed, the articles a/an/the removed, whitespace
  collapsed, then equal to one of the gold answers.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

BOXED = "\\boxed"
TAGGED_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
CODE_PATTERN = re.compile(r"```(?:\w+)?\n(.*?)```", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def last_boxed(reply: object) -> str | None:
    r"""The content of the last `\boxed{...}` in `reply`, or None."""
    if not isinstance(reply, str):
        return None
    start = reply.rfind(BOXED)
    if start < 0:
        return None
    opening = start + len(BOXED)
    if reply[opening : opening + 1] != "{":
        return None
    depth = 0
    for index in range(opening, len(reply)):
        char = reply[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return reply[opening + 1 : index]
    return None


def last_tagged(reply: object) -> str | None:
    """The stripped content of the last `<answer>...</answer>` in `reply`, or None."""
    if not isinstance(reply, str):
        return None
    matches = TAGGED_PATTERN.findall(reply)
    return matches[-1].strip() if matches else None


def last_code_block(reply: object) -> str | None:
    """The stripped content of the last fenced code block in `reply`, or None."""
    if not isinstance(reply, str):
        return None
    blocks = CODE_PATTERN.findall(reply)
    return blocks[-1].strip() if blocks else None


def normalize_answer(text: str) -> str:
    """A QA answer as exact match compares it."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: Iterable[object]) -> bool:
    """Whether `prediction` equals one of the gold answers after `normalize_answer`."""
    mine = normalize_answer(prediction)
    return any(normalize_answer(str(answer)) == mine for answer in gold)


def gold_answers(answer: object) -> list[str]:
    """A dataset's answer field as a list of gold answers (GEM: a string or number is one
    answer, a list holds several); `ValueError` for anything else."""
    if isinstance(answer, (str, int, float)) and not isinstance(answer, bool):
        return [str(answer)]
    if isinstance(answer, (list, tuple)):
        return [str(item) for item in answer]
    raise ValueError(f"an answer must be a text, a number or a list of them, got "
                     f"{type(answer).__name__}")
