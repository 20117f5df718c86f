"""How the pool fits each request to its server, and what it learns from the answers: once per
server, and said once.

- **Shape.** The policy builds one request (`producers.llm.chat.request_body`: logprobs and
  token ids asked for); `shape` adds what this server needs (`top_logprobs: 1` for llama.cpp's
  servers, `return_weight_versions` for vLLM), drops what it refused, and names the model
  that holds the server's weights (a LoRA adapter).
- **Refused fields.** A 400 or 422 whose body names a field the policy added on its own
  (`return_token_ids`, `return_weight_versions`, `logprobs`, `top_logprobs`, `seed`) and says
  it is not accepted (transformers serve 5.24: 422 "Unexpected fields in the request:
  {'return_token_ids'}", `cli/serving/utils.py:1180-1190`; OpenAI's API: 400 "Unrecognized
  request argument supplied: ..."; pydantic's `extra="forbid"`: 422 "Extra inputs are not
  permitted") drops that field for that server, with one warning, and the request is sent
  again at once. Sampling fields (`top_k`, `top_p`, `temperature`, `extra_body`) are never
  dropped: sampling from another distribution than the config's would poison the logprobs.
- **What answers lack.** A server whose answers carry no token ids, or no logprobs, is
  named in one warning each (what trajectories will lack and why). A server that answers
  `logprobs: null` although asked is asked with `top_logprobs: 1` once more (llama-cpp-python
  needs a non-null one) before that warning. A vLLM that does not know
  `return_weight_versions` (0.10.2: no `weight_versions` key in its choices) is not asked
  again.
- **A turn cut to fit.** vLLM 0.33 shortens `max_tokens` to what the context holds
  (`serve/utils/api_utils.py:234-270`), llama-server stops at the end of the context, and
  llama-cpp-python shortens it too: the answer ends `finish_reason: "length"` with fewer
  tokens than asked, `prompt_tokens + completion_tokens` at the server's limit. That turn is
  the conversation outgrowing the window: `ContextFull`, as a refusal would be.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from schemas.errors import ContextFull

if TYPE_CHECKING:
    from producers.llm.servers import Server

logger = logging.getLogger(__name__)

# fields the policy adds on its own -> what a trajectory loses without them
DROPPABLE = {
    "return_token_ids": "token ids",
    "return_weight_versions": "per-token weight versions",
    "logprobs": "logprobs",
    "top_logprobs": "logprobs",
    "seed": "reproducible sampling (the request seed)",
}
# how servers say a field is not accepted
_REFUSED = ("unexpected", "unrecognized", "unknown", "not permitted", "extra input",
            "unsupported", "not supported", "not allowed")


def shape(server: Server, body: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The request `body` as `server` gets it (see the module docstring), and its JSON."""
    model, adds, dropped = server.model, server.adds, server.dropped
    if model is None and not adds and not dropped:
        return body, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    out = {key: value for key, value in body.items() if key not in dropped}
    if model is not None:
        out["model"] = model
    for key, value in adds.items():
        if key == "top_logprobs" and (not out.get("logprobs") or key in out or "prompt" in out):
            continue  # only with chat logprobs, and never over the policy's own choice
        out[key] = value
    return out, orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY)


def refused_fields(status: int, raw: bytes, sent: Iterable[str]) -> list[str]:
    """The fields of a request (among those the policy may drop) that a 400 or 422 says the
    server does not accept; [] when it says something else."""
    if status not in (400, 422):
        return []
    text = raw[:4096].decode(errors="replace")
    lowered = text.lower()
    if not any(word in lowered for word in _REFUSED):
        return []
    return [key for key in sent if key in DROPPABLE and re.search(rf"\b{key}\b", text)]


def drop(server: Server, fields: list[str], status: int, message: str) -> None:
    """Stop sending `fields` to `server`; one warning naming them and what is lost."""
    for key in fields:
        server.dropped.add(key)
        server.adds.pop(key, None)
    lost = sorted({DROPPABLE[key] for key in fields})
    logger.warning("model server %s (%s) refused %s (HTTP %d: %s); sending its requests "
                   "without %s from now on: trajectories from it carry no %s",
                   server.base_url, server.dialect.name, ", ".join(repr(k) for k in fields),
                   status, message, "it" if len(fields) == 1 else "them", " and no ".join(lost))


def learn(server: Server, sent: dict[str, Any], data: dict[str, Any]) -> None:
    """What a completed answer tells of its server (called while `server.learning`)."""
    choice = data["choices"][0]
    if choice.get("finish_reason") == "abort" or not ((choice.get("message") or {}).get(
            "content") or choice.get("text")):
        return  # an empty or aborted turn tells nothing
    if "return_weight_versions" in sent and "weight_versions" not in choice:
        server.adds.pop("return_weight_versions", None)  # vLLM 0.10.2: not a field it knows
        logger.debug("model server %s gives no weight_versions: not asked again",
                     server.base_url)
    content = (choice.get("logprobs") or {}).get("content")
    if content is None:  # a completion (token-in/token-out): the legacy logprobs
        content = (choice.get("logprobs") or {}).get("token_logprobs")
    if "ids" not in server.said and "return_token_ids" in sent:
        has_ids = (choice.get("token_ids") is not None
                   or choice.get("response_token_ids") is not None
                   or bool(content and isinstance(content[0], dict) and "id" in content[0]))
        if not has_ids:
            logger.warning("model server %s (%s) returns no token ids: its trajectories "
                           "carry the text%s but no ids (a trainer must tokenize them; vLLM "
                           ">= 0.10.2, SGLang >= 0.5 and llama-server give ids)",
                           server.base_url, server.dialect.name,
                           " and logprobs" if content else "")
        server.said.add("ids")
    if "logprobs" not in server.said and "logprobs" in sent:
        if content:
            server.said.add("logprobs")
        elif ("top_logprobs" not in sent and "top_logprobs" not in server.dropped
              and "prompt" not in sent):
            server.adds["top_logprobs"] = 1  # llama-cpp-python: none without it
            logger.debug("model server %s gave no logprobs: asking with top_logprobs 1",
                         server.base_url)
        else:
            logger.warning("model server %s (%s) returns no logprobs although asked: its "
                           "trajectories carry no behaviour logprobs", server.base_url,
                           server.dialect.name)
            server.said.add("logprobs")
    server.learning = not {"ids", "logprobs"} <= server.said and bool(
        {"return_token_ids", "logprobs"} - server.dropped)


def check_cut(server: Server, sent: dict[str, Any], data: dict[str, Any]) -> None:
    """`ContextFull` when the server cut the turn short to fit its context (see the module
    docstring)."""
    choice = data["choices"][0]
    if choice.get("finish_reason") != "length":
        return
    asked = sent.get("max_tokens") or sent.get("max_completion_tokens")
    usage = data.get("usage")
    if not isinstance(asked, int) or not isinstance(usage, dict):
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int) or completion >= asked:
        return
    limit = server.context_len
    if limit is not None and prompt + completion < limit:
        return  # stopped short for another reason (a server-side cap)
    at = f"its limit of {limit}" if limit is not None else "the end of its context"
    raise ContextFull(f"model server {server.base_url} ({server.dialect.name}) cut the turn "
                      f"to fit its context window: {prompt} prompt + {completion} generated "
                      f"tokens reach {at} ({asked} asked); the conversation outgrew "
                      f"{server.dialect.context_setting}")
