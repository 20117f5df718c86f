"""The producer's control state: how waiting env tasks are woken (pure asyncio, no Redis)."""

from __future__ import annotations

import asyncio

import pytest
from helpers import small_config

from consumer import Batcher
from producers.control import SYNC_WAKE_CHUNK, WAKE_CHUNK, ControlState


@pytest.mark.parametrize("chunk", [WAKE_CHUNK, SYNC_WAKE_CHUNK])
def test_waiters_wake_in_chunks_with_other_work_between_and_none_is_lost(chunk: int):
    async def scenario() -> tuple[list[object], int]:
        state = ControlState(chunk)
        woke: list[object] = []

        async def env(i: int) -> None:
            await state.wait_change()
            woke.append(i)

        envs = [asyncio.create_task(env(i)) for i in range(3 * chunk + 5)]
        await asyncio.sleep(0)  # every env task is waiting now
        envs[1].cancel()  # a wait given up is skipped, the others still wake
        await asyncio.sleep(0)
        state.wake_all()
        # the committer, say: work that became ready right after the wake
        asyncio.get_running_loop().call_soon(woke.append, "other")
        passes = 0
        while len(woke) < len(envs):  # all but the cancelled one, plus "other"
            await asyncio.sleep(0)
            passes += 1
            assert passes < 100, woke
        return woke, passes

    woke, passes = asyncio.run(scenario())
    envs_woken = [w for w in woke if w != "other"]
    assert sorted(envs_woken) == [i for i in range(3 * chunk + 5) if i != 1]
    # the other work ran before the last chunk, not after every env had played
    assert woke.index("other") <= chunk + 1
    assert passes >= 4


@pytest.mark.parametrize(("ratio", "chunk"), [(0, SYNC_WAKE_CHUNK), (1, WAKE_CHUNK)])
def test_a_producer_wakes_its_envs_in_the_chunks_of_its_mode(r, run, producer_thread,
                                                              ratio: int, chunk: int):
    """Sync mode resumes every env at once for every batch: smaller chunks there."""
    batcher = Batcher(r, small_config(async_generation_ratio=ratio), run=run)
    thread = producer_thread()
    batcher.get_batch(timeout_s=30)  # the producer is serving: its control state exists
    assert thread.producer.state.wake_chunk == chunk
