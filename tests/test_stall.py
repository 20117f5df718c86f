"""A blocked event loop is noticed and named (producers/stall.py): a policy's `act` or an
env's step that blocks holds every env of its producer and its lease heartbeat."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from helpers import small_config, wait_for

from consumer import Batcher
from producers import stall
from producers.stall import LoopWatch, describe_stack, stall_threshold_s
from rollstream.status.snapshot import snapshot
from schemas.keys import Keys

DATA = Path(__file__).parent / "data"


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a synchronous HTTP call in an async `act` does


def watched(blocks: list[float], *, threshold_s: float = 0.2, lease_ttl_s: float = 30.0,
            settle_s: float = 0.3) -> tuple[LoopWatch, list[tuple[float, str]]]:
    """Run a loop under a `LoopWatch` that blocks for each of `blocks` in turn (letting it
    run `settle_s` around each); returns the watch and what `on_stall` was told."""
    told: list[tuple[float, str]] = []

    async def main() -> LoopWatch:
        watch = LoopWatch(threshold_s, name="p1", lease_ttl_s=lease_ttl_s,
                          on_stall=lambda s, where: told.append((s, where)))
        watch.start()
        try:
            for seconds in blocks:
                await asyncio.sleep(settle_s)
                hold_the_loop(seconds)
            await asyncio.sleep(settle_s)
        finally:
            watch.stop()
        return watch

    return asyncio.run(main()), told


def stall_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "producers.stall" and "has been blocked" in r.getMessage()]


def test_a_blocked_loop_is_warned_about_naming_the_code_that_blocks_it(caplog):
    caplog.set_level(logging.WARNING)
    watch, told = watched([0.7])
    warned = stall_warnings(caplog)
    assert len(warned) == 1, caplog.text
    assert "test_stall.py" in warned[0] and "in hold_the_loop" in warned[0]
    assert "asyncio" not in warned[0]  # the standard library's frames are left out
    assert watch.stalls == 1 and 0.5 <= watch.longest_s < 2.0
    assert len(told) == 1 and "hold_the_loop" in told[0][1]


def test_a_loop_that_is_never_blocked_long_is_not_warned_about(caplog):
    caplog.set_level(logging.WARNING)
    watch, told = watched([0.01, 0.01], threshold_s=1.0)
    assert watch.stalls == 0 and not told and not stall_warnings(caplog)


def test_every_stall_is_counted_and_the_warning_is_not_repeated_at_once(caplog):
    caplog.set_level(logging.WARNING)
    watch, told = watched([0.6, 0.6])
    assert watch.stalls == 2 and len(told) == 2
    assert len(stall_warnings(caplog)) == 1, caplog.text


def test_a_stall_past_the_lease_ttl_says_the_shards_go_elsewhere(caplog):
    caplog.set_level(logging.WARNING)
    watched([1.2], threshold_s=0.1, lease_ttl_s=0.6)
    text = caplog.text
    assert "past the lease ttl (0.6s)" in text and "hold_the_loop" in text
    assert "ran again after" in text


def test_the_threshold_is_two_seconds_or_a_missed_heartbeat():
    assert stall_threshold_s(10.0) == stall.STALL_WARN_S == 2.0
    assert stall_threshold_s(1.5) == 0.5


def test_the_lines_of_a_held_back_stall_are_held_back_too(caplog):
    """A policy blocking on every step: its stalls' "past the lease ttl" and "ran again"
    lines bypassed the 30 s limit (a warning every ~6 s)."""
    caplog.set_level(logging.WARNING)
    watch, _ = watched([0.9, 0.9], threshold_s=0.1, lease_ttl_s=0.5)
    assert watch.stalls == 2
    assert caplog.text.count("past the lease ttl") == 1, caplog.text
    assert caplog.text.count("ran again after") == 1


def test_describe_stack_skips_the_standard_librarys_frames():
    import json

    seen: list[str] = []

    def hook(obj: dict) -> dict:
        import sys
        seen.append(describe_stack(sys._getframe()))
        return obj

    json.loads('{"a": 1}', object_hook=hook)  # called from json/decoder.py
    assert seen[0].startswith("test_stall.py:") or "tests/test_stall.py:" in seen[0]
    assert "in hook" in seen[0] and "json" not in seen[0].split(" < ")[1]


def test_a_producer_whose_policy_blocks_says_where_in_its_log_status_and_metrics(
        r, run, monkeypatch, caplog, producer_thread):
    monkeypatch.syspath_prepend(str(DATA))
    config = small_config(policy={"type": "python", "entrypoint": "toy_policies:make_stalling",
                                  "block_s": 1.2})  # lease ttl 1.5 s: threshold 0.5 s
    Batcher(r, config, run=run)
    caplog.set_level(logging.WARNING)
    thread = producer_thread()
    wait_for(lambda: stall_warnings(caplog), timeout_s=20)
    assert "toy_policies.py" in stall_warnings(caplog)[0]
    assert "in act" in stall_warnings(caplog)[0]
    snap = wait_for(lambda: (s := snapshot(r, Keys(run), config)) and any(
        "its event loop was blocked" in w for w in s["warnings"]) and s, timeout_s=20)
    producer = snap["producers"][0]
    assert producer["loop_stalls"] == 1 and producer["recent_stall_longest_s"] >= 0.6
    assert "toy_policies.py" in producer["recent_stall_where"]
    families = {f.name: f for f in thread.producer.stats.families()}
    assert families["rollstream_event_loop_stalls"].samples[0].value == 1
    assert families["rollstream_event_loop_stalled_seconds"].samples[0].value >= 0.6
    assert thread.stop() == 0
