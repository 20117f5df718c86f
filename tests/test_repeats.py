"""Warnings that repeat: one line per kind per interval, with a count of the ones held back,
for the producer's failed episodes and the batcher's dropped groups."""

from __future__ import annotations

import logging

from helpers import broken_group_config

from consumer import Batcher
from schemas.repeats import Repeats


def test_a_kind_is_logged_once_per_interval_with_the_count_held_back(caplog) -> None:
    now = [100.0]
    repeats = Repeats(logging.getLogger("test.repeats"), every_s=30.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="test.repeats")
    assert repeats.warning("env 3 (Broken) episode 7 failed: boom")
    for env in range(4, 9):  # the same kind: numbers differ
        now[0] += 1
        assert not repeats.warning(f"env {env} (Broken) episode 7 failed: boom")
    assert repeats.warning("env 3 (Lake) episode 7 failed: boom")  # another kind
    now[0] = 131.0
    assert repeats.warning("env 9 (Broken) episode 8 failed: boom")
    assert [r.getMessage() for r in caplog.records] == [
        "env 3 (Broken) episode 7 failed: boom",
        "env 3 (Lake) episode 7 failed: boom",
        "env 9 (Broken) episode 8 failed: boom (5 more like it in the last 31s not logged)",
    ]


def test_an_env_that_always_raises_is_not_a_line_per_episode(r, run, producer_thread,
                                                             caplog) -> None:
    """Group 3 is an env whose every step raises (two attempts per episode): its 4 members
    failed an episode each time it was admitted, 2+ groups were dropped, each a
    warning line of the same words; an audit saw 732 such lines in 20 s."""
    config = broken_group_config(rollout_batch_size=12, env_max_retries=1,
                                 async_generation_ratio=1)
    batcher = Batcher(r, config, run=run)
    caplog.set_level(logging.WARNING)
    producer_thread()
    failed = 0
    # a failed trajectory the batcher reads only after its episode expired counts as stale,
    # not failed (the FrozenLake groups may finish their step first): ask until two groups
    # were dropped as failed, however the reads fall
    for _ in range(20):
        batch = batcher.get_batch("train", timeout_s=30)
        failed += batch.metrics["scheduler/failed_groups"]
        batcher.ack(batch)
        batcher.publish_version()
        if failed >= 2:
            break
    lines = [r.getMessage() for r in caplog.records]
    raised = [m for m in lines if "(Broken) episode" in m and "raised on attempt" in m]
    dropped = [m for m in lines if m.startswith("dropping group")]
    assert failed >= 2
    assert len(raised) == 1 and raised[0].endswith("RuntimeError: broken on purpose")
    assert len(dropped) == 1 and "broken on purpose" in dropped[0]
