"""bench/bench_tito.py runs end to end for a second or two (figures come from full runs)."""

from __future__ import annotations

import pytest
from test_bench_smoke import bench

pytestmark = pytest.mark.slow
pytest.importorskip("tokenizers")


def test_bench_tito_prints_both_ways_and_the_ratio():
    out = bench("bench/bench_tito.py", "--seconds", "2", "--latency-s", "0.01",
                "--warmup-batches", "0", "--groups", "4", timeout=240)
    assert "chat requests:" in out and "token-in/token-out:" in out, out
    assert "ratio token-in/token-out / chat:" in out, out
