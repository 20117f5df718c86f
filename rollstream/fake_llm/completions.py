"""The stand-in's `/v1/completions` with token-id prompts and `/tokenize`, as the flavors'
servers answer them (token-in/token-out clients, `producers.llm.tito`).

The ids are read with the tokenizer `--tokenizer` names (a Hugging Face `tokenizer.json`,
e.g. the one scripts/tiny_model.py writes: the producers' `policy.tokenizer`), else with the
stand-in's own hashed pieces (`player.encode`; ids it handed out through `/tokenize` or its
replies read back). The decoded prompt is split into ChatML messages and played as a chat
request is (`player.reply`); the reply is encoded with the same tokenizer and ends with
`<|im_end|>`. A prompt that renders a `python` tool as Qwen2.5/Qwen3 do (`<tools>` in the
system message, `<tool_response>` user turns: `player.rendered_tool_turns`) gets the scripted
Hermes tool calls a chat request with `tools` gets (`player.tool_reply`), as text. Faults are
the chat endpoint's only; pauses, weight loads and `hold` meet a
completion as they meet a chat request (a vLLM pause in abort or wait mode answers 503, a
keeping pause freezes it, a weight update or an abort ends it early).

An aborted completion answers `finish_reason: "abort"` with the tokens sampled so far (half
of its reply here), their logprobs and version, as both servers' released code does:
- vLLM 0.33: `/pause?mode=abort` finishes every request `FINISHED_ABORTED`
  (`v1/engine/core.py:2208-2212`) and sends an output with no new token (:2246-2278); the
  output processor makes the final output of a non-streamed request from all its tokens so
  far (`v1/engine/output_processor.py:488-489`, `token_ids = self.detokenizer.
  output_token_ids`, with the logprobs and `weight_versions` spans, :517-529), and the
  completion answers them (`entrypoints/openai/completion/serving.py:587-636`; only
  finish_reason "error" raises, `generate/base/serving.py:200-207`).
- SGLang 0.5.23: an abort (`/pause_generation` abort mode, `update_weights_from_disk` with
  `abort_all_requests`: `tokenizer_manager.py:2267-2280, 2299-2300`) sets `to_finish =
  FINISH_ABORT()` on each running request (`managers/scheduler.py:5797-5812`, "will still run
  one decode forward pass"); with no status code it is not an error
  (`tokenizer_manager.py:1899-1907`) and the answer carries `output_ids` and the text so far
  with finish_reason "abort" (`serving_completions.py:609-625`).
A request whose prompt is an aborted one's prompt + the ids it answered is that reply's
continuation: the stand-in answers the rest of the reply it had cut (a model asked to go on
from its own partial output), from the weights in force now; `stats["tokens_resumed"]` counts
the cut tokens a continuation carried on (of `stats["tokens_cut"]`).

Shapes, from the released code:
- vLLM 0.33 (`entrypoints/openai/completion/protocol.py`): `prompt` ids or text (:53);
  choices with `text`, the legacy `logprobs` (`text_offset`, `token_logprobs`, `tokens`,
  `top_logprobs`, :668-672), `token_ids` and `prompt_token_ids` with `return_token_ids`
  (:688-690), `weight_versions` with `return_weight_versions` (:182, :702);
  `/tokenize` takes `prompt` (or `messages`) and answers `count`, `max_model_len`, `tokens`,
  `token_strs` (`serve/tokenize/protocol.py:23,182-186`).
- SGLang 0.5.23 (`srt/entrypoints/openai/protocol.py`): the same legacy logprobs (:150-154),
  `token_ids` and `prompt_token_ids` only when asked (:513-525); `/tokenize` and
  `/v1/tokenize` answer `tokens`, `count`, `max_model_len` (:1796-1801).
- llama-server (llama.cpp in llama-cpp-python 0.3.36, `tools/server/`): a prompt of ids
  (`server-common.cpp:1015`); `/v1/completions` gives the answer's ids only in
  `logprobs.content[j].id` (`server-task.cpp:374-400`), no `token_ids`; its own
  `/completion` gives them in `tokens` with `return_tokens` (`server-task.cpp:340-365`);
  `/tokenize` takes `content` and answers `tokens` (`server-context.cpp:5065-5072`).
- llama-cpp-python 0.3.36 (`server/types.py:111`: `prompt` a string or strings) and
  transformers serve 5.24 (`cli/serving/completion.py:89-91`: "prompt must be a string.")
  refuse a prompt of ids.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from rollstream.fake_llm.flavors import Refusal
from rollstream.fake_llm.player import (
    SPECIAL_IDS,
    encode,
    offers_python,
    pieces,
    rendered_tool_turns,
    reply,
    token_id,
    tool_reply,
)
from rollstream.fake_llm.responses import json_response, unauthorized

if TYPE_CHECKING:
    from aiohttp import web

FakeLLMServer = Any  # rollstream.fake_llm.app's (not imported: app imports this module)

_MESSAGE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\n?|$)", re.DOTALL)
NO_ID_PROMPTS = {"llama-cpp-python": 422, "strict": 400}  # flavor -> status of the refusal
UNFINISHED_KEPT = 4096  # aborted replies whose rest the stand-in keeps for a continuation


class Vocabulary:
    """Encode and decode with a `tokenizer.json`, else with the stand-in's hashed pieces."""

    def __init__(self, path: str = ""):
        self.tokenizer: Any = None
        self.pieces: dict[int, str] = {v: k for k, v in SPECIAL_IDS.items()}
        if path:
            from tokenizers import Tokenizer
            self.tokenizer = Tokenizer.from_file(path)
            self.eos = self.tokenizer.token_to_id("<|im_end|>")
        else:
            self.eos = SPECIAL_IDS["<|im_end|>"]

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        for piece in pieces(text):
            self.pieces.setdefault(token_id(piece), piece)
        return encode(text)

    def spell(self, text: str) -> list[int]:
        """The text one character per token: decodes to the same text, other ids than
        `encode` gives (a tokenization a model may sample; `--spell-replies`)."""
        return [i for char in text for i in self.encode(char)]

    def decode(self, ids: list[int], special: bool = True) -> str:
        if self.tokenizer is not None:
            return str(self.tokenizer.decode(ids, skip_special_tokens=not special))
        return "".join(self.pieces.get(i, "") for i in ids
                       if special or i not in SPECIAL_IDS.values())

    def piece(self, token: int) -> str:
        return self.decode([token])


