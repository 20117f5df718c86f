"""YAML in and out for configs: a loader that refuses a key given twice, one-line YAML
errors, and the dumper of `rollstream config show`."""

from __future__ import annotations

from typing import Any

import yaml


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


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (PyYAML's own text spans lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


class ShowDumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (agent templates) as literal blocks."""


def _show_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


ShowDumper.add_representer(str, _show_str)
