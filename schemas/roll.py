"""ROLL's pipeline YAML, read the way ROLL's launcher reads it.

ROLL's launcher builds its config with Hydra's compose API (its config folder as the search
path, the file's name as the config name) and resolves it with OmegaConf
(`to_container(resolve=True)`). A file with a `defaults` list or `${...}` interpolation is
composed here the same way, with the file's own folder as the config dir: `defaults` entries
such as `../config/envs@_here_`, interpolation and `custom_envs: {X: ${custom_env.X}}` mean what
they mean to ROLL, and the file's own keys override its defaults (Hydra appends `_self_` last
when the list leaves it out). Plain files stay plain YAML and need none of this.

Hydra and OmegaConf are the optional extra `rollstream[roll]`. The compose API, unlike
`@hydra.main`, neither changes the working directory nor configures logging; a Hydra already
initialized in the calling process (a trainer under `@hydra.main`) is put back afterwards.

What the composed keys become (taken, set aside, refused) is `schemas.rollmap`'s business;
`compose` also returns the top-level names the file's interpolations refer to (its
variables, such as `max_actions_per_traj`), which are set aside rather than refused.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from schemas.errors import ConfigError

INSTALL_HINT = "pip install 'rollstream[roll]'"
ROLL_VERSION_BASE = "1.1"  # what Hydra assumes for ROLL's launcher, which names none

def needs_composition(data: Any) -> bool:
    """Whether a parsed file is one Hydra must compose: a top-level `defaults` list, or a
    `${...}` interpolation anywhere in it."""
    if isinstance(data, dict) and isinstance(data.get("defaults"), list):
        return True
    return _has_interpolation(data)


def _has_interpolation(node: Any) -> bool:
    if isinstance(node, str):
        return "${" in node
    if isinstance(node, dict):
        return any(_has_interpolation(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_interpolation(v) for v in node)
    return False


def compose(path: Path) -> tuple[dict[str, Any], frozenset[str]]:
    """The file composed and resolved as ROLL's launcher does, as a plain dict, and the
    top-level keys its interpolations refer to.

    Every failure is a one-line `ConfigError` naming the file and, where Hydra or OmegaConf
    says which, the key (a missing defaults file, an interpolation to nowhere)."""
    try:
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir
        from hydra.errors import Hydra14MigrationWarning, HydraException
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:
        raise ConfigError(f"{path}: a ROLL/Hydra config (a defaults list or ${{...}} "
                          f"interpolation) needs Hydra to compose it: {INSTALL_HINT}") from None
    if path.suffix != ".yaml":
        raise ConfigError(f"{path}: Hydra composes only files named *.yaml")
    config_dir = str(path.resolve().parent)
    try:
        with _own_global_hydra(), warnings.catch_warnings():
            # ROLL's files leave `_self_` out of their defaults; Hydra warns and puts it last,
            # which is what ROLL relies on
            warnings.filterwarnings("ignore", message=".*Defaults list is missing `_self_`")
            # ROLL's launcher gives no version_base, so Hydra composes with its 1.1 defaults;
            # so do we, without Hydra's note that 1.4 drops them
            warnings.filterwarnings("ignore", category=Hydra14MigrationWarning)
            with initialize_config_dir(config_dir=config_dir, version_base=ROLL_VERSION_BASE):
                cfg = hydra_compose(config_name=path.stem)
            variables = referenced_keys(OmegaConf.to_container(cfg, resolve=False))
            data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {_omegaconf_problem(exc)}") from None
    except HydraException as exc:
        raise ConfigError(f"{path}: {_hydra_problem(exc, config_dir)}") from None
    except ValueError as exc:  # Hydra's word on a defaults list of the wrong shape
        problem = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level")
    return {str(k): v for k, v in data.items()}, variables


_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


def referenced_keys(node: Any) -> frozenset[str]:
    """The top-level keys that `${...}` interpolations in `node` refer to: `${custom_env.X}`
    refers to `custom_env`; resolver calls (`${oc.env:HOME}`, `${now:%Y}`) and relative
    references (`${.x}`) to none."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            for body in _INTERPOLATION.findall(item):
                body = body.strip()
                if body and ":" not in body and not body.startswith("."):
                    found.add(re.split(r"[.\[]", body, maxsplit=1)[0])
    return frozenset(found)


@contextmanager
def _own_global_hydra() -> Iterator[None]:
    """Hydra's global state (the initialized instance, the version base) cleared for our
    compose and put back afterwards, so a caller that initialized Hydra itself keeps its own."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.version import VersionBase

    saved, saved_base = GlobalHydra.instance().hydra, VersionBase.instance().version_base
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        GlobalHydra.instance().hydra = saved
        VersionBase.instance().version_base = saved_base


def _omegaconf_problem(exc: Exception) -> str:
    """OmegaConf's error as `key: message` in one line (its own text spans lines)."""
    key = getattr(exc, "full_key", None)
    msg = getattr(exc, "msg", None) or _first_line(exc)
    msg = str(msg).splitlines()[0] if str(msg).strip() else type(exc).__name__
    return f"{key}: {msg}" if key else msg


_MISSING_DEFAULT = re.compile(r"In '([^']*)': Could not (?:load|find) '([^']*)'")


def _hydra_problem(exc: Exception, config_dir: str) -> str:
    """Hydra's error in one line naming the key: an interpolation error it wraps is OmegaConf's
    (`key: message`), a defaults entry that names no file is `defaults: ...`."""
    from omegaconf.errors import OmegaConfBaseException

    cause = exc.__cause__
    if isinstance(cause, OmegaConfBaseException):
        return _omegaconf_problem(cause)
    missing = _MISSING_DEFAULT.search(str(exc))
    if missing:
        where, entry = missing.groups()
        return (f"defaults: could not load {entry!r} (listed in {where!r}; paths are relative "
                f"to {config_dir})")
    return _first_line(exc)


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
