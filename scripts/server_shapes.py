"""Read what inference servers answer from their released packages: the fields of their
response classes and the wording of their context-length errors, written to
tests/data/servers/shapes.json. The stand-in's flavors (rollstream/fake_llm/flavors.py) are
checked against that file (tests/test_server_flavors.py), so a flavor that answers a field
the server does not have, or words an error as it does not, goes red.

    python scripts/server_shapes.py --packages DIR [--out tests/data/servers/shapes.json]

DIR holds the packages unpacked, one folder per release (their Python files are enough):

    DIR/vllm-0.33.0/vllm/...          pip download --no-deps vllm==0.33.0, unzip
    DIR/vllm-0.10.2/vllm/...
    DIR/sglang-0.5.23/sglang/...      pip download --no-deps sglang==0.5.23, unzip
    DIR/sglang-0.4.10/sglang/...
    DIR/transformers-5.24.0/transformers/...
    DIR/llama-cpp-python/llama_cpp_python-0.3.36/llama_cpp/...   (the sdist, untarred)
    DIR/openai-3.57.0/openai/...      the request fields `transformers serve` accepts

Only `ast` reads them: no server code is imported or copied; the output holds names, line
numbers and message templates (`{}` where the server puts a value).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests/data/servers/shapes.json"

# release -> (package folder, {name: (file, class)}, {name: (file, words in the message)})
VLLM_033_CHAT = "vllm/entrypoints/openai/chat_completion/protocol.py"
VLLM_033_ENGINE = "vllm/entrypoints/serve/engine/protocol.py"
VLLM_010 = "vllm/entrypoints/openai/protocol.py"
SGLANG = "sglang/srt/entrypoints/openai/protocol.py"
RELEASES: dict[str, tuple[str, dict[str, tuple[str, str]], dict[str, tuple[str, str]]]] = {
    "vllm-0.33.0": ("vllm-0.33.0", {
        "response": (VLLM_033_CHAT, "ChatCompletionResponse"),
        "choice": (VLLM_033_CHAT, "ChatCompletionResponseChoice"),
        "message": (VLLM_033_CHAT, "ChatMessage"),
        "logprob": (VLLM_033_CHAT, "ChatCompletionLogProb"),
        "logprob_content": (VLLM_033_CHAT, "ChatCompletionLogProbsContent"),
        "usage": (VLLM_033_ENGINE, "UsageInfo"),
        "model_card": (VLLM_033_ENGINE, "ModelCard"),
        "error": (VLLM_033_ENGINE, "ErrorInfo"),
        "weight_version_span": ("vllm/outputs.py", "WeightVersionSpan"),
    }, {
        "prompt_too_long": ("vllm/renderers/params.py", "even without any output tokens"),
        "max_tokens_over_limit": ("vllm/renderers/params.py", "request fewer output tokens"),
        "max_tokens_zero": ("vllm/sampling_params.py", "max_tokens must be at least 1"),
        "paused": ("vllm/v1/engine/core.py", "Generation is paused"),
    }),
    "vllm-0.10.2": ("vllm-0.10.2", {
        "response": (VLLM_010, "ChatCompletionResponse"),
        "choice": (VLLM_010, "ChatCompletionResponseChoice"),
        "message": (VLLM_010, "ChatMessage"),
        "logprob": (VLLM_010, "ChatCompletionLogProb"),
        "logprob_content": (VLLM_010, "ChatCompletionLogProbsContent"),
        "usage": (VLLM_010, "UsageInfo"),
        "model_card": (VLLM_010, "ModelCard"),
        "error": (VLLM_010, "ErrorInfo"),
    }, {
        "prompt_too_long": ("vllm/entrypoints/openai/serving_engine.py",
                            "reduce the length of the input messages"),
        "max_tokens_too_large": ("vllm/entrypoints/openai/serving_engine.py",
                                 "is too large"),
    }),
    "sglang-0.5.23": ("sglang-0.5.23", {
        "response": (SGLANG, "ChatCompletionResponse"),
        "choice": (SGLANG, "ChatCompletionResponseChoice"),
        "message": (SGLANG, "ChatMessage"),
        "logprob": (SGLANG, "TopLogprob"),
        "logprob_content": (SGLANG, "ChatCompletionTokenLogprob"),
        "usage": (SGLANG, "UsageInfo"),
        "model_card": (SGLANG, "ModelCard"),
        "error": (SGLANG, "ErrorResponse"),
    }, {
        "prompt_too_long": ("sglang/srt/managers/tokenizer_manager.py",
                            "is longer than the model's context length ({} tokens).|"),
        "total_too_long": ("sglang/srt/managers/tokenizer_manager.py",
                           "Requested token count exceeds"),
        "input_over_allowed": ("sglang/srt/managers/utils.py", "exceeds the maximum allowed"),
    }),
    "sglang-0.4.10": ("sglang-0.4.10", {
        "response": (SGLANG, "ChatCompletionResponse"),
        "choice": (SGLANG, "ChatCompletionResponseChoice"),
        "message": (SGLANG, "ChatMessage"),
        "logprob": (SGLANG, "TopLogprob"),
        "logprob_content": (SGLANG, "ChatCompletionTokenLogprob"),
        "usage": (SGLANG, "UsageInfo"),
        "model_card": (SGLANG, "ModelCard"),
        "error": (SGLANG, "ErrorResponse"),
    }, {
        "prompt_too_long": ("sglang/srt/managers/tokenizer_manager.py",
                            "is longer than the model's context length ({} tokens)."),
        "total_too_long": ("sglang/srt/managers/tokenizer_manager.py",
                           "Requested token count exceeds"),
        "input_over_allowed": ("sglang/srt/managers/utils.py", "exceeds the maximum allowed"),
    }),
    "transformers-5.24.0": ("transformers-5.24.0", {}, {
        "unexpected_fields": ("transformers/cli/serving/utils.py", "Unexpected fields"),
    }),
    "llama-cpp-python-0.3.36": ("llama-cpp-python/llama_cpp_python-0.3.36", {
        "error": ("llama_cpp/server/errors.py", "ErrorResponse"),
    }, {
        "prompt_too_long": ("llama_cpp/server/errors.py", "However, you requested"),
    }),
    "openai-3.57.0": ("openai-3.57.0", {
        "chat_request": ("openai/types/chat/completion_create_params.py",
                         "CompletionCreateParamsBase"),
    }, {}),
}


def class_fields(tree: ast.Module, name: str) -> tuple[int, list[str]]:
    """(line, field names) of a class: its annotated names, after those of its bases that
    are defined in the same file (pydantic's and dataclasses' order); ClassVars left out."""
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    node = classes[name]
    out: list[str] = []
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            out += class_fields(tree, base.id)[1]
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if "ClassVar" in ast.unparse(stmt.annotation):
                continue
            if stmt.target.id not in out:
                out.append(stmt.target.id)
    return node.lineno, out


def template(node: ast.expr) -> str | None:
    """A string expression with `{}` where a value goes (f-strings, implicit and `+`
    concatenation, `.format` placeholders kept as they are); None when it is not one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left), template(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def message(tree: ast.Module, words: str) -> tuple[int, str]:
    """(line, template) of the largest string expression holding `words` (ending with them
    when `words` ends with `|`: a warning may say the same and go on)."""
    found: list[tuple[int, int, str]] = []
    at_end = words.endswith("|")
    words = words.rstrip("|")
    for node in ast.walk(tree):
        if isinstance(node, ast.expr):
            text = template(node)
            if text is not None and (text.endswith(words) if at_end else words in text):
                found.append((len(text), node.lineno, text))
    if not found:
        raise LookupError(f"no string holding {words!r}")
    _, line, text = max(found)
    return line, text


def read_release(root: Path, classes: dict[str, tuple[str, str]],
                 messages: dict[str, tuple[str, str]]) -> dict[str, Any]:
    trees: dict[str, ast.Module] = {}

    def tree(path: str) -> ast.Module:
        if path not in trees:
            trees[path] = ast.parse((root / path).read_text(encoding="utf-8"))
        return trees[path]

    out: dict[str, Any] = {"classes": {}, "messages": {}}
    for key, (path, name) in classes.items():
        line, names = class_fields(tree(path), name)
        out["classes"][key] = {"at": f"{path}:{line}", "class": name, "fields": names}
    for key, (path, words) in messages.items():
        line, text = message(tree(path), words)
        out["messages"][key] = {"at": f"{path}:{line}", "template": text}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", type=Path, required=True,
                        help="folder of unpacked releases (see the module docstring)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    shapes: dict[str, Any] = {}
    for release, (folder, classes, messages) in RELEASES.items():
        root = args.packages / folder
        if not root.is_dir():
            print(f"server_shapes: {root} is missing (see --help)", file=sys.stderr)
            return 2
        shapes[release] = read_release(root, classes, messages)
    args.out.write_text(json.dumps(shapes, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} ({len(shapes)} releases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
