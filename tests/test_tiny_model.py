"""scripts/tiny_model.py: the generated tokenizer loads, its templates render as Hugging Face
renders them, the GGUF carries the same vocabulary, and a seed gives the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_servers import load_tiny_model_script
from real_servers import render_chat_template as render

tokenizers = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")
jinja2 = pytest.importorskip("jinja2")


tiny_model = load_tiny_model_script()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    tiny_model.generate(out, seed=0)
    return out


def test_files_and_manifest(model_dir: Path) -> None:
    manifest = json.loads((model_dir / "manifest.json").read_text())
    for name in ["tiny.gguf", "tiny-thinking.gguf", "tokenizer.json", "tokenizer_config.json",
                 "thinking/tokenizer.json", "thinking/tokenizer_config.json",
                 "chatml.jinja", "thinking.jinja"]:
        assert (model_dir / name).is_file(), name
        assert name in manifest["sha256"], name
    assert manifest["vocab_size"] == 1024
    assert manifest["special_tokens"]["<|im_end|>"] == manifest["eos_token_id"]


def test_tokenizer_loads_and_round_trips(model_dir: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 1024
    text = "<|im_start|>user\nPush the box Up: héllo 😀 42<|im_end|>\n"
    ids = tok.encode(text).ids
    assert ids[0] == tok.token_to_id("<|im_start|>")
    assert tok.token_to_id("<|im_end|>") in ids
    # byte-level: any text, emoji included, comes back exactly
    assert tok.decode(ids, skip_special_tokens=False) == text
    think = tok.encode("<think>a</think>").ids
    assert think[0] == tok.token_to_id("<think>") and think[-1] == tok.token_to_id("</think>")
    # digits split one by one, as Qwen2's pre-tokenizer does
    assert len(tok.encode("123456").ids) == 6


def test_chatml_template_renders_and_appends(model_dir: Path) -> None:
    turn1 = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Grid"}]
    first = render(model_dir, turn1)
    assert first == (
        "<|im_start|>system\nPlay.<|im_end|>\n<|im_start|>user\nGrid<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    turn2 = turn1 + [{"role": "assistant", "content": "<think>hm</think>\nUp"},
                     {"role": "user", "content": "Next"}]
    second = render(model_dir, turn2)
    # append-only: the next prompt is the last prompt + the reply as sampled + the new turn
    assert second.startswith(first + "<think>hm</think>\nUp<|im_end|>\n")


def test_thinking_template_drops_earlier_thinking(model_dir: Path) -> None:
    turn1 = [{"role": "user", "content": "Grid"}]
    turn2 = turn1 + [{"role": "assistant", "content": "<think>hm</think>\nUp"},
                     {"role": "user", "content": "Next"}]
    thinking = model_dir / "thinking"
    first, second = render(thinking, turn1), render(thinking, turn2)
    assert "<|im_start|>assistant\nUp<|im_end|>" in second
    assert "<think>" not in second
    assert not second.startswith(first + "<think>hm</think>\nUp<|im_end|>\n")
    # the last assistant turn (after the last user message) keeps its thinking
    turn3 = turn2 + [{"role": "assistant", "content": "<think>so</think>\nDown"}]
    assert "<think>so</think>\nDown" in render(thinking, turn3, add_generation_prompt=False)
    # the GGUF of the thinking variant carries this template, the plain one ChatML
    assert _field(model_dir / "tiny-thinking.gguf", "tokenizer.chat_template") == (
        model_dir / "thinking.jinja").read_text()


def _field(path: Path, key: str):
    reader = gguf.GGUFReader(str(path))
    return reader.fields[key].contents()


def test_gguf_carries_the_tokenizer(model_dir: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    path = model_dir / "tiny.gguf"
    assert _field(path, "general.architecture") == "qwen2"
    assert _field(path, "tokenizer.ggml.model") == "gpt2"
    assert _field(path, "tokenizer.ggml.pre") == "qwen2"
    tokens = _field(path, "tokenizer.ggml.tokens")
    assert len(tokens) == 1024
    assert all(tok.id_to_token(i) == t for i, t in enumerate(tokens))
    types = _field(path, "tokenizer.ggml.token_type")
    assert types[:3] == [3, 3, 3] and types[1022:] == [4, 4] and set(types[3:1022]) == {1}
    assert _field(path, "tokenizer.ggml.eos_token_id") == tok.token_to_id("<|im_end|>")
    assert _field(path, "tokenizer.ggml.add_bos_token") is False
    assert _field(path, "tokenizer.chat_template") == (model_dir / "chatml.jinja").read_text()
    merges = _field(path, "tokenizer.ggml.merges")
    assert merges and all(len(m.split(" ")) == 2 for m in merges)
    reader = gguf.GGUFReader(str(path))
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    # GGUF lists dimensions innermost first: token_embd is n_embd x n_vocab
    assert shapes["token_embd.weight"] == (64, 1024)
    assert shapes["blk.1.attn_k.weight"] == (64, 32)
    assert len([n for n in shapes if n.startswith("blk.")]) == 2 * 12


def test_same_seed_same_bytes_other_seed_other_weights(model_dir: Path, tmp_path: Path) -> None:
    again = tiny_model.generate(tmp_path / "again", seed=0)
    first = json.loads((model_dir / "manifest.json").read_text())
    assert again["sha256"] == first["sha256"]
    other = tiny_model.generate(tmp_path / "other", seed=1)
    assert other["sha256"]["tiny.gguf"] != first["sha256"]["tiny.gguf"]


def test_cli_refuses_a_file_as_output(tmp_path: Path, capsys) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    assert tiny_model.main([str(target)]) == 2
    assert "is not a directory" in capsys.readouterr().err
