"""Policy configs: which policy the producers run, one model per `type`.

`policy:` in a config is one of these, chosen by its `type` (default `random`):
- `random`: uniform actions, seeded per episode and member, with an optional simulated
  model latency (`latency_s`, heavy-tailed with `latency_sigma`);
- `openai`: an LLM behind one or more OpenAI-compatible servers (vLLM, SGLang, a router);
- `python`: a user's own policy, built by `entrypoint` with the block's other keys.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)

from schemas.sampling import SHORTHANDS, SamplingConfig
from schemas.sampling import resolve as resolve_sampling

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class PartialRollout(BaseModel):
    """`policy.partial_rollout`: what happens to generation in flight (docs/servers.md,
    "Partial rollouts").

    - `in_flight: keep` (the default): a weight update does not restart turns: the trainer's
      `ModelServers.for_batcher` pauses each server in the mode that keeps its requests (vLLM
      `keep`, SGLang `retract`) and they finish under the new weights, labelled with both
      versions; a pause (an operator's, or a sync hand-out whose episodes live on) lets the
      turns in flight finish and holds each episode before its next turn. `abort`: the
      old behaviour: updates abort the turns in flight and pauses close them; they are sent
      again from scratch.
    - `in_flight: resume` (token-in/token-out only, `policy.tokenizer`): updates abort the
      turns in flight (vLLM `abort`, SGLang's aborting update) and each is continued from the
      tokens the aborting answer carries: the next request's prompt is the turn's prompt ids +
      those ids, its `max_tokens` less what was sampled, and the turn is the two concatenated
      (`producers.llm.tito.Resumed`). Pauses close the turns in flight as `abort` does (a
      closed request answers nothing to resume from).
    - `sync_carry_over: false` (the default): sync mode stays on-policy: the episodes a step
      leaves unfinished expire when the next version is published. `true`: they carry over
      into the next step (once), as slime's `--partial-rollout`; their turns keep the
      version that generated them. No effect in async mode (see the next).
    - `async_carry_over: 0` (the default): async mode: an episode expires, and its
      generation is thrown away, once the version is more than `async_generation_ratio`
      past its step. `N`: an episode already admitted lives on N versions more before it
      expires (admission is unchanged: no more episodes start ahead), as AReaL bounds
      staleness when a sample is admitted and never discards it after; a delivered
      trajectory is then at most `ratio + N` versions old, its turns labelled with the
      versions that sampled them. No effect in sync mode, so a config switches between
      the modes by its ratio alone.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    in_flight: Literal["keep", "abort", "resume"] = Field(
        default="keep", description="generation in flight at a weight update or a pause: "
        "keep (paused and continued, never sent again), abort (sent again from scratch) or "
        "resume (aborted, then continued from the tokens sampled so far; needs "
        "policy.tokenizer)")
    sync_carry_over: bool = Field(
        default=False, description="sync mode: a step's unfinished episodes carry over into "
        "the next step instead of expiring (their old-version turns keep their version)")
    async_carry_over: int = Field(
        default=0, ge=0, le=16, description="async mode: versions an admitted episode may "
        "outlive the staleness bound before it expires and its generation is discarded; "
        "delivered trajectories may be up to async_generation_ratio + this versions old")


class _PartialRolloutField(BaseModel):
    """The `partial_rollout` block every policy type takes."""

    partial_rollout: PartialRollout = Field(
        default_factory=PartialRollout, description="generation in flight at weight updates "
        "and pauses; sync carry-over (schemas.policy.PartialRollout)")

    @model_validator(mode="after")
    def _resume_needs_token_ids(self) -> Any:
        # resuming from text would retokenize what was sampled: only token-id prompts resume
        # a python policy's agent calls go token-in/token-out with policy.llm.tokenizer
        llm = getattr(self, "llm", None)
        own = getattr(self, "tokenizer", None) if "tokenizer" in type(self).model_fields else None
        if (self.partial_rollout.in_flight == "resume" and not own
                and not getattr(llm, "tokenizer", None)):
            where = "policy.llm.tokenizer" if "llm" in type(self).model_fields else \
                "policy.tokenizer"
            raise ValueError(f"partial_rollout.in_flight: resume needs {where} "
                             "(token-in/token-out: a turn resumes from its sampled ids; "
                             "from text they would be retokenized); use keep or abort")
        return self


class RandomPolicyConfig(_PartialRolloutField):
    """Uniform random actions; `latency_s` waits per action as a model server would."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["random"] = "random"
    latency_s: float = Field(
        default=0.0, ge=0, description="simulated model latency per action (median, seconds)"
    )
    latency_sigma: float = Field(
        default=0.0, ge=0,
        description="heavy tail: each action waits latency_s * exp(latency_sigma * z), "
        "z standard normal from the (episode, member)'s own generator",
    )


class OpenAIPolicyConfig(_PartialRolloutField):
    """An LLM served by OpenAI-compatible servers. The API key is read from the environment
    variable `api_key_env` names; the key itself never enters the config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["openai"]
    base_urls: list[str] = Field(
        min_length=1, description="OpenAI-style base URLs (http://host:8000/v1): servers or "
        "one router")
    model: str = Field(min_length=1, description="the served model name")
    api_key_env: str | None = Field(
        default=None, description="name of the environment variable holding the API key")
    sampling: SamplingConfig = Field(
        description="train and val sampling and where each value came from "
        "(schemas.sampling); the block's temperature, val_temperature, top_p, top_k and "
        "max_tokens set it")
    skip_mock_system_prompt: bool = Field(
        default=False, description="ROLL's flag for a tag with no system message: false, the "
        "prompt has no system turn at all (the chat template's default system prompt is cut "
        "off); true, the chat template adds its default")
    max_inflight: PositiveInt = Field(default=1024, description="requests in flight per producer")
    timeout_s: float = Field(default=600.0, gt=0, description="per request")
    resolve_timeout_s: float = Field(
        default=60.0, gt=0, description="at start, how long a base URL's host name may fail "
        "to resolve before the producer gives up (exit 1)")
    max_retries: NonNegativeInt = Field(
        default=3, description="retries of a transient failure on one server before another")
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="passed through in every request body")
    require_version: bool = Field(
        default=False, description="send a turn only to a server whose weight version is "
        "within the run's staleness bound; wait otherwise")
    tokenizer: str | None = Field(
        default=None, min_length=1, description="token-in/token-out: a Hugging Face tokenizer "
        "folder (tokenizer.json, tokenizer_config.json with the chat template) or name; the "
        "producers apply the chat template, send token-id prompts to /v1/completions and "
        "extend each turn with the sampled ids (producers.llm.tito; the tito extra)")
    routing: Literal["sticky", "least_loaded"] = Field(
        default="sticky", description="sticky: the turns of an episode and the members of its "
        "group go to one server (rendezvous hashing on mode:group:episode, for its prefix "
        "cache); least_loaded: each turn to the server with the fewest requests in flight")
    session_load_factor: float = Field(
        default=2.0, ge=1.0, description="sticky: a server takes a session's turn only while "
        "its requests in flight stay within this times the mean; else the session's next "
        "server")
    session_header: str | None = Field(
        default="X-Session-ID", pattern=r"^[A-Za-z0-9-]+$", description="the header naming "
        "each request's session (mode:group:episode) for a router; null: none")

    @model_validator(mode="before")
    @classmethod
    def _resolve_sampling(cls, data: Any) -> Any:
        # the shorthand keys become `sampling`, with where each value came from
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k not in SHORTHANDS} | {
                "sampling": resolve_sampling(data)}
        return data

    # the shorthands, read back (the producers' names for the train values)
    @property
    def temperature(self) -> float:
        return self.sampling.train.temperature

    @property
    def val_temperature(self) -> float:
        return self.sampling.val.temperature

    @property
    def top_p(self) -> float:
        return self.sampling.train.top_p

    @property
    def top_k(self) -> int:
        return self.sampling.train.top_k

    @property
    def max_tokens(self) -> int:
        return self.sampling.train.max_new_tokens

    @field_validator("api_key_env")
    @classmethod
    def _variable_name(cls, value: str | None) -> str | None:
        # the message never echoes the value: it may be a key pasted in by mistake
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError("must be the name of an environment variable (letters, digits "
                             "and _), not the key itself")
        return value

    @field_validator("base_urls", mode="before")
    @classmethod
    def _one_url(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _no_key_inline(cls, data: Any) -> Any:
        # never echoes the value: it is a secret
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError("api_key: a key in the config would be published to Redis with "
                             "it; put it in an environment variable and name that in "
                             "api_key_env")
        return data

    @field_validator("extra_body")
    @classmethod
    def _not_the_policys_own(cls, body: dict[str, Any]) -> dict[str, Any]:
        # what the policy sets itself: overriding these would skip the start-up model check
        # or lose the token ids and logprobs a trajectory must carry
        for key in body:
            if key in _OWN_BODY_FIELDS:
                owner = _OWN_BODY_FIELDS[key]
                raise ValueError(f"{key!r} is set by the policy itself"
                                 + (f" (use policy.{owner})" if owner else ""))
        return body

    @field_validator("base_urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        checked = [_check_base_url(url) for url in urls]
        for i, url in enumerate(checked):
            if url in checked[:i]:
                raise ValueError(f"{url!r} is listed twice (one server, two entries: its "
                                 "requests and weight updates would be doubled)")
        return checked


# request body fields an openai policy writes itself -> its config field ("" for none)
_OWN_BODY_FIELDS = {
    "model": "model", "messages": "", "temperature": "temperature", "top_p": "top_p",
    "top_k": "top_k", "max_tokens": "max_tokens", "max_completion_tokens": "max_tokens",
    "seed": "", "logprobs": "", "return_token_ids": "", "stream": "", "n": "",
    "prompt": "tokenizer",
}


def _check_base_url(url: str) -> str:
    """A base URL a producer can use: http(s), a host, a valid port, no credentials (they
    would be published with the config and logged: the key goes in `api_key_env`)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise ValueError("a base URL must not hold credentials (user:password@): put the key "
                         "in an environment variable and name it in api_key_env")
    try:
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError:
        raise ValueError(f"{url!r}: the port is not a number in 0..65535") from None
    if not parts.hostname or any(c.isspace() for c in url):
        raise ValueError(f"{url!r} is not a server URL (http://HOST[:PORT]/v1)")
    return url.rstrip("/")


class AgentLLMConfig(OpenAIPolicyConfig):
    """`policy.llm` of a python policy: the model servers its own agent calls
    (`context.llm`, producers/policies/agent.py), with the `openai` policy's server fields
    (no `type`; `partial_rollout` is the policy block's own)."""

    type: Literal["openai"] = Field(default="openai", exclude=True)
    partial_rollout: PartialRollout = Field(default_factory=PartialRollout, exclude=True)

    @model_validator(mode="after")
    def _partial_rollout_is_the_blocks(self) -> AgentLLMConfig:
        # the field comes with the openai policy's model; only its default may be here (a
        # published config spells it out)
        if self.partial_rollout != PartialRollout():
            raise ValueError("partial_rollout: set it on the policy block, not in llm")
        return self


class PythonPolicyConfig(_PartialRolloutField):
    """A user's policy: `entrypoint` is `package.module:factory` or `path/to/file.py:factory`
    (a relative file is resolved against the config file's folder); every other key of the
    block is passed to the factory as a keyword argument, except `llm`: the model servers
    its agent calls through the producer's pool (`AgentLLMConfig`, given to the policy's
    `start(context)` as `context.llm`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: Literal["python"]
    entrypoint: str = Field(min_length=3)
    llm: AgentLLMConfig | None = Field(
        default=None, description="model servers for the policy's own agent calls "
        "(context.llm): the openai policy's fields (base_urls, model, tokenizer, sampling, "
        "api_key_env, timeout_s, ...)")

    @field_validator("entrypoint")
    @classmethod
    def _has_attribute(cls, value: str) -> str:
        target, sep, attr = value.rpartition(":")
        if not sep or not target or not attr.isidentifier():
            raise ValueError(f"{value!r} must be 'package.module:factory' or "
                             "'path/to/file.py:factory'")
        return value

    @property
    def kwargs(self) -> dict[str, Any]:
        """The block's other keys: the factory's keyword arguments."""
        return dict(self.model_extra or {})

    def resolved(self, base_dir: Path) -> PythonPolicyConfig:
        """This config with a relative `file.py` entrypoint made absolute against `base_dir`."""
        target, _, attr = self.entrypoint.rpartition(":")
        if not target.endswith(".py") or Path(target).is_absolute():
            return self
        path = (base_dir / target).resolve()
        return self.model_copy(update={"entrypoint": f"{path}:{attr}"})


PolicyConfig = Annotated[
    RandomPolicyConfig | OpenAIPolicyConfig | PythonPolicyConfig,
    Field(discriminator="type"),
]
POLICY_TYPES: dict[str, type[BaseModel]] = {
    "random": RandomPolicyConfig,
    "openai": OpenAIPolicyConfig,
    "python": PythonPolicyConfig,
}


def policy_known_keys(section: dict[str, Any]) -> set[str] | None:
    """The keys a policy block of this type understands; None: every key is kept (the python
    policy's keys are its factory's arguments, and an unknown type fails validation)."""
    model = POLICY_TYPES.get(str(section.get("type", "random")))
    if model is None or model is PythonPolicyConfig:
        return None
    # an inline api_key reaches the model, which refuses it (dropped, it would fail later
    # with a 401 and only a warning to go on); the sampling shorthands become `sampling`
    if model is OpenAIPolicyConfig:
        return set(model.model_fields) | {"api_key"} | set(SHORTHANDS)
    return set(model.model_fields)


@dataclass(frozen=True)
class ServerRecord:
    """What `{RUN}:servers` records of one model server (a trainer's `ModelServers`)."""

    version: int  # the weight version it holds
    model: str | None = None  # the name requests use to get it (a vLLM LoRA adapter); None:
    # the policy's `model`
    checkpoint: str | None = None  # what it loaded: loaded again if the server loses it
    reports: bool = False  # it reports the version in each answer (SGLang's `weight_version`,
    # set by the update): an answer reporting no version comes from weights it was not given
    loaded_at: float | None = None  # the trainer's clock (Unix seconds) when it recorded the
    # load: a server loaded again with the same version (after a restart) is a new record


def server_record(version: int, model: str | None = None, *, checkpoint: str | None = None,
                  reports: bool = False, loaded_at: float | None = None) -> str:
    """A `{RUN}:servers` value (see `ServerRecord`). JSON, readable with redis-cli:
    `{"version": 7, "model": "rollstream-v7", "checkpoint": "/ckpt/7", "loaded_at": ...}`."""
    record: dict[str, Any] = {"version": int(version)}
    if model is not None:
        record["model"] = model
    if checkpoint is not None:
        record["checkpoint"] = checkpoint
    if reports:
        record["reports"] = True
    if loaded_at is not None:
        record["loaded_at"] = round(float(loaded_at), 6)
    return json.dumps(record, separators=(",", ":"))


def read_server_record(raw: bytes | str) -> ServerRecord | None:
    """The `ServerRecord` of a `{RUN}:servers` value; None when unreadable."""
    try:
        record = json.loads(raw)
        version = int(record["version"])
        model, checkpoint = record.get("model"), record.get("checkpoint")
        reports = record.get("reports") is True
        loaded_at = record.get("loaded_at")
        loaded_at = None if loaded_at is None else float(loaded_at)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return ServerRecord(version, str(model) if model is not None else None,
                        str(checkpoint) if checkpoint is not None else None, reports, loaded_at)


# -- talking to OpenAI-compatible servers (the producers' pool and the trainer's updates) ------
def request_headers(api_key: str | None) -> dict[str, str]:
    """The headers of a JSON request to a model server, with the API key when there is one."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def error_message(answer: Any) -> str | None:
    """The error message in a server's decoded answer (vLLM's `{"error": {"message"}}`,
    SGLang's and older servers' `{"message"}`, an error string, FastAPI's `{"detail"}`),
    first 200 characters; None when it holds none."""
    if isinstance(answer, dict):
        error = answer.get("error", answer)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:200]
        if isinstance(error, str):
            return error[:200]
        detail = answer.get("detail")  # FastAPI's errors (transformers serve)
        if detail is not None:
            return str(detail)[:200]
    return None
