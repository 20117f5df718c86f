"""Config models (ROLL-compatible YAML) and the env layout they imply.

Layout of one env manager (train or val), with M = group_size + group_size_redundancy:
env ids are contiguous per tag in the order of `tags`, group `g` holds envs `g*M .. g*M+M-1`,
and shard (one ROLL worker) `s` holds envs `s*max_env_num_per_worker ..`.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
from functools import cached_property
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

from schemas.envspec import DEFAULT_CUSTOM_ENVS, EnvSpec
from schemas.errors import ConfigError
from schemas.keys import check_run_name
from schemas.policy import (
    POLICY_TYPES,
    PolicyConfig,
    PythonPolicyConfig,
    RandomPolicyConfig,
    policy_known_keys,
)
from schemas.roll import (
    POLICY_SOURCES,
    ROLL_NOT_TYPOS,
    compose,
    needs_composition,
    policy_defaults,
)

logger = logging.getLogger(__name__)

DEFAULT_RUN = "rollstream"
# bounds that keep a typo (an extra zero or three) from building millions of streams and env
# slots before anything fails: far above what one run's Redis, batcher and producers serve
MAX_GROUPS = 65_536
MAX_ENVS = 1_048_576


class EnvManagerConfig(BaseModel):
    """ROLL's EnvManagerConfig: how many envs, in which groups, of which tags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_env_num_per_worker: PositiveInt
    num_env_groups: PositiveInt
    group_size: PositiveInt
    tags: list[str] = Field(min_length=1)
    num_groups_partition: list[PositiveInt] | None = None
    group_size_redundancy: NonNegativeInt = 0

    @model_validator(mode="after")
    def _check_partition(self) -> EnvManagerConfig:
        if self.num_env_groups > MAX_GROUPS:
            raise ValueError(f"num_env_groups {self.num_env_groups:,} is more than {MAX_GROUPS:,} "
                             "(each group is a Redis stream, all read by one XREADGROUP)")
        if self.num_envs > MAX_ENVS:
            raise ValueError(f"{self.num_envs:,} envs (num_env_groups x (group_size + "
                             f"group_size_redundancy)) is more than {MAX_ENVS:,}")
        part = self.num_groups_partition
        if part is None:
            return self
        if len(part) != len(self.tags):
            raise ValueError(
                f"num_groups_partition has {len(part)} entries but tags has {len(self.tags)}"
            )
        if sum(part) != self.num_env_groups:
            raise ValueError(
                f"num_groups_partition sums to {sum(part)}, not num_env_groups "
                f"{self.num_env_groups}"
            )
        return self

    # -- layout ---------------------------------------------------------------------------
    @property
    def members(self) -> int:
        """Envs per group: the group size plus the redundant members."""
        return self.group_size + self.group_size_redundancy

    @property
    def num_envs(self) -> int:
        return self.num_env_groups * self.members

    @property
    def num_shards(self) -> int:
        return math.ceil(self.num_envs / self.max_env_num_per_worker)

    @cached_property
    def partition(self) -> list[int]:
        """Groups per tag; missing partition: an even split, the remainder to the first tags."""
        if self.num_groups_partition is not None:
            return list(self.num_groups_partition)
        base, extra = divmod(self.num_env_groups, len(self.tags))
        return [base + (1 if i < extra else 0) for i in range(len(self.tags))]

    @cached_property
    def tag_ranges(self) -> dict[str, tuple[int, int]]:
        """Tag -> [first group, end group). A tag named twice gets its first range."""
        ranges: dict[str, tuple[int, int]] = {}
        start = 0
        for tag, count in zip(self.tags, self.partition, strict=True):
            ranges.setdefault(tag, (start, start + count))
            start += count
        return ranges

    @cached_property
    def _group_tags(self) -> list[str]:
        pairs = zip(self.tags, self.partition, strict=True)
        return [tag for tag, count in pairs for _ in range(count)]

    def tag_of_group(self, group_id: int) -> str:
        return self._group_tags[group_id]

    def group_of_env(self, env_id: int) -> int:
        return env_id // self.members

    def member_of_env(self, env_id: int) -> int:
        return env_id % self.members

    def envs_of_shard(self, shard: int) -> range:
        start = shard * self.max_env_num_per_worker
        return range(start, min(start + self.max_env_num_per_worker, self.num_envs))

    def summary(self) -> dict[str, Any]:
        """The layout as `rollstream config check --json` prints it."""
        return {
            "envs": self.num_envs,
            "groups": self.num_env_groups,
            "shards": self.num_shards,
            "group_size": self.group_size,
            "tags": {tag: list(span) for tag, span in self.tag_ranges.items()},
        }


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
    custom_envs: dict[str, EnvSpec] = Field(default_factory=dict, validate_default=True)
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
    def _merge_default_envs(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"must be a mapping of tag -> env settings, got "
                             f"{type(value).__name__}")
        merged: dict[str, Any] = dict(DEFAULT_CUSTOM_ENVS)
        merged.update(value or {})
        return merged

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
            if manager is not None:
                self._check_tags(name, manager)
        return self

    def _check_tags(self, name: str, manager: EnvManagerConfig) -> None:
        for tag in manager.tags:
            if tag not in self.custom_envs and not _is_gym_id(tag):
                known = ", ".join(sorted(self.custom_envs))
                raise ValueError(
                    f"{name}.tags: unknown env tag {tag!r} (known: {known}; "
                    "or add it to custom_envs, or use a registered gymnasium id)"
                )

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

    def env_spec(self, tag: str) -> EnvSpec:
        if tag in self.custom_envs:
            return self.custom_envs[tag]
        return EnvSpec(env_id=tag)

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
            old, new = getattr(published, name), getattr(self, name)
            if old != new:
                out.append(f"{name} {_short(old)} -> {_short(new)}")
        return out

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, *, source: str = "config", base_dir: Path | None = None,
                  warn: bool = True) -> RolloutConfig:
        """Validate a parsed config; unknown keys are dropped with one warning listing them.

        ROLL's `pretrain` and `actor_infer.generating_args` fill an openai policy block's
        defaults (`schemas.roll.policy_defaults`). `base_dir` (the config file's folder)
        resolves a python policy's relative file entrypoint; `warn=False` for a config already
        checked where it was written."""
        if data is None:
            raise ConfigError(f"{source}: the config is empty")
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping of config keys at the top level, "
                              f"got a {type(data).__name__}")
        data, unused, filled_from = policy_defaults(data)
        cleaned, unknown = _drop_unknown(data)
        unknown += unused
        if unknown and warn:
            logger.warning("%s: ignoring unknown config keys: %s%s", source, ", ".join(unknown),
                           _policy_hint(data))
        try:
            config = cls.model_validate(cleaned)
        except ValidationError as exc:
            raise ConfigError(f"{source}: {_describe(exc, filled_from)}") from None
        if base_dir is not None and isinstance(config.policy, PythonPolicyConfig):
            object.__setattr__(config, "policy", config.policy.resolved(base_dir))
        val = config.val_env_manager
        if warn and val is not None and val.group_size > 1:
            logger.warning("%s: val_env_manager.group_size is %d; 1 is usual for validation "
                           "(temperature 0 gives identical answers within a group)",
                           source, val.group_size)
        return config

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
            raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
        if needs_composition(data):
            data = compose(path)
        return cls.from_dict(data, source=str(path), base_dir=path.resolve().parent)

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
        return yaml.dump(data, Dumper=_ShowDumper, sort_keys=False, allow_unicode=True,
                         width=100)

    def to_json(self) -> str:
        """The config as published in Redis: everything but `redis_url` (producers are
        already connected, and a URL can hold a password)."""
        return self.model_dump_json(exclude={"redis_url"})


