"""bench/bench_async.py times whole steps: as many stand-in updates as rollout waits."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import load_bench


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeBatcher:
    """get_batch takes `wait_s` of the fake clock (the first one, the warm-up, 50 s)."""

    def __init__(self, clock: FakeClock, wait_s: float) -> None:
        self.clock, self.wait_s = clock, wait_s
        self.calls: list[str] = []
        self.handed = 0

    def get_batch(self, mode: str, timeout_s: float) -> SimpleNamespace:
        self.clock.now += 50.0 if self.handed == 0 else self.wait_s
        self.handed += 1
        self.calls.append("get")
        return SimpleNamespace(metrics={"time/get_batch_cost": self.wait_s,
                                        "scheduler/staleness/max": 1,
                                        "scheduler/stale_dropped": 2.0})

    def ack(self, batch: SimpleNamespace) -> None:
        self.calls.append("ack")

    def publish_version(self) -> None:
        self.calls.append("publish")


def test_timed_steps_count_one_update_and_one_wait_per_step():
    bench = load_bench("bench_async")
    clock = FakeClock()
    batcher = FakeBatcher(clock, wait_s=0.25)

    def train() -> None:
        clock.now += 1.0
        batcher.calls.append("train")

    run = bench.timed_steps(batcher, 3, train, clock=clock)

    # 3 steps of 1.0 s training + 0.25 s waiting; the warm-up batch is not timed
    assert run.wall_s == 3 * (1.0 + 0.25)
    assert run.waits_s == [0.25] * 3
    assert run.staleness_max == 1 and run.stale_dropped == 6.0
    assert batcher.calls.count("train") == 3 and batcher.calls.count("get") == 4
    # every batch is acked, the last one untrained
    assert batcher.calls[-2:] == ["get", "ack"] and batcher.calls.count("ack") == 4
