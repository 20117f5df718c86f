"""Producer CPU per turn with token-in/token-out (`policy.tokenizer`) against chat requests,
in one run: the same pipeline twice, the ratio printed.

    python bench/bench_tito.py [--seconds 20] [--groups 128] [--latency-s 1.0]
                               [--latency-sigma 0.5] [--repeat N] [--redis-url URL]

As `bench/bench_llm.py` (one `rollstream produce` process driving `--groups` x 8 FrozenLake
envs with the openai policy, a `rollstream fake-llm` process, an embedded Redis, a trainer
that acks and publishes at once), run first with chat requests and then with
`policy.tokenizer` set to the tokenizer scripts/tiny_model.py generates (the stand-in reads
the token-id prompts with the same tokenizer.json). Token-in/token-out adds the template's
rendering and encoding of each turn's new messages, and decoding the ids back is the
server's; chat requests carry the messages as JSON. CPU per turn is the producer's user +
system time over the turns the server answered meanwhile.

With `--repeat N` the two arms alternate N rounds (the first arm of a round alternates too, so
a machine that speeds up or slows down within the run weighs on both alike); the medians are
printed, of each arm's turns/s and CPU per turn and of the rounds' ratios. The target is a ratio
(`TARGET_RATIO`): token-in/token-out was to cost at most 0.5 ms per turn where chat requests
cost 0.45 ms, and this machine's CPU per turn drifts by more than that between runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import redis
from bench_llm import MODEL, ROOT, SEED_BLOCK, cpu_s, server_stats
from bench_pipeline import delete_run

from consumer import Batcher
from rollstream.embedded import EmbeddedRedis
from rollstream.launcher import start_producers, stop_processes
from schemas.config import RolloutConfig

TARGET_RATIO = 0.5 / 0.45  # token-in/token-out's CPU per turn against chat's, in one run


def start_server(args: argparse.Namespace, tokenizer: Path | None
                 ) -> tuple[subprocess.Popen, str]:
    extra = ["--tokenizer", str(tokenizer / "tokenizer.json")] if tokenizer else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "fake-llm", "--port", "0",
         "--latency-s", str(args.latency_s), "--latency-sigma", str(args.latency_sigma),
         "--p-good", "0.8", *extra], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("fake-llm: serving"):
        proc.kill()
        raise SystemExit(f"the stand-in server did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


def measure(args: argparse.Namespace, url: str, tokenizer: Path | None) -> tuple[float, float]:
    """(turns/s, producer CPU ms per turn) of one pipeline run."""
    server, base_url = start_server(args, tokenizer)
    groups = args.groups
    policy = {"type": "openai", "base_urls": [base_url], "model": MODEL, "max_tokens": 128,
              "max_inflight": 1024, "timeout_s": 120}
    if tokenizer is not None:
        policy["tokenizer"] = str(tokenizer)
    config = RolloutConfig.from_dict({
        "rollout_batch_size": groups * 8, "async_generation_ratio": 1, "seed": 42,
        "train_env_manager": {**SEED_BLOCK, "num_env_groups": groups,
                              "num_groups_partition": [groups]},
        "policy": policy})
    client = redis.Redis.from_url(url, socket_timeout=60)
    run = f"bench-tito-{os.getpid()}-{int(tokenizer is not None)}"
    batcher = Batcher(client, config, run=run)
    procs = start_producers(url, run, 1, "WARNING")
    producer = procs[0]
    try:
        for _ in range(args.warmup_batches):
            batcher.ack(batcher.get_batch("train", timeout_s=300))
            batcher.publish_version()
        stats0 = server_stats(base_url)
        cpu0 = cpu_s(producer.pid)
        started = time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            batch = batcher.get_batch("train", timeout_s=300)
            batcher.ack(batch)
            batcher.publish_version()
        elapsed = time.perf_counter() - started
        stats = server_stats(base_url)
        turns = max(1, stats.get("completed", 0) - stats0.get("completed", 0))
        if tokenizer is not None:
            assert stats.get("completions", 0) == stats.get("requests", 0) > 0, stats
            steps = [s for t in batch.trajectories for s in t["steps"]]
            assert all(s.get("response_ids_source") == "server" for s in steps)
        return turns / elapsed, (cpu_s(producer.pid) - cpu0) / turns * 1000
    finally:
        batcher.stop_run()
        stop_processes(procs)
        server.terminate()
        server.wait(10)
        delete_run(client, run)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--latency-s", type=float, default=1.0)
    parser.add_argument("--latency-sigma", type=float, default=0.5)
    parser.add_argument("--warmup-batches", type=int, default=2)
    parser.add_argument("--groups", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of both arms, alternating; the medians are printed")
    parser.add_argument("--redis-url", default=None, help="default: an embedded server")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    import tiny_model

    with tempfile.TemporaryDirectory() as tmp, \
            EmbeddedRedis() if args.redis_url is None else nullcontext() as redis_server:
        model = Path(tmp) / "tiny"
        tiny_model.generate(model)
        url = args.redis_url or redis_server.url
        rounds = [round_of(args, url, model, tito_first=i % 2 == 1)
                  for i in range(max(1, args.repeat))]
    print(f"openai policy, 1 producer, {args.groups * 8} FrozenLake envs, stand-in latency "
          f"median {args.latency_s}s sigma {args.latency_sigma}, {args.seconds:g}s each:")
    for name, arm in (("chat requests:", 0), ("token-in/token-out:", 1)):
        rates, cpu = [r[arm][0] for r in rounds], [r[arm][1] for r in rounds]
        print(f"  {name:<20} {statistics.median(rates):5.0f} turns/s, producer CPU per turn "
              f"{statistics.median(cpu):.3f} ms ({' / '.join(f'{v:.3f}' for v in cpu)})")
    ratios = [tito[1] / chat[1] for chat, tito in rounds]
    ratio = statistics.median(ratios)
    print(f"  ratio token-in/token-out / chat, median of {len(rounds)} round(s): {ratio:.2f}x "
          f"({' / '.join(f'{v:.2f}' for v in ratios)})")
    print(f"  target: at most {TARGET_RATIO:.2f}x (0.5 ms where chat requests cost 0.45 ms): "
          f"{'met' if ratio <= TARGET_RATIO else 'not met'}", flush=True)


def round_of(args: argparse.Namespace, url: str, model: Path, tito_first: bool
             ) -> tuple[tuple[float, float], tuple[float, float]]:
    """One round: ((turns/s, ms) of chat, (turns/s, ms) of token-in/token-out)."""
    if tito_first:
        tito = measure(args, url, model)
        return measure(args, url, None), tito
    chat = measure(args, url, None)
    return chat, measure(args, url, model)


if __name__ == "__main__":
    main()