class _ShowDumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (agent templates) as literal blocks."""


def _show_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ShowDumper.add_representer(str, _show_str)


def _check_multiple(field: str, size: int, manager: EnvManagerConfig, name: str) -> None:
    if size % manager.group_size:
        raise ValueError(
            f"{field} {size} is not a multiple of {name}.group_size {manager.group_size}"
        )


def _is_gym_id(tag: str) -> bool:
    from gymnasium.envs.registration import registry

    return tag in registry


# Keys each section understands; anything else in a ROLL YAML is ignored with a warning.
_MANAGER_KEYS = set(EnvManagerConfig.model_fields)
_SPEC_KEYS = set(EnvSpec.model_fields)


def _drop_unknown(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    known_top = set(RolloutConfig.model_fields)
    unknown = [_named(str(k), known_top) for k in data if k not in known_top]
    cleaned = {k: v for k, v in data.items() if k in known_top}
    for section in ("train_env_manager", "val_env_manager"):
        cleaned[section] = _drop_section(cleaned, section, _MANAGER_KEYS, unknown)
    policy = cleaned.get("policy")
    if isinstance(policy, dict):
        known = policy_known_keys(policy)
        if known is not None:
            cleaned["policy"] = _drop_section(cleaned, "policy", known, unknown)
    envs = cleaned.get("custom_envs")
    if isinstance(envs, dict):
        by_key: dict[str, list[str]] = {}
        for tag, spec in envs.items():
            if isinstance(spec, dict):
                for key in spec:
                    if key not in _SPEC_KEYS:
                        by_key.setdefault(str(key), []).append(str(tag))
        unknown.extend(_tag_keys(by_key, len(envs)))
        cleaned["custom_envs"] = {
            tag: {k: v for k, v in spec.items() if k in _SPEC_KEYS}
            if isinstance(spec, dict) else spec
            for tag, spec in envs.items()
        }
    return {k: v for k, v in cleaned.items() if v is not None}, unknown


def _tag_keys(by_key: dict[str, list[str]], num_tags: int) -> list[str]:
    """Ignored per-tag keys, each named once: `custom_envs.FrozenLake.key` for one tag,
    `custom_envs.{A,B}.key` for several, `custom_envs.*.key` for every tag."""
    out = []
    for key, tags in by_key.items():
        if len(tags) == 1:
            out.append(f"custom_envs.{tags[0]}.{key}")
        elif len(tags) == num_tags:
            out.append(f"custom_envs.*.{key}")
        else:
            out.append(f"custom_envs.{{{','.join(tags)}}}.{key}")
    return out


def _policy_hint(data: dict[str, Any]) -> str:
    """Why ROLL's model and sampling keys went unused, when they did."""
    if not any(key in data for key in POLICY_SOURCES):
        return ""
    return (" (pretrain and actor_infer.generating_args set the model and sampling of a "
            "`policy: {type: openai, base_urls: [...]}` block; this config's policy is not "
            "openai)")


