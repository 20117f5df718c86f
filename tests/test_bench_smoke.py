"""Each benchmark runs end to end at its smallest size (figures come from the full runs).

A measurement window of `--seconds 0` (and the like) is the least work that prints every
line: each such loop measures at least one batch, episode or step whatever its time, so the
smoke size counts events, not what a second holds on this machine."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT, clean_env

pytestmark = pytest.mark.slow


def bench(*args: str, timeout: float = 180) -> str:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=clean_env(),
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_bench_async_prints_a_row_with_speedup_and_bound():
    out = bench("bench/bench_async.py", "--steps", "1", "--groups", "2", "--group-size", "2",
                "--envs-per-shard", "4", "--producers", "1", "--latency-s", "0.005")
    rows = [line for line in out.splitlines() if line.startswith("| 4 | 1 |")]
    assert len(rows) == 1 and rows[0].count("x") >= 3, out


def test_bench_env_reset_prints_each_tag():
    out = bench("bench/bench_env_reset.py", "--seeds", "20", "--step-seconds", "0")
    for tag in ("SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab", "FrozenLake"):
        assert tag in out


def test_bench_pipeline_prints_a_ratio():
    out = bench("bench/bench_pipeline.py", "--seconds", "0", "--producers", "1",
                "--warmup-batches", "0")
    assert "x" in out and "traj/s" in out, out
    assert "cores busy" in out and "0.8x needs" in out, out


def test_bench_pipeline_compares_recording():
    out = bench("bench/bench_pipeline.py", "--seconds", "0", "--producers", "1",
                "--warmup-batches", "0", "--record", "both")
    assert "record on / off:" in out and "bytes of Parquet per trajectory" in out, out


def test_bench_handoff_prints_percentiles():
    out = bench("bench/bench_handoff.py", "--batches", "1", "--warmup-batches", "0",
                "--producers", "1")
    assert "hand-off, batch 1024" in out and "p99" in out, out


def test_bench_scale_prints_each_part():
    out = bench("bench/bench_scale.py", "--seconds", "0", "--counts", "1", "--envs", "256",
                "--big-envs", "256", "--latency-s", "0.005")
    assert "1 producer(s)" in out and "event-loop lag" in out and "bytes" in out, out


def test_bench_valmix_prints_each_tag_and_the_round():
    out = bench("bench/bench_valmix.py", "--seconds", "0", "--rounds", "1", "--warmup-rounds", "0",
                "--producers", "1")
    for tag in ("SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab", "FrozenLake"):
        assert f"| {tag} |" in out, out
    assert "pipeline / plain:" in out, out


def test_bench_llm_prints_turns_and_cpu_per_turn():
    out = bench("bench/bench_llm.py", "--seconds", "0", "--latency-s", "0.01",
                "--warmup-batches", "0", "--groups", "4", timeout=240)
    assert "turns/s" in out and "per turn" in out, out


def test_bench_replicas_prints_both_settings():
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("needs a redis-server on PATH")
    out = bench("bench/bench_replicas.py", "--seconds", "0", "--repeat", "1",
                "--producers", "1", "--commits", "50", "--warmup-batches", "0", timeout=240)
    assert "min_replicas 0" in out and "min_replicas 1" in out, out


def test_bench_costs_prints_each_part():
    out = bench("bench/bench_costs.py", "--rounds", "1", "--seconds", "1", "--episodes", "50",
                "--trainer-batches", "1")
    for part in ("episode code:", "producer alone:", "trainer alone:", "decode:",
                 "parts alone:"):
        assert part in out, out
    assert "us per trajectory" in out, out


def test_bench_group_filters_prints_a_row_per_step_size():
    out = bench("bench/bench_group_filters.py", "--steps", "2", "--groups", "4", "8")
    rows = [line for line in out.splitlines() if line.startswith(("| 4 (1x)", "| 8 (2x)"))]
    assert len(rows) == 2 and all(row.count("|") == 8 for row in rows), out


def test_bench_openenv_prints_cpu_per_remote_step_and_many_envs():
    import importlib.util
    if importlib.util.find_spec("openenv") is None:
        pytest.skip("needs openenv-core (the openenv-server extra)")
    out = bench("bench/bench_openenv.py", "--servers", "1", "--envs", "20", "--few", "4",
                "--seconds", "0", "--warmup-seconds", "0", "--local-seconds", "0")
    assert "us per remote step" in out and "remote/local" in out, out
    assert "20 remote envs on one producer" in out and "sessions open" in out, out


def test_bench_tools_prints_cpu_per_call_and_sandbox_start_cost():
    out = bench("bench/bench_tools.py", "--episodes", "8", "--calls", "3", "--concurrency", "4")
    assert "| python tool (sandbox) | 8 |" in out and "| bare python -I -c pass |" in out, out


def test_bench_partial_prints_the_discarded_tokens_ratios():
    out = bench("bench/bench_partial.py", "--steps", "1", "--groups", "2", "--latency-s",
                "0.005", "--load-time-s", "0.02", "--parallel")
    for arm in ("keep", "abort", "resume"):
        assert f"| async, token-in/token-out, in_flight {arm} |" in out, out
    assert "keep / abort:" in out and "resume / abort:" in out, out
    assert "| async, token-in/token-out, in_flight keep, async_carry_over 1 |" in out, out
    assert "keep with async_carry_over 1 / keep:" in out, out
    assert "carry-over / on-policy:" in out and "an update holds generation" in out, out
