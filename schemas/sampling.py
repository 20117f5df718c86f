"""Sampling per mode, with ROLL's precedence, and where each value came from.

An LLM policy samples train and val turns with their own settings (`Sampling`), and caps a
turn's new tokens and an episode's tokens with `sequence_length`. `resolve` builds both
modes from, highest first:
1. `policy.sampling.{train,val}.FIELD` given in the config itself (a `config show` output);
2. the policy block's shorthands: `temperature` (train), `val_temperature` (val), `top_p`,
   `top_k` and `max_tokens` (both);
3. ROLL's `generating_args`, as AgenticConfig.__post_init__ (roll/pipeline/agentic/
   agentic_config.py, alibaba/ROLL 8eb27cc2) sets them: when `actor_infer.generating_args` is
   given, both env managers sample with it and their own blocks are overwritten; otherwise
   each manager samples with its own (`train_env_manager.generating_args`, and
   `val_env_manager.generating_args` for val; a val manager without one, which ROLL fails
   on at its first val turn, samples with the train manager's). A field a winning block leaves
   out has GeneratingArguments' default (roll/configs/generating_args.py: temperature 0.95,
   top_p 0.7, top_k 50, max_new_tokens 8192), and stop strings stay in the output
   (include_stop_str_in_output: ROLL's vLLM and SGLang strategies default it to True);
4. rollstream's defaults (temperature 1.0, val temperature 0.0, top_p 1.0, top_k off, 512
   tokens).
`sequence_length`: `policy.sampling.sequence_length`, else ROLL's top-level `sequence_length`,
else ROLL's `prompt_length + response_length` (BaseConfig.__post_init__; prompt_length
defaults to 1024), else none (no cap).

`sources` records where each value came from (`train.temperature` ->
`actor_infer.generating_args.temperature`), so `rollstream config show` can say it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from schemas.errors import ConfigError

MODES = ("train", "val")

# rollstream's own defaults, and its shorthand keys of the policy block: key -> (modes, field)
ROLLSTREAM_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 512, "stop": [],
    "include_stop_str_in_output": None, "repetition_penalty": 1.0,
}
ROLLSTREAM_VAL_TEMPERATURE = 0.0
SHORTHANDS: dict[str, tuple[tuple[str, ...], str]] = {
    "temperature": (("train",), "temperature"),
    "val_temperature": (("val",), "temperature"),
    "top_p": (MODES, "top_p"),
    "top_k": (MODES, "top_k"),
    "max_tokens": (MODES, "max_new_tokens"),
}

# GeneratingArguments field -> Sampling field, and its default when a block leaves it out
ROLL_FIELDS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
    "max_new_tokens": "max_new_tokens", "stop_strings": "stop",
    "include_stop_str_in_output": "include_stop_str_in_output",
    "repetition_penalty": "repetition_penalty",
}
ROLL_DEFAULTS: dict[str, Any] = {
    "temperature": 0.95, "top_p": 0.7, "top_k": 50, "max_new_tokens": 8192, "stop": [],
    "include_stop_str_in_output": True, "repetition_penalty": 1.0,
}
# GeneratingArguments fields with no effect on an OpenAI-compatible server's sampling: set
# aside (do_sample: ROLL's vLLM/SGLang strategies ignore it too; num_return_sequences: ROLL
# forces 1; max_length: dropped when max_new_tokens is set; logprobs: rollstream always asks)
ROLL_SET_ASIDE = ("do_sample", "num_return_sequences", "max_length", "length_penalty",
                  "logprobs")


class Sampling(BaseModel):
    """One mode's sampling, as a producer sends it to the server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(ge=0)
    top_p: float = Field(gt=0, le=1)
    top_k: int = Field(ge=-1, description="-1 (or 0): no top-k")
    max_new_tokens: PositiveInt = Field(
        description="tokens per turn, before the tag's max_tokens_per_step and what is left "
        "of sequence_length")
    stop: list[str] = Field(default_factory=list, description="stop strings")
    include_stop_str_in_output: bool | None = Field(
        default=None, description="keep a matched stop string in the reply; none: the "
        "server's default")
    repetition_penalty: float = Field(default=1.0, gt=0)


