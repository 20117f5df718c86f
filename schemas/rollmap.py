"""What a config file's keys become, before the models validate them.

A file is rollstream's own config, a ROLL agentic pipeline file, or both (a ROLL file and a
`policy:` block). `translate`:
1. refuses a used tag whose env type, env manager or tool rollstream cannot run
   (`schemas.envtypes`), with one line naming it and what it would need;
2. sorts every key (`schemas.rollkeys`): rollstream's own are kept; ROLL's others, Hydra's
   and the file's variables are set aside (returned, for a DEBUG line); anything else is
   unknown and refused, with "did you mean" where a known key is close;
3. turns ROLL's keys that decide the LLM policy into the policy block's: `pretrain` is its
   `model`, the `generating_args` blocks and `sequence_length` its `sampling`
   (`schemas.sampling`, ROLL's precedence), `skip_mock_system_prompt` its own. A file whose
   policy is not `openai` has no use for them: they are set aside.
`custom_envs` entries that no env manager uses are not looked at here (the model drops them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from schemas.envtypes import (
    env_type_support,
    manager_of,
    refusal,
    tool_support,
)
from schemas.errors import ConfigError
from schemas.manager import EnvManagerConfig
from schemas.policy import policy_known_keys
from schemas.rollkeys import (
    ROLL_ENV_MANAGER,
    ROLL_EXAMPLE_VARIABLES,
    ROLL_GENERATING_ARGS,
    ROLL_LAUNCHER,
    ROLL_TAG_KEYS,
    ROLL_TOP_LEVEL,
    ROLL_WORKER,
    KeySort,
)
from schemas.sampling import ROLL_FIELDS, RollSampling, check_roll_block
from schemas.sampling import resolve as resolve_sampling
from schemas.tagspec import TagSpec

MANAGERS = ("train_env_manager", "val_env_manager")
# ROLL's top-level keys that become the policy block's
POLICY_KEYS = ("pretrain", "actor_infer", "sequence_length", "prompt_length", "response_length",
               "skip_mock_system_prompt")
_READ_ARGS = set(ROLL_FIELDS) | {"num_beams"}  # generating_args keys the sampling reads


@dataclass
class Translated:
    data: dict[str, Any]  # what the models validate
    set_aside: list[str] = field(default_factory=list)  # dotted keys, for a DEBUG line
    named: dict[str, str] = field(default_factory=dict)  # policy key -> the key as written


def translate(data: dict[str, Any], ours: Iterable[str], source: str,
              variables: Iterable[str] = ()) -> Translated:
    """`data` (a parsed or composed file) as the models take it; `ours`: the top-level fields
    of rollstream's config; `variables`: top-level keys the file's interpolations refer to.
    Raises `ConfigError` (one line, starting with `source`) for what is refused."""
    ours = set(ours)
    check_used_tags(data, source)
    sort = KeySort()
    variables = (set(variables) | ROLL_EXAMPLE_VARIABLES) - ours
    set_aside = (ROLL_TOP_LEVEL | ROLL_LAUNCHER | variables) - ours - set(POLICY_KEYS)
    out = sort.section(data, "", ours, set_aside, keep=POLICY_KEYS)
    roll = RollSampling()
    for name in MANAGERS:
        if name in out:
            out[name], args = _manager(sort, out[name], name)
            roll = _with(roll, name, args)
    infer = sort.section(out.pop("actor_infer", None), "actor_infer.", {"generating_args"},
                         ROLL_WORKER)
    if isinstance(infer, dict):
        roll = _with(roll, "actor_infer", _generating_args(sort, infer.get("generating_args"),
                                                           "actor_infer.generating_args"))
    elif infer is not None:
        raise ConfigError(f"{source}: actor_infer: expected a mapping, got "
                          f"{type(infer).__name__}")
    _tag_keys(sort, out)
    policy = out.get("policy")
    if isinstance(policy, dict):
        known = policy_known_keys(policy)
        if known is not None:
            out["policy"] = policy = sort.section(policy, "policy.", known)
    if sort.unknown:
        plural = "s" if len(sort.unknown) > 1 else ""
        raise ConfigError(f"{source}: unknown config key{plural} {', '.join(sort.unknown)}")
    lengths = {k: out.pop(k, None) for k in ("sequence_length", "prompt_length",
                                             "response_length")}
    roll = replace(roll, **lengths)
    top = {k: out.pop(k, None) for k in ("pretrain", "skip_mock_system_prompt")}
    # a key given as null is a key left out (as before ROLL's keys were read)
    result = Translated({k: v for k, v in out.items() if v is not None}, sort.set_aside)
    if isinstance(policy, dict) and policy.get("type") == "openai":
        _fill_policy(result, policy, roll, top)
    else:
        result.set_aside += [k for k, v in {**top, **lengths}.items() if v is not None]
        result.set_aside += [f"{where}" for where, args in _blocks(roll) if args is not None]
    return result


def check_used_tags(data: dict[str, Any], source: str) -> None:
    """Refuse a used tag's env type, env manager or tool that rollstream cannot run."""
    envs = data.get("custom_envs")
    if not isinstance(envs, dict):
        return
    for tag in used_tags(data):
        entry = envs.get(tag)
        if not isinstance(entry, dict):
            continue
        env_type = entry.get("env_type")
        if isinstance(env_type, str) and not entry.get("env_id"):
            support = env_type_support(env_type)
            if not support.accepted:
                raise ConfigError(f"{source}: {refusal('env type', env_type, tag, support)}")
        path = entry.get("env_manager_cls")
        if isinstance(path, str):
            manager = manager_of(path)
            if not manager.support.accepted:
                name = path.rsplit(".", 1)[-1]
                raise ConfigError(f"{source}: {refusal('env manager', name, tag, manager.support)}")
        wrapper = entry.get("tool_wrapper")
        configs = wrapper.get("tool_configs") if isinstance(wrapper, dict) else None
        for tool in configs if isinstance(configs, list) else ():
            tool_id = tool.get("tool_id") if isinstance(tool, dict) else None
            if isinstance(tool_id, str) and not tool_support(tool_id).accepted:
                raise ConfigError(f"{source}: "
                                  f"{refusal('tool', tool_id, tag, tool_support(tool_id))}")


