"""Token-in/token-out turns (`policy.tokenizer`): the producer applies the model's chat
template itself (`producers.llm.template`), sends the prompt as token ids to the completions
endpoint, and keeps the ids the model sampled, so a trajectory is exactly what was sampled
whatever the template does to earlier turns.

- **First turn** (or a fresh prompt: a step manager's new message list each turn): the
  messages rendered with the generation prompt, encoded.
- **Ids as arrays**: a conversation's ids are int32 numpy arrays from its first prompt on:
  a next prompt is one concatenation, the request's JSON writes the array (orjson's numpy
  option), and the turn records the array that was sent; with lists, every turn copied the
  whole prompt twice and turned it into an array element by element.
- **Next turn of a conversation** (the same message list, the previous reply appended and
  new messages after it): the previous turn's prompt ids + its sampled ids + the template's
  close of an assistant message (`<|im_end|>\\n`; the part the sampled ids already end with,
  the end-of-turn token, is not added twice) + the template's tokens for the new messages
  and the generation prompt (`ChatTemplate.suffix_ids`). Never re-rendered: a Qwen3-style
  template, which drops the thinking of earlier assistant turns, would rewrite the prefix;
  here each turn's prompt starts with the previous prompt and sampled ids exactly, thinking
  kept as sampled.
- **Tool rounds** (a tag with tools, `producers.tools.loop`): the first prompt renders the
  tools in (`tools=`, as a chat request's `tools`), each reply's calls are read from its text
  by the tag's text parser, and the results follow it as `tool` messages: the next round's
  prompt is this round's prompt + its sampled ids + the close + `suffix_ids(tool messages)`,
  as for any next turn. Each round is recorded with its own prompt ids on the step
  (`model_calls`), so every sampled id is trainable and the tool results are not.
- **The request**: `/v1/completions` with `prompt` a list of ids (vLLM 0.33
  `entrypoints/openai/completion/protocol.py:53`, SGLang 0.5.23
  `srt/entrypoints/openai/protocol.py:372`, llama-server's OpenAI-compatible completions,
  `tools/server/server-common.cpp`, tokenized prompts; docs/llm-servers.md has the table),
  `logprobs: 1` (the completions API's count of top logprobs: the sampled token's logprob
  comes with it) and `return_token_ids`.
- **The echo**: vLLM and SGLang send the prompt's ids back with `return_token_ids`
  (`prompt_token_ids`); the producer sent them and keeps what it sent, so the echo is cut
  from the answer's bytes before they are parsed (`without_prompt_echo`): the stand-in's
  answer to a 900-token prompt decoded in 28.6 us with its echo, 8.3 us without (a one-off
  timeit, docs/decisions/performance.md).
- **The reply**: response ids from the server where it gives them (vLLM's and SGLang's
  `choices[0].token_ids` with `return_token_ids`, completion/protocol.py:688 and
  protocol.py:513; llama-server's `tokens`: a llama-server gets token-id prompts at its own
  `/completion` with `return_tokens`, `llama_native`), else the reply text encoded with the
  tokenizer; the step's `response_ids_source` says which (`server`, `tokenizer`).
  Logprobs from the legacy `logprobs.token_logprobs` (vLLM, SGLang) or
  `logprobs.content[j].logprob` (llama-server), when there is one per token (llama-server
  merges the entries of a character split across tokens: such a turn has exact ids and no
  logprobs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from producers.llm.chat import merged_entries
from producers.llm.replies import weight_labels
from producers.llm.template import ChatTemplate
from producers.policies.protocol import Turn

TITO_KEY = "tito"  # the scratch entry holding the conversation's ids
Ids = np.ndarray  # token ids: int32, one dimension


@dataclass
class Conversation:
    """The ids of a conversation so far: its last prompt and what was sampled after it."""

    messages: list[dict[str, Any]]  # the message list these ids render (the same object)
    covered: int  # how many of its messages the ids hold (through the last reply)
    prompt: Ids
    sampled: Ids


def prompt_ids(template: ChatTemplate, scratch: dict[str, Any],
               messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None = None) -> Ids:
    """This turn's prompt ids (see the module docstring); a first prompt renders `tools` (a
    tag's function schemas) as the template writes them; a next one extends the ids, the
    `tool` messages after a reply included (`suffix_ids`)."""
    state: Conversation | None = scratch.get(TITO_KEY)
    if (state is not None and state.messages is messages and len(messages) > state.covered
            and messages[state.covered - 1].get("role") == "assistant"):
        return extend(template, state.prompt, state.sampled, messages[state.covered:])
    return as_ids(template.prompt_ids(messages, tools))


def extend(template: ChatTemplate, prompt: Ids, sampled: Ids,
           new_messages: list[dict[str, Any]]) -> Ids:
    """prompt + sampled + the template's close of the reply (less what the sampled ids
    already end with) + the new messages' tokens and the generation prompt."""
    close = template.close_ids
    tail = sampled[len(sampled) - len(close):].tolist()  # its last len(close) ids at most
    overlap = 0
    for k in range(len(tail), 0, -1):
        if tail[-k:] == close[:k]:
            overlap = k
            break
    return np.concatenate((prompt, sampled, as_ids(close[overlap:]),
                           as_ids(template.suffix_ids(new_messages))))