def messages_of(text: str) -> list[dict[str, str]]:
    """The ChatML messages of a rendered prompt (the generation prompt's empty one dropped)."""
    return [{"role": role, "content": content} for role, content in _MESSAGE.findall(text)
            if content or role != "assistant"]


def add_routes(app: web.Application, server: FakeLLMServer) -> None:
    vocabulary = Vocabulary(getattr(server.options, "tokenizer", "") or "")

    async def complete(request: web.Request) -> web.Response:
        return await completions(server, vocabulary, request)

    async def tokenize(request: web.Request) -> web.Response:
        return await tokenize_endpoint(server, vocabulary, request)

    async def native(request: web.Request) -> web.Response:
        return await completions(server, vocabulary, request, native=True)

    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/tokenize", tokenize)
    if server.flavor.name == "llamacpp":
        app.router.add_post("/completion", native)
    if server.flavor.name.startswith("sglang"):
        app.router.add_post("/v1/tokenize", tokenize)


async def completions(server: FakeLLMServer, vocabulary: Vocabulary,
                      request: web.Request, native: bool = False) -> web.Response:
    if not server.authorized(request):
        return unauthorized()
    import orjson

    raw = await request.read()
    flavor = server.flavor
    try:
        body = orjson.loads(raw)
        model, prompt = body.get("model"), body["prompt"]
    except (ValueError, KeyError, TypeError) as exc:
        return server.refused(Refusal(400, f"bad request: {exc}"))
    if isinstance(prompt, str):
        ids = vocabulary.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(i, int) and i >= 0 for i in prompt):
        if flavor.name in NO_ID_PROMPTS:
            return server.refused(Refusal(NO_ID_PROMPTS[flavor.name],
                                          "prompt must be a string."))
        ids = prompt
    else:
        return server.refused(Refusal(400, "prompt must be a string or a list of token ids"))
    if flavor.checks_model and model != server.served and model not in server.adapters:
        return server.refused(flavor.not_found(str(model)))
    server.stats["requests"] += 1
    server.stats["completions"] += 1
    server.stats["in_flight"] += 1
    try:
        return await _complete(server, vocabulary, body, raw, ids, model, native)
    finally:
        server.stats["in_flight"] -= 1


