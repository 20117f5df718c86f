"""Encoding line by line (`ChatTemplate.encode` for a tokenizer `_line_pieces` admits) gives
the ids the tokenizer gives the whole text."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from producers.llm.template import ChatTemplate, _line_pieces  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(ROOT / "scripts"))
    import tiny_model

    folder = tmp_path_factory.mktemp("tok") / "tiny"
    tiny_model.generate(folder)
    return folder


# pieces that meet at line breaks in every way the split pattern treats differently:
# whitespace before and after the break, punctuation runs ending in breaks, \r\n, digits,
# contractions, special tokens, non-ASCII letters and marks after a break
PARTS = ["\n", "\n\n", " \n", "\n ", "\r\n", "  ", " ", "\t", ":\n", "!!\n", "'s", "'ll",
         "Turn 3:", "Observation", "G_O_", "P___", "12345", "x", "é", "\u0301", "日本",
         "<|im_start|>", "<|im_end|>", "<think>", "user", "assistant", ". ", "[a]", "-",
         "\n<|im_start|>user\n", "\n1. ", "\n\t-", "\n'd", "\n123"]


def test_the_tiny_tokenizer_is_encoded_by_lines(tiny: Path) -> None:
    template = ChatTemplate.load(str(tiny))
    assert template._by_lines  # the situation the comparison below is about
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice(PARTS) for _ in range(rng.randint(1, 14)))
        whole = template.tokenizer.encode(text, add_special_tokens=False).ids
        assert template.encode(text) == whole, repr(text)


def test_the_llama3_split_pattern_is_encoded_by_lines(tiny: Path) -> None:
    from tokenizers import Tokenizer

    from producers.llm.template import _LINE_SAFE_PATTERNS

    template = ChatTemplate.load(str(tiny))
    spec = json.loads((tiny / "tokenizer.json").read_text())
    llama3 = next(p for p in _LINE_SAFE_PATTERNS if "{1,3}" in p)
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = llama3
    template.tokenizer = Tokenizer.from_str(json.dumps(spec))
    template._encoded.clear()
    assert _line_pieces(template.tokenizer)
    rng = random.Random(8)
    for _ in range(2000):
        text = "".join(rng.choice(PARTS) for _ in range(rng.randint(1, 14)))
        whole = template.tokenizer.encode(text, add_special_tokens=False).ids
        assert template.encode(text) == whole, repr(text)


def test_an_observation_encoded_by_lines(tiny: Path) -> None:
    template = ChatTemplate.load(str(tiny))
    text = ("<|im_start|>user\nTurn 3:\nObservation:\nG_O_\n____\nP___\n____\nStrictly follow "
            "this format:\n1. output format is '<answer> [your answer] </answer>' with no "
            "extra text. \n2. You have 8 actions left. \n<|im_end|>\n<|im_start|>assistant\n")
    assert template.encode(text) == template.tokenizer.encode(text, add_special_tokens=False).ids
    assert "Observation:\n" in template._encoded  # cut into lines, each kept


def _with(tiny: Path, change) -> bool:  # noqa: ANN001
    from tokenizers import Tokenizer

    spec = json.loads((tiny / "tokenizer.json").read_text())
    change(spec)
    return _line_pieces(Tokenizer.from_str(json.dumps(spec)))


def test_other_tokenizers_are_encoded_whole(tiny: Path) -> None:
    assert _with(tiny, lambda spec: None)

    def pattern(spec: dict) -> None:
        spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"

    def normalizer(spec: dict) -> None:
        spec["normalizer"] = {"type": "NFKC"}

    def lstrip(spec: dict) -> None:
        spec["added_tokens"][1]["lstrip"] = True

    def newline_token(spec: dict) -> None:
        spec["added_tokens"][1]["content"] = "<|im_start|>\nuser"

    for change in (pattern, normalizer, lstrip, newline_token):
        assert not _with(tiny, change), change.__name__
