"""Which weights generated a turn: the version a `Turn` is labelled with once its server has
answered. Shared by the `openai` policy's turns and an agent's own calls
(`producers.policies.agent`), so both label alike.

In order: the version the server reported in its answer (SGLang's `weight_version`, vLLM's
`weight_versions`: source `server`), unless no record of the run names that server's version
and it is ahead of any version the run can have loaded (another run's weights, a launch
flag); else the version `{RUN}:servers` records for the server that answered (`recorded`;
with `version_end` when an update landed mid-turn); else the producer's acting version
(`producer`).
"""

from __future__ import annotations

from typing import Any

from producers.policies.protocol import Turn


def label_version(turn: Turn, answer: Any, acting_version: int, follows_run: bool) -> None:
    """Set `turn.version` and `turn.version_source` (see the module docstring). `answer` is
    the pool's `Answer` (its `version`, `version_end`); `follows_run`: the policy reads the
    run's records (it was started with a context)."""
    if (turn.version is not None and answer.version is None
            and turn.version > acting_version + 1 and follows_run):
        # reported by a server the run has no record of, and ahead of any version the run
        # can have loaded (one ahead: an update lands before its publish): another run's
        # weights or a launch flag, not one of this run's versions
        turn.version = turn.version_source = None
    if turn.version is None:  # the server did not say: what was recorded, else ours
        if answer.version is not None:
            turn.version, turn.version_source = answer.version, "recorded"
            if answer.version_end is not None and answer.version_end != answer.version:
                # updated mid-turn and no per-token spans: which tokens came from which
                # weights is unknown; every token keeps the oldest, the end is recorded
                turn.extra["version_end"] = answer.version_end
        else:
            turn.version, turn.version_source = acting_version, "producer"