class SamplingConfig(BaseModel):
    """Train and val sampling, the token cap, and where each value came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train: Sampling
    val: Sampling
    sequence_length: PositiveInt | None = Field(
        default=None, description="ROLL's sequence_length: a turn's prompt and reply together "
        "at most this many tokens; a turn whose prompt reaches it ends the episode")
    sources: dict[str, str] = Field(default_factory=dict)

    def mode(self, mode: str) -> Sampling:
        if mode not in MODES:
            raise ValueError(f"mode must be 'train' or 'val', not {mode!r}")
        return self.train if mode == "train" else self.val

    def source(self, key: str) -> str:
        """Where `key` (`val.temperature`, `sequence_length`) came from."""
        return self.sources.get(key, "rollstream default")

    def describe(self) -> list[str]:
        """One line per value: `val temperature 0.99 (val_env_manager.generating_args)`."""
        lines = []
        for mode in MODES:
            for name, value in self.mode(mode).model_dump().items():
                lines.append(f"{mode} {name} {value} ({self.source(f'{mode}.{name}')})")
        lines.append(f"sequence_length {self.sequence_length} "
                     f"({self.source('sequence_length')})")
        return lines


@dataclass(frozen=True)
class RollSampling:
    """ROLL's sampling settings of a file: the three `generating_args` blocks (None: not
    given) and the lengths that decide `sequence_length`."""

    actor_infer: dict[str, Any] | None = None
    train: dict[str, Any] | None = None
    val: dict[str, Any] | None = None
    sequence_length: int | None = None
    prompt_length: int | None = None
    response_length: int | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.actor_infer, self.train, self.val,
                                           self.sequence_length, self.response_length))


def resolve(block: dict[str, Any], roll: RollSampling | None = None) -> dict[str, Any]:
    """The `sampling` of a policy block (without its shorthand keys, which it consumes) as a
    plain dict for `SamplingConfig`, with `sources` filled."""
    roll = roll or RollSampling()
    given = block.get("sampling")
    if isinstance(given, BaseModel):
        given = given.model_dump()
    if not isinstance(given, dict):
        given = {}
    given_sources = dict(given.get("sources") or {})
    values: dict[str, dict[str, Any]] = {mode: {} for mode in MODES}
    sources: dict[str, str] = {}

    def put(mode: str, name: str, value: Any, source: str) -> None:
        values[mode][name] = value
        sources[f"{mode}.{name}"] = source

    for mode in MODES:
        for name, value in ROLLSTREAM_DEFAULTS.items():
            put(mode, name, value, "rollstream default")
    put("val", "temperature", ROLLSTREAM_VAL_TEMPERATURE, "rollstream default (val_temperature)")
    for mode, (args, where, note) in _roll_blocks(roll).items():
        for name, value in ROLL_DEFAULTS.items():
            put(mode, name, value, f"ROLL default: {where} leaves it out{note}")
        for key, value in args.items():
            if key in ROLL_FIELDS and value is not None:
                put(mode, ROLL_FIELDS[key], list(value) if key == "stop_strings" else value,
                    f"{where}.{key}{note}")
    for key, (modes, name) in SHORTHANDS.items():
        if block.get(key) is not None:
            for mode in modes:
                put(mode, name, block[key], f"policy.{key}")
    for mode in MODES:
        for name, value in (given.get(mode) or {}).items():
            put(mode, str(name), value,
                given_sources.get(f"{mode}.{name}", f"policy.sampling.{mode}.{name}"))
    length, length_source = _sequence_length(roll)
    if given.get("sequence_length") is not None:
        length = given["sequence_length"]
        length_source = given_sources.get("sequence_length", "policy.sampling.sequence_length")
    if length is not None:
        sources["sequence_length"] = length_source
    extra = {k: v for k, v in given.items() if k not in (*MODES, "sources", "sequence_length")}
    return {**extra, "train": values["train"], "val": values["val"],
            "sequence_length": length, "sources": sources}


def _roll_blocks(roll: RollSampling) -> dict[str, tuple[dict[str, Any], str, str]]:
    """The generating_args block each mode samples with, its name, and a note, by ROLL's
    rule."""
    if roll.actor_infer is not None:
        where = "actor_infer.generating_args"
        return {"train": (roll.actor_infer, where, ""), "val": (roll.actor_infer, where, "")}
    blocks: dict[str, tuple[dict[str, Any], str, str]] = {}
    if roll.train is not None:
        blocks["train"] = (roll.train, "train_env_manager.generating_args", "")
    if roll.val is not None:
        blocks["val"] = (roll.val, "val_env_manager.generating_args", "")
    elif roll.train is not None:
        blocks["val"] = (roll.train, "train_env_manager.generating_args",
                         " (val_env_manager has none)")
    return blocks


def _sequence_length(roll: RollSampling) -> tuple[int | None, str]:
    if roll.sequence_length is not None:
        return roll.sequence_length, "sequence_length"
    if roll.response_length is not None:
        prompt = 1024 if roll.prompt_length is None else roll.prompt_length
        where = "prompt_length" if roll.prompt_length is not None else "ROLL's prompt_length 1024"
        return prompt + roll.response_length, f"{where} + response_length"
    return None, "rollstream default"


def check_roll_block(args: Any, where: str) -> None:
    """Refuse what ROLL's generating_args would do that a server's sampling cannot: beam
    search, and a block that is not a mapping."""
    if args is None:
        return
    if not isinstance(args, dict):
        raise ConfigError(f"{where}: expected a mapping of sampling settings, got "
                          f"{type(args).__name__}")
    beams = args.get("num_beams")
    if beams is not None and beams != 1:
        raise ConfigError(f"{where}.num_beams {beams}: beam search is not available: rollstream "
                          "samples through OpenAI-compatible servers (num_beams: 1)")
