"""How the stand-in server behaves: `FakeLLMOptions`, one field per `rollstream fake-llm`
option, and the help line of each."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FakeLLMOptions:
    """How the stand-in server behaves (all settable from the command line)."""

    flavor: str = "vllm"  # which server's answers and endpoints (rollstream.fake_llm.flavors)
    model: str = "fake-model"
    p_good: float = 0.8  # probability of a good move at temperature > 0
    malformed_share: float = 0.5  # of the other replies, the share with no answer tag
    think_words: int = 6  # words of "reasoning" in each reply
    latency_s: float = 0.0  # median latency per request
    latency_sigma: float = 0.0  # lognormal spread of the latency
    error_rate: float = 0.0  # share of requests answered 500
    hang_rate: float = 0.0  # share of requests never answered (until the client leaves)
    drop_rate: float = 0.0  # share of requests whose connection is closed unanswered
    seed: int = 0
    token_ids: bool = True  # honour return_token_ids (False: an older server)
    drop_thinking: bool = False  # the template drops earlier <think> blocks (Qwen3-like)
    api_key: str | None = field(default=None, repr=False)  # required bearer token
    weight_version: str = "default"  # SGLang's name before any update (not a number: a
    # client takes no version from it)
    model_path: str = "fake/weights-0"
    load_time_s: float = 0.0  # a weight update takes this long
    during_load: str = "wait"  # new requests while loading: "wait" or "abort"
    max_model_len: int = 32768  # context window (llama.cpp: n_ctx), kept as the flavor's
    # server keeps it: refused, or the turn cut to fit
    tokenizer: str = ""  # a tokenizer.json reading token-id prompts (fake_llm.completions)
    prefix_cache_tokens: int = 0  # prompt tokens its prefix cache holds (0: none)
    prefill_s_per_token: float = 0.0  # seconds per prompt token not found in that cache
    spell_replies: bool = False  # /v1/completions replies one character per token


OPTION_HELP = {  # `rollstream fake-llm --help`, one line per FakeLLMOptions field
    "flavor": "the server whose answers and endpoints it reproduces: vllm (0.33), vllm010, "
              "sglang (0.5.23), sglang04, llamacpp (llama-server), llama-cpp-python, strict "
              "(transformers serve)",
    "model": "the model name it serves (GET /v1/models; vLLM flavors answer 404 to another)",
    "p_good": "probability of a good move at temperature > 0 (at 0: always good)",
    "malformed_share": "share of the other replies with no <answer> tag",
    "think_words": "words of <think> reasoning in each reply",
    "latency_s": "median seconds per request",
    "latency_sigma": "lognormal spread of the latency (0: always latency_s)",
    "error_rate": "share of requests answered HTTP 500",
    "hang_rate": "share of requests never answered (until the client gives up)",
    "drop_rate": "share of requests whose connection is closed unanswered",
    "seed": "seed of the replies (with each request's own seed)",
    "token_ids": "honour return_token_ids (--no-token-ids: an older server)",
    "drop_thinking": "the chat template drops earlier <think> blocks (Qwen3-like)",
    "weight_version": "the weight_version it reports before any update (SGLang: 'default')",
    "model_path": "the weights it says it holds before any update",
    "load_time_s": "seconds a weight update takes",
    "during_load": "requests that come while weights load: wait or abort",
    "max_model_len": "context window (llama.cpp's n_ctx), kept as the flavor's server does",
    "tokenizer": "a tokenizer.json to read /v1/completions token-id prompts and write the "
                 "replies' ids with (default: the stand-in's own hashed pieces)",
    "prefix_cache_tokens": "prompt tokens its prefix cache (an LRU of 16-token blocks, as "
                           "vLLM's) holds; 0: no cache",
    "prefill_s_per_token": "seconds each prompt token not found in that cache adds",
    "spell_replies": "token-id completions sample their replies one character per token: "
                     "the same text, not the tokenizer's own ids (as a model may sample), so "
                     "a client that encodes the text again gets other ids",
}
