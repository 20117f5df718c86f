"""Record real answers of llama.cpp's llama-server (and llama-cpp-python's server) to a few
requests, as JSON fixtures for the tests and the stand-in server's flavors.

    python scripts/capture_server_answers.py llamacpp [--binary PATH] [--out DIR]
    python scripts/capture_server_answers.py llama-cpp-python --python PY [--out DIR]

The model is the tiny one of scripts/tiny_model.py (seed 0), generated into a temporary
directory. Each fixture file holds the server command (paths shortened to their names), the
request and the answer (status and JSON body). Sampling is greedy (temperature 0) or seeded,
so a rerun with the same server and model gives the same tokens; `created`, `id` and timings
vary. `--only NAME` records one fixture.

For llama-cpp-python, PY is a Python that can import `llama_cpp.server` (its own dependencies
installed); with LLAMA_CPP_LIB_PATH set it loads the libllama built by
scripts/build_llama_server.sh instead of compiling its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import real_servers  # noqa: E402

MESSAGES = [
    {"role": "system", "content": "You are playing FrozenLake."},
    {"role": "user", "content": "Grid:\nP_\n_G\nAnswer with one action."},
]


def requests_for(tokens: list[int]) -> list[tuple[str, str, dict]]:
    """(fixture name, path, body) of every request recorded."""
    chat = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    return [
        ("models", "/v1/models", None),
        ("chat_plain", "/v1/chat/completions", chat),
        ("chat_return_token_ids", "/v1/chat/completions", {**chat, "return_token_ids": True}),
        ("chat_logprobs", "/v1/chat/completions", {**chat, "logprobs": True}),
        ("chat_logprobs_top2", "/v1/chat/completions",
         {**chat, "logprobs": True, "top_logprobs": 2}),
        ("chat_logprobs_top0", "/v1/chat/completions",
         {**chat, "logprobs": True, "top_logprobs": 0}),
        ("chat_top_logprobs_only", "/v1/chat/completions", {**chat, "top_logprobs": 2}),
        ("completion_token_ids", "/v1/completions",
         {"model": "tiny", "prompt": tokens, "max_tokens": 8, "temperature": 0,
          "logprobs": 1}),
        ("tokenize", "/tokenize", {"content": "<|im_start|>user\nUp<|im_end|>\n",
                                   "add_special": False, "with_pieces": False}),
        ("chat_context_overflow", "/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "Up Down Left Right " * 200}]}),
        ("chat_fills_context", "/v1/chat/completions",
         {**chat, "max_tokens": 1000}),
        # sampled (seeded): tokens of one character split across tokens share a logprob entry
        ("chat_merged_entries", "/v1/chat/completions",
         {**chat, "max_tokens": 32, "temperature": 1.0, "seed": 1, "logprobs": True,
          "top_logprobs": 1}),
    ]


def capture(base_url: str, argv: list[str], out: Path, tokens: list[int],
            only: list[str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shown = [Path(a).name if os.sep in a else a for a in argv]
    for name, path, body in requests_for(tokens):
        if only and name not in only:
            continue
        status, answer = real_servers.request(base_url, path, body,
                                              method="GET" if body is None else "POST")
        record = {"command": " ".join(shown), "request": {"path": path, "body": body},
                  "status": status, "response": answer}
        (out / f"{name}.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        print(f"{name}: {status}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", choices=["llamacpp", "llama-cpp-python"])
    parser.add_argument("--binary", type=Path, help="llama-server (default: the build cache)")
    parser.add_argument("--python", default=sys.executable,
                        help="a Python with llama_cpp.server importable (llama-cpp-python)")
    parser.add_argument("--n-ctx", type=int, default=256)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="record only this fixture (repeatable)")
    args = parser.parse_args(argv)
    out = args.out or ROOT / "tests/data/servers" / args.server.replace("-", "_")
    tiny = real_servers.load_tiny_model_script()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        tiny.generate(model_dir, seed=0)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokens = tok.encode("<|im_start|>user\nPush the box.<|im_end|>\n"
                            "<|im_start|>assistant\n").ids
        port = real_servers.free_port()
        base_url = f"http://127.0.0.1:{port}"
        if args.server == "llamacpp":
            binary = args.binary or (real_servers.default_cache()
                                     / real_servers.LLAMA_CPP_PYTHON_VERSION / "bin/llama-server")
            cmd = real_servers.llama_server_argv(binary, model_dir / "tiny.gguf", port,
                                                 n_ctx=args.n_ctx)
            health = "/health"
        else:
            cmd = [args.python, "-m", "llama_cpp.server", "--model", str(model_dir / "tiny.gguf"),
                   "--model_alias", "tiny", "--host", "127.0.0.1", "--port", str(port),
                   "--n_ctx", str(args.n_ctx), "--n_threads", "1"]
            health = "/v1/models"
        with real_servers.running(cmd, base_url, Path(tmp) / "server.log", health=health):
            capture(base_url, cmd, out, tokens, args.only)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