async def _complete(server: FakeLLMServer, vocabulary: Vocabulary, body: dict[str, Any],
                    raw: bytes, ids: list[int], model: Any, native: bool) -> web.Response:
    """A completion admitted: its reply, its latency and what ends it (see the module
    docstring)."""
    started = time.monotonic()
    flavor = server.flavor
    server.stats["native_completions" if native else "openai_completions"] += 1
    server.requests.append(body)
    limit = body.get("max_tokens")
    budget = flavor.fit(len(ids), limit if isinstance(limit, int) else None,
                        server.options.max_model_len)
    if isinstance(budget, Refusal):
        server.stats["context_overflow"] += 1
        return server.refused(budget)
    paused = await server.control.admit()  # a pause: 503 (vLLM abort, wait) or wait
    if paused is not None:
        return server.refused(paused)
    if not server.control.generating():
        if server.options.during_load == "abort":  # as the chat endpoint: aborted at once
            server.stats["aborted"] += 1
            server.answers.append({"seed": body.get("seed"), "model": model,
                                   "finish_reason": "abort", "tokens": 0,
                                   "weight_version": server.control.label, "ids": [],
                                   "elapsed_s": time.monotonic() - started})
            return json_response(answer(server, vocabulary, body, ids, [], [], "abort"))
        await server.control.wait_generating()
    opts = server.options
    rng = random.Random(int.from_bytes(
        hashlib.blake2b(raw, digest_size=8, key=str(opts.seed).encode()).digest(), "little"))
    rest = server.unfinished.pop(tuple(ids), None)  # the continuation of an aborted reply
    if rest is not None:  # the aborted request's tokens are carried on by this one
        out, logprobs, kept = rest
        server.stats["tokens_resumed"] += kept
    else:
        tools, messages = rendered_tool_turns(messages_of(vocabulary.decode(ids)))
        text, good = reply(messages, float(body.get("temperature", 1.0) or 0.0), rng,
                           p_good=opts.p_good, malformed_share=opts.malformed_share,
                           think_words=opts.think_words)
        if offers_python(tools):  # tools rendered into the prompt: scripted Hermes calls
            text = tool_reply(messages, rng, malformed_share=opts.malformed_share) or text
        spelled = opts.spell_replies
        out = [*(vocabulary.spell(text) if spelled else vocabulary.encode(text)),
               vocabulary.eos]
        low, high = (-0.4, -0.01) if good else (-3.0, -0.3)
        logprobs = [round(rng.uniform(low, high), 4) for _ in out]
    finish = "stop"
    if 0 < budget < len(out):
        out, logprobs, finish = out[:budget], logprobs[:budget], "length"
    delay = opts.latency_s * math.exp(opts.latency_sigma * rng.gauss(0, 1))
    first = server.control.label
    try:
        why = "done"
        if server._hold is not None and server._hold in raw:
            why = await _held(server)
        if why == "done":
            why = await server.wait(delay)
    except BaseException:  # closed by the client: half of it had been sampled
        server.stats["cancelled"] += 1
        server.stats["tokens_generated"] += len(out) // 2
        server.stats["tokens_cut"] += len(out) // 2
        raise
    if why != "done":  # aborted (a weight update, a pause, a stop): the tokens so far
        out, logprobs, finish = _aborted(server, ids, out, logprobs)
        spans = [(first, 0, len(out))]
    else:
        await server.control.frozen()  # paused in keep / in_place / retract: continued after
        last = server.control.label
        spans = [(first, 0, len(out))]
        if last != first:  # the weights changed while it was frozen: half by each
            half = len(out) // 2
            spans = [(first, 0, half), (last, half, len(out))]
        server.stats["completed"] += 1
        server.stats["tokens_generated"] += len(out)
    server.answers.append({"seed": body.get("seed"), "model": model, "finish_reason": finish,
                           "tokens": len(out), "weight_version": spans[-1][0],
                           "ids": list(out),  # what was sampled, for the tests
                           "elapsed_s": time.monotonic() - started})  # admitted to answered
    if native:
        return json_response(native_answer(vocabulary, body, ids, out, logprobs, finish))
    return json_response(answer(server, vocabulary, body, ids, out, logprobs, finish, spans))


async def _held(server: FakeLLMServer) -> str:
    """Wait while `hold` holds this request (see `FakeLLMServer.hold`)."""
    server.stats["held"] += 1
    try:
        return str(await server.wait(None, held=True))
    finally:
        server.stats["held"] -= 1


def _aborted(server: FakeLLMServer, prompt: list[int], out: list[int],
             logprobs: list[float]) -> tuple[list[int], list[float], str]:
    """An aborted completion's answer: the first half of its reply, sampled before the abort
    (see the module docstring); the rest is kept as the continuation of prompt + that half.
    A flavor whose server does not answer `abort` (llama.cpp) keeps nothing."""
    server.stats["aborted"] += 1
    kept = len(out) // 2 if server.flavor.abort_finish else 0
    server.stats["tokens_generated"] += kept
    server.stats["tokens_cut"] += kept  # of requests that did not finish
    if kept and kept < len(out):
        if len(server.unfinished) >= UNFINISHED_KEPT:
            server.unfinished.pop(next(iter(server.unfinished)))
        server.unfinished[tuple(prompt + out[:kept])] = (out[kept:], logprobs[kept:], kept)
    return out[:kept], logprobs[:kept], "abort"


