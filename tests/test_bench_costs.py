"""bench/bench_costs.py's cap: what the parts measured alone allow the pipeline's ratio to be."""

from __future__ import annotations

import pytest
from helpers import load_bench


@pytest.mark.parametrize("bare, parts", [(37.7, 109.7), (45.0, 80.0)])
def test_the_cap_is_what_the_parts_allow_with_every_core_busy(bare, parts):
    bench = load_bench("bench_costs")
    cap, needed = bench.parts_cap(bare, parts, cores=2)
    # two cores each finishing a trajectory every `parts` us, against one every `bare` us
    assert cap == pytest.approx((2 / parts) / (1 / bare))
    # parts that cost what 0.8x needs would give exactly 0.8x
    assert bench.parts_cap(bare, needed, cores=2)[0] == pytest.approx(0.8)
    assert bench.parts_cap(bare, parts, cores=4)[0] == pytest.approx(2 * cap)
