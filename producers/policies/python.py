"""A user's own policy, built by the factory a config's `entrypoint` names.

`entrypoint` is `package.module:factory` (imported from `sys.path`: the producer's working
folder and PYTHONPATH) or `path/to/file.py:factory` (loaded from that file; a relative path
was resolved against the config file's folder when the config was read). The block's other
keys are the factory's keyword arguments (but `llm`: the model servers of the policy's own
agent loop, `producers.policies.agent`). Anything that goes wrong here is a `PolicyError`
of one line naming the entrypoint, and the producer exits 1 with it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from producers.policies.protocol import Policy, one_line
from schemas.errors import PolicyError
from schemas.policy import PythonPolicyConfig


def find_factory(config: PythonPolicyConfig) -> Callable[..., Any]:
    """Import the entrypoint's module and return its factory, without calling it (`rollstream
    config check` looks with this)."""
    entrypoint = config.entrypoint
    target, _, attr = entrypoint.rpartition(":")
    module = _load_module(entrypoint, target)
    factory = getattr(module, attr, None)
    if factory is None:
        raise PolicyError(f"policy.entrypoint {entrypoint!r}: module {target!r} has no "
                          f"attribute {attr!r}")
    if not callable(factory):
        raise PolicyError(f"policy.entrypoint {entrypoint!r}: {attr!r} is a "
                          f"{type(factory).__name__}, not a callable factory")
    return factory  # type: ignore[no-any-return]


def load_python_policy(config: PythonPolicyConfig) -> Policy:
    """Import the entrypoint's module, call its factory with the block's other keys."""
    entrypoint = config.entrypoint
    factory = find_factory(config)
    try:
        policy = factory(**config.kwargs)
    except Exception as exc:
        raise PolicyError(f"policy.entrypoint {entrypoint!r}: the factory raised "
                          f"{one_line(exc)}") from None
    if not callable(getattr(policy, "act", None)):
        raise PolicyError(f"policy.entrypoint {entrypoint!r}: the factory returned a "
                          f"{type(policy).__name__} without an act method")
    return policy  # type: ignore[no-any-return]


def _load_module(entrypoint: str, target: str) -> ModuleType:
    if target.endswith(".py"):
        return _load_file(entrypoint, Path(target))
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (target == exc.name or target.startswith(exc.name + ".")):
            raise PolicyError(f"policy.entrypoint {entrypoint!r}: no module named "
                              f"{exc.name!r} (is its folder on PYTHONPATH?)") from None
        raise PolicyError(f"policy.entrypoint {entrypoint!r}: importing {target!r} failed: "
                          f"{one_line(exc)}") from None
    except Exception as exc:
        raise PolicyError(f"policy.entrypoint {entrypoint!r}: importing {target!r} failed: "
                          f"{one_line(exc)}") from None


def _load_file(entrypoint: str, path: Path) -> ModuleType:
    """Load a policy file as a module of its own (its folder is importable from it)."""
    path = path.resolve()
    if not path.is_file():
        raise PolicyError(f"policy.entrypoint {entrypoint!r}: no file {str(path)!r}")
    # a stable, unique module name per file, so two policy.py files never collide
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"rollstream_policy_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PolicyError(f"policy.entrypoint {entrypoint!r}: cannot load {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the file may import its neighbours
    sys.modules[name] = module  # dataclasses and typing look a class's module up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise PolicyError(f"policy.entrypoint {entrypoint!r}: loading {str(path)!r} failed: "
                          f"{one_line(exc)}") from None
    return module
