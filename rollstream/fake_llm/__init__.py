"""A stand-in for OpenAI-compatible LLM servers, for tests, benchmarks and trying the
pipeline without a GPU: `rollstream fake-llm --flavor vllm --port 8000`, then `base_urls:
[http://127.0.0.1:8000/v1]`.

It answers `POST /v1/chat/completions` (non-streaming), `GET /v1/models` and `GET /health`
as one server's released code does (`--flavor`: vLLM 0.33 and 0.10.2, SGLang 0.5.23 and
0.4.10, llama.cpp's llama-server, llama-cpp-python's server, transformers serve as `strict`),
with that server's weight and pause endpoints, and plays a scripted model. The modules, by
what they do:

- `player`: the scripted model (tokenizer, chat template, a player of the grid games);
- `flavors`: each server's answers: ids, logprobs, versions, errors, context rules;
- `app`: `FakeLLMServer`, the HTTP server and the path of a chat request;
- `control`: weight loads, pauses and admin endpoints per flavor;
- `faults`: 500s, hangs, drops at a rate or on demand;
- `options`, `cli`: `FakeLLMOptions` and `rollstream fake-llm`.

Latency is lognormal (`latency_s * exp(latency_sigma * z)`). For tests, `hold(marker)` keeps
the requests whose body carries `marker` in flight until `release()`, `answers` lists what
each answer said (request seed, model, weight version, finish reason) and `GET /admin/stats`
counts requests in flight, completed, closed by the client, aborted and faulted.
"""

from rollstream.fake_llm.app import FakeLLMServer
from rollstream.fake_llm.cli import add_arguments, options_from_args, run
from rollstream.fake_llm.faults import FAULT_KINDS
from rollstream.fake_llm.flavors import FLAVORS
from rollstream.fake_llm.options import FakeLLMOptions
from rollstream.fake_llm.player import (
    SPECIAL_IDS,
    encode,
    good_move,
    pieces,
    read_board,
    render_prompt,
    token_id,
)

__all__ = ["FAULT_KINDS", "FLAVORS", "SPECIAL_IDS", "FakeLLMOptions", "FakeLLMServer",
           "add_arguments", "encode", "good_move", "options_from_args", "pieces", "read_board",
           "render_prompt", "run", "token_id"]