def native_answer(vocabulary: Vocabulary, body: dict[str, Any], prompt: list[int],
                  out: list[int], logprobs: list[float], finish: str) -> dict[str, Any]:
    """llama-server's own `/completion` answer (`server-task.cpp:340-365`): `tokens` only
    with `return_tokens`; the end-of-turn token is among the tokens and the logprob entries
    (`server-context.cpp:1820,1856`: every sampled token is added) but not in the text."""
    kept = out[:-1] if out and out[-1] == vocabulary.eos and finish == "stop" else out
    answer: dict[str, Any] = {
        "index": 0, "content": vocabulary.decode(kept, special=False),
        "tokens": out if body.get("return_tokens") else [], "id_slot": 0, "stop": True,
        "model": body.get("model"), "tokens_predicted": len(out),
        "tokens_evaluated": len(prompt), "truncated": False,
        "stop_type": {"stop": "eos", "length": "limit"}.get(finish, "none"),
        "stopping_word": "", "tokens_cached": len(prompt) + len(out) - 1}
    if body.get("logprobs") or body.get("n_probs"):
        answer["completion_probabilities"] = [_entry(vocabulary, i, lp)
                                              for i, lp in zip(out, logprobs, strict=True)]
    return answer


def answer(server: FakeLLMServer, vocabulary: Vocabulary, body: dict[str, Any],
           prompt: list[int], out: list[int], logprobs: list[float],
           finish: str, spans: list[tuple[str, int, int]] | None = None) -> dict[str, Any]:
    """The flavor's completion answer (see the module docstring); `spans`: the weight
    versions of the tokens (default: all the version in force now)."""
    flavor = server.flavor.name
    spans = spans or [(server.control.label, 0, len(out))]
    versions = [{"version": label, "start": start, "end": end} for label, start, end in spans]
    text = vocabulary.decode(out, special=False)
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out),
             "total_tokens": len(prompt) + len(out)}
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": body.get("model")}
    if flavor == "llamacpp":  # ids only in the logprob entries
        entries = None
        if body.get("logprobs"):
            entries = {"content": [_entry(vocabulary, i, lp) for i, lp in
                                   zip(out, logprobs, strict=True)]}
        choice: dict[str, Any] = {"text": text, "index": 0, "logprobs": entries,
                                  "finish_reason": finish}
        return {"choices": [choice], **head, "usage": usage}
    asked_ids = bool(body.get("return_token_ids")) and server.options.token_ids
    legacy = None
    if body.get("logprobs") is not None:
        tokens = [vocabulary.piece(i) for i in out]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        legacy = {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens,
                  "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)]}
    choice = {"index": 0, "text": text, "logprobs": legacy, "finish_reason": finish}
    if flavor.startswith("sglang"):
        choice["matched_stop"] = vocabulary.eos if finish == "stop" else None
        if asked_ids:
            choice["token_ids"], choice["prompt_token_ids"] = out, prompt
        metadata: dict[str, Any] = {"weight_version": spans[-1][0]}
        if len(spans) > 1:  # weight_versions.py:113-117: the spans when the meta has them
            metadata["weight_versions"] = versions
        return {**head, "choices": [choice], "usage": usage, "metadata": metadata}
    choice.update({"stop_reason": None, "token_ids": out if asked_ids else None,
                   "prompt_logprobs": None,
                   "prompt_token_ids": prompt if asked_ids else None})
    if flavor == "vllm":  # 0.33: `weight_versions` when asked (protocol.py:182, :702)
        choice["weight_versions"] = versions if body.get("return_weight_versions") else None
    return {**head, "choices": [choice], "usage": usage}


def _entry(vocabulary: Vocabulary, token: int, logprob: float) -> dict[str, Any]:
    piece = vocabulary.piece(token)
    item = {"id": token, "token": piece, "bytes": list(piece.encode()), "logprob": logprob}
    return {**item, "top_logprobs": [item]}


async def tokenize_endpoint(server: FakeLLMServer, vocabulary: Vocabulary,
                            request: web.Request) -> web.Response:
    """`/tokenize` as the flavor's server answers it (see the module docstring)."""
    if not server.authorized(request):
        return unauthorized()
    import orjson

    try:
        body = orjson.loads(await request.read())
        if server.flavor.name == "llamacpp":
            return json_response({"tokens": vocabulary.encode(str(body["content"]))})
        text = body.get("prompt")
        if text is None and isinstance(body.get("messages"), list):
            text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                           for m in body["messages"])
            if body.get("add_generation_prompt", True):
                text += "<|im_start|>assistant\n"
        if not isinstance(text, str):
            raise KeyError("prompt")
    except (ValueError, KeyError, TypeError) as exc:
        return server.refused(Refusal(400, f"bad request: {exc}"))
    tokens = vocabulary.encode(text)
    out: dict[str, Any] = {"count": len(tokens), "max_model_len": server.options.max_model_len,
                           "tokens": tokens}
    if server.flavor.name.startswith("vllm"):
        out["token_strs"] = [vocabulary.piece(i) for i in tokens] if body.get(
            "return_token_strs") else None
    return json_response(out)
