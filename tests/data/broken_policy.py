"""A policy module whose import fails: it needs a package that is not installed."""

import rollstream_no_such_dependency  # noqa: F401


def make() -> None:
    return None