def _drop_section(
    parent: dict[str, Any], key: str, known: set[str], unknown: list[str], label: str = ""
) -> Any:
    section = parent.get(key)
    if not isinstance(section, dict):
        return section
    label = label or key
    unknown.extend(f"{label}.{_named(str(k), known)}" for k in section if k not in known)
    return {k: v for k, v in section.items() if k in known}


def _named(key: str, known: set[str]) -> str:
    """An unknown key as the warning names it, with the known key it is a typo of if one is
    that close (`rollout_batch_sise (did you mean rollout_batch_size?)`)."""
    if key in ROLL_NOT_TYPOS:
        return key
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.85)
    return f"{key} (did you mean {close[0]}?)" if close else key


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a key given twice in one mapping: PyYAML keeps the last
    without a word, so `seed: 1` ... `seed: 2` would run with 2 and nobody would know."""


MERGE_TAG = "tag:yaml.org,2002:merge"


def _unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode,
                    deep: bool = False) -> dict[Any, Any]:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG:  # `<<: *base`: keys after it override, by design
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            line = first_line.setdefault(key, key_node.start_mark.line)
        except TypeError:  # an unhashable key: SafeLoader names that problem itself
            break
        if line != key_node.start_mark.line:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice (first at line {line + 1})",
                key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (PyYAML's own text spans lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def _describe(exc: ValidationError, filled_from: dict[str, str] | None = None) -> str:
    """Pydantic errors as `field.path: message`, joined by '; '. `filled_from`: policy keys
    that came from elsewhere in the file (ROLL's keys), named as the user wrote them."""
    filled = filled_from or {}
    lines = []
    for err in exc.errors():
        parts = [str(part) for part in err["loc"]]
        if parts[:1] == ["policy"] and len(parts) > 1 and parts[1] in POLICY_TYPES:
            del parts[1]  # the union's tag, not a key of the user's file
        if len(parts) == 2 and parts[0] == "policy" and parts[1] in filled:
            parts = [f"{filled[parts[1]]} (policy.{parts[1]})"]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "union_tag_invalid":
            parts.append("type")
            msg = (f"{err['input'].get('type')!r} is not one of "
                   f"{', '.join(POLICY_TYPES)}")
        loc = ".".join(parts)
        lines.append(f"{loc}: {msg}" if loc else msg)
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


def _short(value: Any) -> str:
    """A config value in a message: models as their set fields, compactly."""
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(exclude_defaults=True), separators=(",", ":"))
    return str(value)
