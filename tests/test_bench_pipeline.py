"""bench/bench_pipeline.py's CPU budget: what the CPU per trajectory allows the ratio to be."""

from __future__ import annotations

import pytest
from helpers import load_bench


@pytest.mark.parametrize("plain, spent, traj_s", [(22_000, 0.120, 15_500), (9_000, 0.25, 7_000)])
def test_the_budget_is_the_cpu_at_which_the_pipeline_reaches_the_target(plain, spent, traj_s):
    bench = load_bench("bench_pipeline")
    busy, cap, budget = bench.cpu_budget(traj_s, plain, spent, cores=2)
    assert busy == pytest.approx(traj_s * spent / 1000)
    # spending `budget` per 1000 on as many busy cores, the pipeline delivers 0.8x
    assert busy * 1000 / budget / plain == pytest.approx(0.8)
    # with every core busy at the CPU it spent, it would deliver the cap
    assert 2 * 1000 / spent / plain == pytest.approx(cap)
    # what it delivered is the cap scaled by the cores it kept busy
    assert traj_s / plain == pytest.approx(cap * busy / 2)
    assert bench.cpu_budget(traj_s, plain, spent, cores=2, target=0.4)[2] == \
        pytest.approx(2 * budget)


def test_a_round_whose_plain_loop_moved_is_flagged():
    bench = load_bench("bench_pipeline")
    assert bench.drift_note(22_000, 23_000) is None  # 4%: the machine held still
    note = bench.drift_note(16_955, 24_266)  # a round seen on 2026-11-25
    assert note is not None and "35%" in note and "unreliable" in note
    assert bench.drift_note(24_266, 16_955) == note  # either direction
