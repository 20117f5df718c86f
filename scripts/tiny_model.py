"""Generate a tiny random-weight chat model for tests that run real inference servers.

    python scripts/tiny_model.py OUT_DIR [--seed 0]

No download and no torch: a byte-level BPE tokenizer is trained with `tokenizers` on text
this script makes from its seed (grid games, actions, chat turns, tool calls, digits), and a
2-layer Qwen2-architecture model with random weights is written as GGUF with `gguf` and
numpy, the tokenizer embedded as llama.cpp reads a BPE model (tokenizer.ggml.*, chat template
included). The same seed gives the same bytes; a run takes a second or two.

OUT_DIR receives:
    tiny.gguf               the model, ChatML chat template (append-only: every turn extends
                            the previous prompt)
    tiny-thinking.gguf      the same model with a Qwen3-style template that drops the
                            thinking of earlier assistant turns (not append-only)
    tokenizer.json          Hugging Face layout, loadable by `tokenizers` and `transformers`
    tokenizer_config.json   ChatML template, special tokens
    thinking/               tokenizer.json + tokenizer_config.json with the Qwen3-style template
    tools/                  tokenizer.json + tokenizer_config.json with Qwen3's template:
                            tools, tool messages and thinking as Qwen3 renders them
    chatml.jinja, thinking.jinja, tools.jinja   the templates (llama-server
                            --chat-template-file)
    manifest.json           sizes, special token ids, seed, sha256 of every file

Facts this follows: the Qwen2 pre-tokenizer regex and its llama.cpp name `qwen2` (llama.cpp
as vendored in llama-cpp-python 0.3.36, src/llama-vocab.cpp, the QWEN2 pre-type); the Qwen2
tensors llama.cpp loads (same source, src/models/qwen2.cpp: q/k/v biases optional, output
optional); GGUF token types 1 normal, 3 control, 4 user-defined (gguf 0.19, constants.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

# The pre-tokenizer split of Qwen2's tokenizer.json; llama.cpp applies the same split for
# tokenizer.ggml.pre = "qwen2", so llama-server and `tokenizers` give the same ids.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL = [ENDOFTEXT, IM_START, IM_END]  # control tokens, ids 0, 1, 2
THINK = ["<think>", "</think>"]  # added tokens, not special (as Qwen3 has them)

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3-style: an assistant turn before the last user message loses its <think>...</think>
# part, so the prompt of turn k+1 is not the prompt of turn k plus the new messages.
THINKING = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and loop.index0 < ns.last_user"
    " and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen3's chat template, tools and thinking (Qwen/Qwen3-* tokenizer_config.json
# chat_template, written here in our own words; Qwen2.5's writes the same tool parts, with a
# default system message and no thinking): with `tools`, the system message gets a
# "# Tools" section, each function schema one JSON line (`tojson`) between <tools> and
# </tools>; an assistant message's `tool_calls` follow its content as <tool_call> blocks;
# consecutive `tool` messages share one user turn, each a <tool_response>. An assistant
# message after the last user query (a user message that is not only tool responses) keeps
# its <think> block, the last one gets an empty one when it has none; earlier ones lose
# theirs. So a reply followed by more messages renders otherwise than the same reply last:
# not append-only. Not in a GGUF: llama-server's models keep CHATML and THINKING.
TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
TOOLS = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}"
    "{%- endif %}"
    "{{- " + json.dumps(TOOLS_HEADER) + " }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- " + json.dumps(TOOLS_FOOTER) + " }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    # the last user query: scanning back, the first user message not only tool responses
    "{%- set ns = namespace(query=messages|length - 1, scanning=true) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set text = message['content'] if message['content'] is string else '' %}"
    "{%- if ns.scanning and message['role'] == 'user' and not (text.startswith("
    "'<tool_response>') and text.endswith('</tool_response>')) %}"
    "{%- set ns.scanning = false %}{%- set ns.query = messages|length - 1 - loop.index0 %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set content = message['content'] or '' %}"
    "{%- set reasoning = '' %}"
    "{%- if message['reasoning_content'] is defined and message['reasoning_content'] "
    "is not none %}{%- set reasoning = message['reasoning_content'] %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
    ".lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if call['function'] %}{%- set call = call['function'] %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{%- if call['arguments'] is string %}{{- call['arguments'] }}"
    "{%- else %}{{- call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# model shape: small enough to write and load in well under a second
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 2, 64, 4, 2, 128
CONTEXT = 4096  # n_ctx_train: llama-server caps a slot's context at it
VOCAB = 1024

WORDS = (
    "you are an agent playing a game the grid shows walls boxes targets and the player "
    "push every box onto a target move up down left right reach the goal without falling "
    "into a hole frozen lake ice step reward done success failed answer with one action "
    "think first then act the observation is below your previous actions were invalid "
    "please try again format your answer as shown turn episode score"
).split()
ACTIONS = ["Up", "Down", "Left", "Right", "up", "down", "left", "right"]
GRID = "#_.OXPGBCA@W"


def _lines(rng: random.Random) -> list[str]:
    """One chunk of training text: a few kinds of line an agent's prompt is made of."""
    kind = rng.randrange(6)
    if kind == 0:
        size = rng.choice([4, 6, 8])
        return ["".join(rng.choice(GRID) for _ in range(size)) for _ in range(size)]
    if kind == 1:
        act = rng.choice(ACTIONS)
        return [f"<answer>{act}</answer>", f"Action: {act}", f"{IM_START}assistant"]
    if kind == 2:
        step, reward = rng.randrange(100), rng.choice(["0", "1", "-0.1", "10", "0.5"])
        return [f'{{"step": {step}, "reward": {reward}, "done": {rng.choice(["true", "false"])}}}']
    if kind == 3:
        name = rng.choice(["move", "look", "python", "search"])
        arg = rng.choice(ACTIONS)
        return [f'{{"name": "{name}", "arguments": {{"direction": "{arg}"}}}}']
    if kind == 4:
        return [" ".join(str(rng.randrange(10**rng.randrange(1, 5))) for _ in range(8))]
    n = rng.randrange(5, 20)
    words = " ".join(rng.choice(WORDS) for _ in range(n))
    return [words[0].upper() + words[1:] + rng.choice([".", "?", "!", ":"])]


