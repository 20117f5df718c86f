"""bench/bench_tito.py runs end to end at a small size (figures come from full runs).

`--seconds 0.5`: with no warm-up batch the first batch waits for the producer's start (about
a second), so each of the four runs (two rounds of both arms) measures one batch. Not 0:
bench_tito checks its window before the first batch."""

from __future__ import annotations

import pytest
from test_bench_smoke import bench

pytestmark = pytest.mark.slow
pytest.importorskip("tokenizers")


def test_bench_tito_alternates_the_arms_and_prints_the_medians_and_the_verdict():
    out = bench("bench/bench_tito.py", "--seconds", "0.5", "--latency-s", "0.01",
                "--warmup-batches", "0", "--groups", "4", "--repeat", "2", timeout=240)
    assert "chat requests:" in out and "token-in/token-out:" in out, out
    assert "ratio token-in/token-out / chat, median of 2 round(s):" in out, out
    assert out.count(" / ") >= 3 and "target: at most 1.11x" in out, out