def as_ids(ids: Any) -> Ids:
    """Token ids as an int32 array (such an array as it is, not copied)."""
    return np.asarray(ids, dtype=np.int32)


def remember(scratch: dict[str, Any], messages: list[dict[str, Any]],
             prompt: Ids | list[int], sampled: Ids | list[int]) -> None:
    """After the reply was appended to `messages`: the ids the next turn extends."""
    scratch[TITO_KEY] = Conversation(messages, len(messages), as_ids(prompt), as_ids(sampled))


def for_rounds(scratch: dict[str, Any]) -> dict[str, Any]:
    """The scratch a turn's tool rounds extend (`prompt_ids`, `remember`): the episode's
    conversation ids, apart from the episode's scratch, so a turn cut short between rounds
    leaves the episode's as they were (its final reply is remembered there)."""
    return {TITO_KEY: scratch[TITO_KEY]} if TITO_KEY in scratch else {}


def request_body(model: str, prompt: Ids | list[int], *, sampling: dict[str, Any], seed: int,
                 extra_body: dict[str, Any]) -> dict[str, Any]:
    """A completion request with a token-id prompt, asking for logprobs and ids."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, **sampling, "seed": seed,
                            "logprobs": 1, "return_token_ids": True}
    if extra_body:
        body.update(extra_body)
    return body


_ECHO = b'"prompt_token_ids":'
_SPACE = (b" ", b"\n", b"\t", b"\r")  # JSON's whitespace


def without_prompt_echo(raw: bytes) -> bytes:
    """A completion's JSON with every `"prompt_token_ids":[...]` member made
    `"prompt_token_ids":null` (see the module docstring). Exact on any JSON: a key's opening
    quote follows `{` or `,` (whitespace aside), and inside a string every quote follows a
    backslash, so text that spells the key is never taken for it; a list of ids holds no `]`.
    Anything else (a `null`, an unclosed list) is left as it is, for the parser to judge."""
    at = raw.find(_ECHO)
    if at < 0:
        return raw
    parts: list[bytes] = []
    start = 0
    while at >= 0:
        value = at + len(_ECHO)
        while raw[value:value + 1] in _SPACE:
            value += 1
        before = at - 1
        while before >= 0 and raw[before:before + 1] in _SPACE:
            before -= 1
        if raw[value:value + 1] == b"[" and raw[before:before + 1] in (b"{", b","):
            end = raw.find(b"]", value)
            if end < 0:
                break
            parts += (raw[start:at + len(_ECHO)], b"null")
            start = value = end + 1
        at = raw.find(_ECHO, value)
    if not parts:
        return raw
    parts.append(raw[start:])
    return b"".join(parts)


def llama_native(body: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """A token-id request as llama-server's own `/completion` takes it: the same fields
    (`max_tokens` and `logprobs` are its aliases of `n_predict` and `n_probs`,
    `tools/server/server-schema.cpp:44-47,179-180`) and `return_tokens`, which gives the
    sampled ids in `tokens` (:34, `server-context.cpp:1820`), every one of them: its logprob
    entries merge the tokens of a character split across tokens, and its OpenAI
    `/v1/completions` gives ids only there (`server-task.cpp:374-400`)."""
    import orjson

    out = {**body, "return_tokens": True}
    return out, orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY)


def from_llama_native(data: dict[str, Any]) -> dict[str, Any]:
    """llama-server's `/completion` answer (`server-task.cpp:340-372`: `content`, `tokens`,
    `stop_type`, `tokens_evaluated`, `tokens_predicted`, `completion_probabilities`) in the
    shape of an OpenAI completion; an error answer as it is."""
    if "content" not in data or "tokens" not in data:
        return data
    probs = data.get("completion_probabilities")
    prompt, completion = data.get("tokens_evaluated"), data.get("tokens_predicted")
    choice = {"index": 0, "text": data["content"], "token_ids": data["tokens"],
              "finish_reason": "length" if data.get("stop_type") == "limit" else "stop",
              "logprobs": {"content": probs} if probs else None}
    usage = None
    if isinstance(prompt, int) and isinstance(completion, int):
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}
    return {"choices": [choice], "model": data.get("model"), "usage": usage,
            "object": "text_completion"}


def turn_from_completion(data: dict[str, Any], prompt: Ids | list[int],
                         template: ChatTemplate) -> Turn:
    """The first choice of a completion as a `Turn` whose prompt ids are `prompt` (what was
    sent) and whose response ids are the server's, else the tokenizer's (see the module
    docstring)."""
    choice = data["choices"][0]
    text = choice.get("text") or ""
    response_ids = choice.get("token_ids")
    if response_ids is None:
        response_ids = choice.get("response_token_ids")
    logprobs = choice.get("logprobs") or {}
    values: list[float] | None = logprobs.get("token_logprobs")
    content = logprobs.get("content")
    if content and merged_entries(data) is None:
        values = [item["logprob"] for item in content]
        if response_ids is None and "id" in content[0]:  # llama-server: ids only here
            response_ids = [item["id"] for item in content]
    source = "server"
    if response_ids is None:
        response_ids, source = template.encode(text), "tokenizer"
    if values is not None and (len(values) != len(response_ids) or None in values):
        values = None  # not one logprob per kept token: none rather than misaligned ones
    turn = Turn(
        text=text,
        prompt_ids=cast(Any, as_ids(prompt)),  # the array sent
        response_ids=cast(Any, np.asarray(response_ids, dtype=np.int32)),
        logprobs=cast(Any, None if values is None else np.asarray(values, dtype=np.float32)),
        finish_reason=choice.get("finish_reason"),
    )
    turn.extra["response_ids_source"] = source
    labels = weight_labels(data)
    if labels and all(label.isdigit() for label, _, _ in labels):
        turn.version, turn.version_source = min(int(label) for label, _, _ in labels), "server"
        if len({label for label, _, _ in labels}) > 1:
            turn.extra["version_spans"] = [[int(label), start, end]
                                           for label, start, end in labels]
    return turn


# -- resuming a turn the server aborted (`policy.partial_rollout.in_flight: resume`) -----------
@dataclass
class Resumed:
    """A turn the server aborted, resumed from the tokens its answers carried (vLLM 0.33 and
    SGLang 0.5.23 answer an aborted request with its tokens so far: fake_llm/completions.py
    cites where): each next request's prompt is the turn's prompt + every id sampled so far,
    its `max_tokens` less what was sampled; the finished turn is the pieces concatenated, ids,
    logprobs and per-token versions, each token once with the version that sampled it."""

    prompt: list[int]  # the turn's own prompt (what its first request sent)
    ids: list[int]  # sampled so far, by the aborted requests, in order
    logprobs: list[float] | None  # one per id; None once a piece came without them
    spans: list[list[int]]  # [version, start, end) over `ids`
    sources: set[str]  # how each piece's version is known (server, recorded, producer)
    aborts: int = 0  # how many answers were aborted
    text: str = ""  # the pieces' texts so far

    @classmethod
    def start(cls, prompt: Ids | list[int]) -> Resumed:
        return cls(as_ids(prompt).tolist(), [], [], [], set())

    def add(self, piece: Turn, version: int, source: str) -> None:
        """An aborted answer's piece (`turn_from_completion` of it); `version`/`source`: what
        sampled it when the answer's own labels say nothing (`piece.version` None)."""
        self.aborts += 1
        self._append(piece, version, source)

    def next_prompt(self) -> list[int]:
        """The next request's prompt: the turn's prompt and everything sampled so far."""
        return [*self.prompt, *self.ids]

    def left(self, max_tokens: int) -> int:
        """The next request's `max_tokens`: the turn's cap less what was sampled."""
        return max_tokens - len(self.ids)

    def finish(self, last: Turn, version: int, source: str) -> Turn:
        """The whole turn: the pieces so far and `last` (the answer that finished it), its
        prompt ids the turn's own, its text the whole (the pieces'
        texts joined), `extra["resumed"]` the number of aborted answers (`version`,
        `source`: as for `add`)."""
        self._append(last, version, source)
        turn = Turn(
            text=self.text,
            prompt_ids=cast(Any, np.asarray(self.prompt, dtype=np.int32)),
            response_ids=cast(Any, np.asarray(self.ids, dtype=np.int32)),
            logprobs=cast(Any, None if self.logprobs is None
                          else np.asarray(self.logprobs, dtype=np.float32)),
            finish_reason=last.finish_reason,
            latency_s=last.latency_s,  # (the policy gives `last` the pieces' sum)
            version=min((row[0] for row in self.spans), default=version),
            version_source="server" if self.sources == {"server"} else
            next(s for s in ("producer", "recorded", "server") if s in self.sources),
        )
        turn.extra.update(last.extra)
        turn.extra.pop("version_spans", None)
        if len({row[0] for row in self.spans}) > 1:
            turn.extra["version_spans"] = [list(row) for row in self.spans]
        turn.extra["resumed"] = self.aborts
        return turn

    def _append(self, piece: Turn, version: int, source: str) -> None:
        ids = [] if piece.response_ids is None else [int(i) for i in piece.response_ids]
        at = len(self.ids)
        rows = piece.extra.get("version_spans")
        if not rows:
            known = piece.version is not None
            rows = [[piece.version if known else version, 0, len(ids)]]
            source = (piece.version_source or "server") if known else source
        else:
            source = "server"
        for label, start, end in rows:
            if end > start:
                self._span(int(label), at + start, at + end)
        self.sources.add(source)
        if self.logprobs is not None and piece.logprobs is not None:
            self.logprobs.extend(float(v) for v in piece.logprobs)
        elif ids:
            self.logprobs = None  # a piece without them: none rather than misaligned ones
        self.ids.extend(ids)
        self.text += piece.text

    def _span(self, version: int, start: int, end: int) -> None:
        if self.spans and self.spans[-1][0] == version and self.spans[-1][2] == start:
            self.spans[-1][2] = end  # the same weights on: one span
        else:
            self.spans.append([version, start, end])