def corpus(seed: int, n_chunks: int = 6000) -> list[str]:
    rng = random.Random(seed)
    text = []
    for _ in range(n_chunks):
        role = rng.choice(["system", "user", "assistant"])
        body = "\n".join(_lines(rng))
        if rng.random() < 0.2:
            body = f"<think>{body}</think>\n" + "\n".join(_lines(rng))
        text.append(f"{IM_START}{role}\n{body}{IM_END}\n")
    return text


def train_tokenizer(seed: int, vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(THINK),
        min_frequency=2,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    tok.add_tokens(THINK)
    return tok


def tokenizer_config(template: str) -> dict:
    decoder = {}
    for i, content in enumerate(SPECIAL):
        decoder[str(i)] = _added(content, special=True)
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,  # the <think> pair is filled in by write_hf()
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": CONTEXT,
        "pad_token": ENDOFTEXT,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def _added(content: str, special: bool) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special}


def write_hf(tok, out: Path, template: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = tokenizer_config(template)
    for content in THINK:
        config["added_tokens_decoder"][str(tok.token_to_id(content))] = _added(content, False)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def vocab_for_gguf(tok) -> tuple[list[str], list[int], list[str]]:
    """Token strings by id, their GGUF types, and the merges as 'a b' strings."""
    import gguf

    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    if "" in tokens:
        raise SystemExit("tiny_model: the trained vocabulary has gaps in its ids")
    types = []
    for text in tokens:
        if text in SPECIAL:
            types.append(int(gguf.TokenType.CONTROL))
        elif text in THINK:
            types.append(int(gguf.TokenType.USER_DEFINED))
        else:
            types.append(int(gguf.TokenType.NORMAL))
    merges = json.loads(tok.to_str())["model"]["merges"]
    # tokenizers >= 0.20 saves merges as pairs, older versions as "a b" strings
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    return tokens, types, merges


def weights(seed: int, n_vocab: int) -> dict:
    """Qwen2 tensors by GGUF name, numpy shapes (out, in) as PyTorch stores them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS
    kv = KV_HEADS * head_dim

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.5 / np.sqrt(cols)).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    t = {"token_embd.weight": mat(n_vocab, HIDDEN), "output_norm.weight": ones(HIDDEN),
         "output.weight": mat(n_vocab, HIDDEN)}
    for i in range(LAYERS):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = ones(HIDDEN)
        t[b + "attn_q.weight"] = mat(HIDDEN, HIDDEN)
        t[b + "attn_k.weight"] = mat(kv, HIDDEN)
        t[b + "attn_v.weight"] = mat(kv, HIDDEN)
        t[b + "attn_q.bias"] = np.zeros(HIDDEN, dtype=np.float32)
        t[b + "attn_k.bias"] = np.zeros(kv, dtype=np.float32)
        t[b + "attn_v.bias"] = np.zeros(kv, dtype=np.float32)
        t[b + "attn_output.weight"] = mat(HIDDEN, HIDDEN)
        t[b + "ffn_norm.weight"] = ones(HIDDEN)
        t[b + "ffn_gate.weight"] = mat(FFN, HIDDEN)
        t[b + "ffn_up.weight"] = mat(FFN, HIDDEN)
        t[b + "ffn_down.weight"] = mat(HIDDEN, FFN)
    return t


def write_gguf(path: Path, tok, template: str, tensors: dict, seed: int) -> None:
    import gguf

    tokens, types, merges = vocab_for_gguf(tok)
    w = gguf.GGUFWriter(str(path), arch="qwen2")
    w.add_name(f"rollstream-tiny-seed{seed}")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tok.token_to_id(IM_END))
    w.add_eot_token_id(tok.token_to_id(IM_END))
    w.add_pad_token_id(tok.token_to_id(ENDOFTEXT))
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def generate(out: Path, seed: int = 0, vocab_size: int = VOCAB) -> dict:
    """Write every file into `out` and return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(seed, vocab_size)
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    write_hf(tok, out, CHATML)
    write_hf(tok, out / "thinking", THINKING)
    write_hf(tok, out / "tools", TOOLS)
    (out / "chatml.jinja").write_text(CHATML)
    (out / "thinking.jinja").write_text(THINKING)
    (out / "tools.jinja").write_text(TOOLS)
    tensors = weights(seed, n_vocab)
    write_gguf(out / "tiny.gguf", tok, CHATML, tensors, seed)
    write_gguf(out / "tiny-thinking.gguf", tok, THINKING, tensors, seed)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest = {
        "seed": seed,
        "architecture": "qwen2",
        "layers": LAYERS, "hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "ffn": FFN,
        "context_length": CONTEXT,
        "vocab_size": n_vocab,
        "special_tokens": {t: tok.token_to_id(t) for t in SPECIAL + THINK},
        "eos_token_id": tok.token_to_id(IM_END),
        "sha256": {
            str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory (created)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=VOCAB)
    args = parser.parse_args(argv)
    if args.vocab_size < 300:
        parser.error("--vocab-size must be at least 300 (256 bytes + special tokens)")
    try:
        import gguf  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as exc:
        print(f"tiny_model: {exc.name} is missing: pip install -e '.[tiny-model]'",
              file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"tiny_model: {args.out} exists and is not a directory", file=sys.stderr)
        return 2
    manifest = generate(args.out, args.seed, args.vocab_size)
    print(f"wrote {args.out}: vocab {manifest['vocab_size']}, "
          f"{LAYERS} layers x {HIDDEN} hidden, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