def used_tags(data: dict[str, Any]) -> list[str]:
    """The tags the env managers of a parsed config use, in order, each once."""
    tags: dict[str, None] = {}
    for name in MANAGERS:
        manager = data.get(name)
        listed = manager.get("tags") if isinstance(manager, dict) else None
        if isinstance(listed, list):
            tags.update((str(tag), None) for tag in listed)
    return list(tags)


def _manager(sort: KeySort, manager: Any, name: str) -> tuple[Any, dict[str, Any] | None]:
    """An env manager's section with ROLL's other keys set aside, and its generating_args."""
    kept = sort.section(manager, f"{name}.", EnvManagerConfig.model_fields, ROLL_ENV_MANAGER,
                        keep={"generating_args"})
    if not isinstance(kept, dict):
        return kept, None
    args = _generating_args(sort, kept.pop("generating_args", None),
                            f"{name}.generating_args")
    return kept, args


def _generating_args(sort: KeySort, args: Any, where: str) -> dict[str, Any] | None:
    check_roll_block(args, where)
    if args is None:
        return None
    return sort.section(args, f"{where}.", _READ_ARGS, ROLL_GENERATING_ARGS)


def _with(roll: RollSampling, name: str, args: dict[str, Any] | None) -> RollSampling:
    if name == "train_env_manager":
        return replace(roll, train=args)
    if name == "val_env_manager":
        return replace(roll, val=args)
    return replace(roll, actor_infer=args)


def _blocks(roll: RollSampling) -> list[tuple[str, dict[str, Any] | None]]:
    return [("actor_infer.generating_args", roll.actor_infer),
            ("train_env_manager.generating_args", roll.train),
            ("val_env_manager.generating_args", roll.val)]


def _tag_keys(sort: KeySort, data: dict[str, Any]) -> None:
    """Sort the keys of the used tags' custom_envs entries (unused ones are never built)."""
    envs = data.get("custom_envs")
    if not isinstance(envs, dict):
        return
    ours = set(TagSpec.model_fields)
    used = used_tags(data)
    sort.set_aside += [f"custom_envs.{tag} (no env manager uses it)" for tag in envs
                       if str(tag) not in used]
    for tag in used:
        entry = envs.get(tag)
        if isinstance(entry, dict):
            envs[tag] = sort.section(entry, f"custom_envs.{tag}.", ours, ROLL_TAG_KEYS)


def _fill_policy(result: Translated, policy: dict[str, Any], roll: RollSampling,
                 top: dict[str, Any]) -> None:
    """ROLL's model, sampling and system-prompt flag as the openai block's, the block's own
    keys winning; `result.named` learns what each filled key was called in the file."""
    if top["pretrain"] is not None and "model" not in policy:
        policy["model"] = top["pretrain"]
        result.named["model"] = "pretrain"
    flag = top["skip_mock_system_prompt"]
    if flag is not None and "skip_mock_system_prompt" not in policy:
        policy["skip_mock_system_prompt"] = flag
        result.named["skip_mock_system_prompt"] = "skip_mock_system_prompt"
    sampling = resolve_sampling(policy, roll)
    for key in list(policy):
        if key in ("temperature", "val_temperature", "top_p", "top_k", "max_tokens"):
            del policy[key]
    policy["sampling"] = sampling
    for key, where in sampling["sources"].items():
        if not where.startswith(("rollstream default", "ROLL default", "policy.")):
            result.named[f"sampling.{key}"] = where.split(" ", 1)[0]
