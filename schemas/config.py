"""The rollout config (ROLL-compatible YAML): `RolloutConfig`, and how a file becomes one.

The parts live by name: `schemas.manager` (an env manager's layout and group filter),
`schemas.tagspec` (a `custom_envs` entry), `schemas.policy` and `schemas.sampling` (the
policy and its sampling), `schemas.roll` (Hydra composition of ROLL files), `schemas.rollmap`
and `schemas.rollkeys` (what ROLL's keys become, and which keys are refused),
`schemas.envtypes` (which env types, env managers and tools a config may use).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from schemas.envspec import DEFAULT_CUSTOM_ENVS
from schemas.envtypes import pending_note
from schemas.errors import ConfigError
from schemas.keys import check_run_name
from schemas.manager import EnvManagerConfig, GroupFilterConfig
from schemas.policy import (
    POLICY_TYPES,
    PolicyConfig,
    PythonPolicyConfig,
    RandomPolicyConfig,
)
from schemas.protocol import Schedule
from schemas.roll import compose, needs_composition
from schemas.rollmap import translate, used_tags
from schemas.tagspec import UNSUPPORTED, TagSpec
from schemas.yamlio import ShowDumper, UniqueKeyLoader, yaml_problem

logger = logging.getLogger(__name__)

DEFAULT_RUN = "rollstream"
__all__ = ["DEFAULT_RUN", "EnvManagerConfig", "RolloutConfig", "resolve_redis_url",
           "resolve_run"]


class RolloutConfig(BaseModel):
    """The whole rollout config. Load with `RolloutConfig.from_yaml(path)`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_batch_size: PositiveInt | None = Field(
        default=None, description="trajectories per train batch; default: one per train env"
    )
    val_batch_size: PositiveInt | None = Field(
        default=None, description="trajectories per val batch; default: one per val env"
    )
    async_generation_ratio: NonNegativeInt = Field(
        default=0, description="0 = sync (pause while training); k >= 1: at most k versions stale"
    )
    seed: int = 42
    train_env_manager: EnvManagerConfig
    val_env_manager: EnvManagerConfig | None = None
    custom_envs: dict[str, TagSpec] = Field(
        default_factory=dict, description="tag -> env and env-manager settings; the tags no "
        "env manager uses are dropped unbuilt, as ROLL builds only the tags it uses")
    policy: PolicyConfig = Field(default_factory=RandomPolicyConfig)
    redis_url: str | None = None
    run: str = DEFAULT_RUN
    lease_ttl_s: float = Field(default=10.0, gt=0, description="shard lease ttl; a dead "
                               "producer's shards move after this long")
    env_max_retries: NonNegativeInt = Field(
        default=2, description="retries of an episode whose env raised, then it commits failed"
    )
    min_replicas: NonNegativeInt = Field(
        default=0, description="replicas that must have a commit, an ack or a version publish "
        "before it counts (WAIT); 0: acknowledged by the primary alone")
    replica_timeout_ms: int = Field(
        default=1000, gt=0, le=60_000, description="how long one WAIT for replicas may take; "
        "a write not replicated in time is not acknowledged and is sent again")
    sample_rate: float = Field(
        default=0.02, ge=0.0, le=1.0, description="share of group episodes whose finished "
        "trajectories (every member's) also go, slimmed, to the run's sample stream "
        "{RUN}:samples, which `rollstream ui` shows; 0: none")
    sample_stream_len: PositiveInt = Field(
        default=128, le=10_000, description="entries the sample stream keeps (trimmed on "
        "write); a sample is at most 32 KiB, so 128 keep it under 4 MiB")

    @field_validator("policy", mode="before")
    @classmethod
    def _default_policy_type(cls, value: Any) -> Any:
        if isinstance(value, dict) and "type" not in value:
            return {"type": "random", **value}
        return value

    @field_validator("run")
    @classmethod
    def _check_run(cls, value: str) -> str:
        return check_run_name(value, "")  # pydantic names the field

    @field_validator("custom_envs", mode="before")
    @classmethod
    def _envs_mapping(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"must be a mapping of tag -> env settings, got "
                             f"{type(value).__name__}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _used_envs(cls, data: Any) -> Any:
        """The default tags merged under the given ones, then only the used tags kept; a used
        tag that no entry, default or gymnasium id names is refused here, where the unused
        entries can still be offered as what was meant."""
        if not isinstance(data, dict):
            return data
        given = data.get("custom_envs")
        if given is not None and not isinstance(given, dict):
            return data  # the field's own validation names it
        merged: dict[str, Any] = {**DEFAULT_CUSTOM_ENVS, **{str(k): v for k, v in
                                                            (given or {}).items()}}
        used = used_tags(data)
        for name in ("train_env_manager", "val_env_manager"):
            manager = data.get(name)
            tags = manager.get("tags") if isinstance(manager, dict) else None
            for tag in tags if isinstance(tags, list) else ():
                if str(tag) not in merged and not _is_gym_id(str(tag)):
                    raise ValueError(_unknown_tag(name, str(tag), merged))
        return {**data, "custom_envs": {tag: merged[tag] for tag in used if tag in merged}}

    @model_validator(mode="after")
    def _fill_and_check(self) -> RolloutConfig:
        train, val = self.train_env_manager, self.val_env_manager
        if self.rollout_batch_size is None:
            object.__setattr__(self, "rollout_batch_size", train.num_env_groups * train.group_size)
        if val is not None and self.val_batch_size is None:
            object.__setattr__(self, "val_batch_size", val.num_env_groups * val.group_size)
        _check_multiple("rollout_batch_size", self.train_batch_size, train, "train_env_manager")
        if val is not None:
            _check_multiple("val_batch_size", self.val_batch, val, "val_env_manager")
        for name, manager in (("train_env_manager", train), ("val_env_manager", val)):
            for tag in manager.tags if manager is not None else ():
                if tag not in self.custom_envs and not _is_gym_id(tag):
                    raise ValueError(_unknown_tag(name, tag, self.custom_envs))
        _check_tool_parsers(self)
        return self

    # -- derived ---------------------------------------------------------------------------
    @property
    def train_batch_size(self) -> int:
        assert self.rollout_batch_size is not None
        return self.rollout_batch_size

    @property
    def val_batch(self) -> int:
        assert self.val_batch_size is not None
        return self.val_batch_size

    @property
    def ratio(self) -> int:
        return self.async_generation_ratio

    @property
    def is_sync(self) -> bool:
        return self.async_generation_ratio == 0

    @property
    def carry_steps(self) -> int:
        """Steps an unfinished train episode may outlive the staleness bound (`Schedule.carry`):
        sync mode 1 with `policy.partial_rollout.sync_carry_over`, else 0 (sync stays
        on-policy); async mode `policy.partial_rollout.async_carry_over`."""
        partial = self.policy.partial_rollout
        return int(partial.sync_carry_over) if self.is_sync else partial.async_carry_over

    def schedule(self, mode: str) -> Schedule:
        """The admission and expiry rules of a mode (train: with the carry-over, if any)."""
        return Schedule(self.episodes_per_step(mode), self.ratio,
                        self.carry_steps if mode == "train" else 0)

    def manager(self, mode: str) -> EnvManagerConfig:
        if mode == "train":
            return self.train_env_manager
        if mode == "val":
            if self.val_env_manager is None:
                raise ConfigError("val_env_manager: not configured, so there is no val mode")
            return self.val_env_manager
        raise ConfigError(f"mode must be 'train' or 'val', not {mode!r}")

    def modes(self) -> list[str]:
        return ["train"] if self.val_env_manager is None else ["train", "val"]

    def batch_size(self, mode: str) -> int:
        return self.train_batch_size if mode == "train" else self.val_batch

    def episodes_per_step(self, mode: str) -> int:
        """T: episodes each env plays per train step (or per val round)."""
        manager = self.manager(mode)
        return math.ceil(self.batch_size(mode) / (manager.num_env_groups * manager.group_size))

    def env_spec(self, tag: str) -> TagSpec:
        """A used tag's settings (a tag that only names a gymnasium id: that id)."""
        if tag in self.custom_envs:
            return self.custom_envs[tag]
        if tag in DEFAULT_CUSTOM_ENVS:
            return TagSpec.model_validate(DEFAULT_CUSTOM_ENVS[tag])
        return TagSpec(env_id=tag)

    def pending(self) -> list[str]:
        """What this config uses that producers do not run yet: one line per env type, env
        manager or tool, naming the tags that use it."""
        tags: dict[tuple[str, str], list[str]] = {}
        supports = {}
        for tag, spec in self.custom_envs.items():
            for what, name, support in spec.pending():
                tags.setdefault((what, name), []).append(tag)
                supports[(what, name)] = support
        return [pending_note(what, name, names, supports[(what, name)])
                for (what, name), names in tags.items()]

    def layout(self) -> dict[str, Any]:
        return {mode: self.manager(mode).summary() for mode in self.modes()}

    # The settings that decide which episodes a run plays and how they are batched: a run's
    # streams, cursors and version only make sense under the same values.
    RESUME_FIELDS: ClassVar[tuple[str, ...]] = (
        "train_env_manager", "val_env_manager", "seed", "async_generation_ratio",
        "rollout_batch_size", "val_batch_size")

    def resume_conflicts(self, published: RolloutConfig) -> list[str]:
        """What differs from `published` in ways a run cannot resume across, one item each
        (`seed 42 -> 7`); empty when this config can take the run over."""
        out = []
        for name in self.RESUME_FIELDS:
            old, new = _episodes_of(getattr(published, name)), _episodes_of(getattr(self, name))
            if old != new:
                out.append(f"{name} {_short(old)} -> {_short(new)}")
        return out

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, *, source: str = "config", base_dir: Path | None = None,
                  warn: bool = True, variables: frozenset[str] = frozenset()) -> RolloutConfig:
        """Validate a parsed config (`schemas.rollmap.translate` first: ROLL's keys taken or
        set aside, unknown keys refused). `base_dir` (the config file's folder) resolves a
        python policy's relative file entrypoint; `variables`: the top-level keys the file's
        interpolations refer to; `warn=False` for a config already checked where it was
        written."""
        if data is None:
            raise ConfigError(f"{source}: the config is empty")
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping of config keys at the top level, "
                              f"got a {type(data).__name__}")
        translated = translate(data, cls.model_fields, source, variables)
        try:
            config = cls.model_validate(translated.data)
        except ValidationError as exc:
            raise ConfigError(f"{source}: {_describe(exc, translated.named)}") from None
        if translated.set_aside:
            logger.debug("%s: set aside (ROLL's keys a rollout service does not use): %s",
                         source, ", ".join(translated.set_aside))
        if base_dir is not None and isinstance(config.policy, PythonPolicyConfig):
            object.__setattr__(config, "policy", config.policy.resolved(base_dir))
        if warn:
            config._warn(source)
        return config

    def _warn(self, source: str) -> None:
        for note in self.pending():
            logger.warning("%s: %s", source, note)
        val = self.val_env_manager
        if val is not None and val.group_size > 1:
            logger.warning("%s: val_env_manager.group_size is %d; 1 is usual for validation "
                           "(temperature 0 gives identical answers within a group)",
                           source, val.group_size)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> RolloutConfig:
        """A config file: plain YAML, or a ROLL/Hydra file (a `defaults` list or `${...}`
        interpolation) composed as ROLL's launcher composes it (`schemas.roll.compose`)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start}: "
                              f"{exc.object[exc.start:exc.start + 1]!r})") from None
        try:
            data = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
        variables: frozenset[str] = frozenset()
        if needs_composition(data):
            data, variables = compose(path)
        return cls.from_dict(data, source=str(path), base_dir=path.resolve().parent,
                             variables=variables)

    @classmethod
    def from_json(cls, text: str | bytes) -> RolloutConfig:
        """The resolved config as published in Redis (checked when it was loaded)."""
        try:
            return cls.from_dict(json.loads(text), source="published config", warn=False)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"published config: not valid JSON: {exc}") from None

    def to_yaml(self) -> str:
        """The resolved config as YAML (`rollstream config show`): every field with its
        defaults filled in, a file's ROLL keys as what they became; loading it gives this
        config back. A password in `redis_url` is masked."""
        from schemas.connection import mask_url

        data = self.model_dump()
        if data.get("redis_url"):
            data["redis_url"] = mask_url(data["redis_url"])
        return yaml.dump(data, Dumper=ShowDumper, sort_keys=False, allow_unicode=True,
                         width=100)

    def to_json(self) -> str:
        """The config as published in Redis: everything but `redis_url` (producers are
        already connected, and a URL can hold a password)."""
        return self.model_dump_json(exclude={"redis_url"})


def _check_tool_parsers(config: RolloutConfig) -> None:
    """`tools.parser: server` reads the server's parsed `tool_calls`, which a token-in/
    token-out turn (`policy.tokenizer`: the completions endpoint) never has: refused."""
    if getattr(config.policy, "tokenizer", None) is None:
        return
    for tag, spec in config.custom_envs.items():
        if spec.tools is not None and spec.tools.parser == "server":
            raise ValueError(
                f"custom_envs.{tag}.tools.parser: server reads the server's parsed tool "
                "calls, which token-in/token-out turns (policy.tokenizer) do not have; name "
                "a text parser (hermes) or leave it out")


def _check_multiple(field: str, size: int, manager: EnvManagerConfig, name: str) -> None:
    if size % manager.group_size:
        raise ValueError(
            f"{field} {size} is not a multiple of {name}.group_size {manager.group_size}"
        )


def _is_gym_id(tag: str) -> bool:
    from gymnasium.envs.registration import registry

    return tag in registry


def _unknown_tag(name: str, tag: str, known: dict[str, Any]) -> str:
    close = difflib.get_close_matches(tag, sorted(known), n=1, cutoff=0.8)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"{name}.tags: unknown env tag {tag!r} ({hint}known: {', '.join(sorted(known))}; "
            "or add it to custom_envs, or use a registered gymnasium id)")


def _describe(exc: ValidationError, named: dict[str, str] | None = None) -> str:
    """Pydantic errors as `field.path: message`, joined by '; ' (each once). `named`: policy
    keys filled from elsewhere in the file (ROLL's keys), by what the user wrote: a bad
    `actor_infer.generating_args.max_new_tokens` is named so, not by the policy key it set."""
    named = named or {}
    lines: list[str] = []
    for err in exc.errors():
        parts = [str(part) for part in err["loc"]]
        if parts[:1] == ["policy"] and len(parts) > 1 and parts[1] in POLICY_TYPES:
            del parts[1]  # the union's tag, not a key of the user's file
        inner = ".".join(parts[1:])
        if parts[:1] == ["policy"] and inner in named:
            parts = [named[inner]]  # one line however many modes it set
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == UNSUPPORTED:  # env type/manager/tool of a tag: one line naming it
            ctx = err.get("ctx", {})
            tag = parts[-1] if parts[:1] == ["custom_envs"] and len(parts) > 1 else "?"
            line = (f"{ctx.get('what')} {ctx.get('name')!r} (tag {tag}): not supported: needs "
                    f"{ctx.get('needs')}")
        else:
            if err["type"] == "union_tag_invalid":
                parts.append("type")
                msg = (f"{err['input'].get('type')!r} is not one of "
                       f"{', '.join(POLICY_TYPES)}")
            loc = ".".join(parts)
            line = f"{loc}: {msg}" if loc else msg
        if line not in lines:
            lines.append(line)
    return "; ".join(lines)


def resolve_redis_url(cli_url: str | None, config: RolloutConfig | None = None) -> str | None:
    """CLI flag, else ROLLSTREAM_REDIS_URL, else REDIS_URL, else the config's `redis_url`."""
    for value in (cli_url, os.environ.get("ROLLSTREAM_REDIS_URL"), os.environ.get("REDIS_URL")):
        if value:
            return value
    return config.redis_url if config is not None else None


def resolve_run(cli_run: str | None, config: RolloutConfig | None = None) -> str:
    """CLI flag, else ROLLSTREAM_RUN, else the config's `run`, else 'rollstream'. A flag given
    empty is an error, not the default: `--run "$UNSET"` must not act on another run."""
    if cli_run is not None:
        return check_run_name(cli_run, "--run")
    env_run = os.environ.get("ROLLSTREAM_RUN")
    if env_run:
        return check_run_name(env_run, "ROLLSTREAM_RUN")
    return config.run if config is not None else DEFAULT_RUN


def _episodes_of(value: Any) -> Any:
    """What of a resume field decides the episodes: an env manager without its group filters
    (the trainer's choice of groups to train on; a run resumes across a change of them)."""
    if isinstance(value, EnvManagerConfig):
        return value.model_copy(update={"group_filter_cls": None,
                                        "group_filter_config": GroupFilterConfig()})
    return value


def _short(value: Any) -> str:
    """A config value in a message: models as their set fields, compactly."""
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(exclude_defaults=True), separators=(",", ":"))
    return str(value)
