"""Generated tokens thrown away, with and without partial rollouts (`policy.partial_rollout`).

    python bench/bench_partial.py [--steps 4] [--groups 8] [--latency-s 0.05]

One stand-in vLLM 0.33 server (`rollstream fake-llm --flavor vllm`, in this process), one
producer process, FrozenLake multi-turn episodes (mostly malformed replies: 6 turns each), and
the documented trainer loop (`get_batch`, `ModelServers.update` through vLLM's `/pause`,
`/collective_rpc reload_weights`, `/update_weight_version`, `/resume`, `ack`,
`publish_version`) for `--steps` publishes. Then the trainer stops publishing and the producer
finishes every episode already admitted, so every token the server sampled is either in a
trajectory (handed out, or committed to the streams) or was thrown away:

    discarded = the server's sampled tokens - the tokens of the batches handed out
                - the tokens of the trajectories left in the streams at the end

(the stand-in counts what it sampled: a completed answer's tokens, half of an aborted or
closed request's, `tokens_cut`, of which a resumed turn carried `tokens_resumed` on).
Discarded tokens are of two kinds: those of turns cut (aborted by an update, closed by a
pause) and not resumed, and whole turns of episodes that expired or were dropped as stale
(the staleness bound's, not the update's). Printed per weight update (async) or per
sync step (one publish each):
- async (`async_generation_ratio: 1`, every env in the batch), token-in/token-out (the
  repository's generated tokenizer, scripts/tiny_model.py, `policy.tokenizer`; the stand-in's
  `/v1/completions`): `in_flight: keep` against `abort` (the requests in flight at an update
  are aborted and sent again) and `resume` (aborted, then continued from the tokens the
  aborting answer carried); target 0; and `keep` with `async_carry_over` (`--async-carry`,
  default 1): admitted episodes live on past the ratio instead of expiring;
- sync, a batch of half the envs (the other half are in flight at each hand-out): on-policy
  (the default: they expire at the publish) against `sync_carry_over: true`;
- how long an update holds generation: `ModelServers.update`'s wall time, from the pause to the
  resume (`--load-time-s` is the stand-in's load).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
from bench_pipeline import delete_run  # noqa: E402

from consumer import Batcher, ModelServers  # noqa: E402
from rollstream.embedded import EmbeddedRedis  # noqa: E402
from rollstream.fake_llm import FakeLLMOptions, FakeLLMServer  # noqa: E402
from rollstream.launcher import start_producers, stop_processes  # noqa: E402
from schemas.codec import ENTRY_FIELD, decode_trajectory  # noqa: E402
from schemas.config import RolloutConfig  # noqa: E402


@dataclass
class Result:
    generated: int  # tokens the server sampled
    handed: int  # tokens in the batches handed out
    left: int  # tokens in trajectories still in the streams at the end
    publishes: int
    update_s: list[float]
    cut: int  # tokens of requests aborted or closed before they finished
    aborted: int  # requests the server aborted
    cancelled: int  # requests the producer closed
    stale_dropped: float
    resumed_cut: int = 0  # tokens of aborted requests a resumed turn carried on
    resumed: int = 0  # turns resumed (aborted, continued from their tokens)

    @property
    def discarded(self) -> int:
        return self.generated - self.handed - self.left

    @property
    def cut_lost(self) -> int:
        """Tokens of requests cut that were thrown away (not carried on by a resume)."""
        return self.cut - self.resumed_cut

    @property
    def per_publish(self) -> float:
        return self.discarded / max(1, self.publishes)


def make_config(args: argparse.Namespace, base_url: str, ratio: int, batch: int,
                partial: dict[str, Any], tokenizer: str | None = None) -> RolloutConfig:
    lake = {"env_type": "frozen_lake", "env_config": {"size": 4, "p": 0.8, "is_slippery": False,
                                                   "max_steps": 6}}
    return RolloutConfig.from_dict({
        "rollout_batch_size": batch, "async_generation_ratio": ratio, "seed": 7,
        "val_env_manager": None, "custom_envs": {"Lake": lake},
        "train_env_manager": {"num_env_groups": args.groups, "group_size": 4,
                              "max_env_num_per_worker": 64, "tags": ["Lake"]},
        "policy": {"type": "openai", "base_urls": [base_url], "model": "fake-model",
                   "max_tokens": 64, "timeout_s": 120, "partial_rollout": partial,
                   **({"tokenizer": tokenizer} if tokenizer else {})},
    })


def tokens_of(trajs: list[dict[str, Any]]) -> int:
    return sum(len(step.get("response_ids") if step.get("response_ids") is not None else ())
               for traj in trajs for step in traj["steps"])


def stream_trajs(client: redis.Redis, batcher: Batcher, groups: int) -> list[dict[str, Any]]:
    return [decode_trajectory(fields[ENTRY_FIELD]) for g in range(groups)
            for _, fields in client.xrange(batcher.keys.stream("train", g))]


def drained(client: redis.Redis, batcher: Batcher, server: FakeLLMServer, envs: int) -> bool:
    """Every episode admitted at the run's version committed, no request in flight."""
    limit = batcher.config.schedule("train").admit_limit(batcher.version)
    cursors = client.hvals(batcher.keys.cursor("train"))
    return (len(cursors) == envs and all(int(c) >= limit for c in cursors)
            and server.in_flight == 0)


def one_run(args: argparse.Namespace, url: str, *, ratio: int, batch_envs: int,
            partial: dict[str, Any], tokenizer: str | None = None) -> Result:
    """One run; with `tokenizer` (a folder) token-in/token-out."""
    server = FakeLLMServer(FakeLLMOptions(
        flavor="vllm", latency_s=args.latency_s, latency_sigma=0.5,
        load_time_s=args.load_time_s, p_good=0.3, malformed_share=1.0,
        tokenizer=f"{tokenizer}/tokenizer.json" if tokenizer else "")).start()
    client = redis.Redis.from_url(url, socket_timeout=60)
    run = f"bench-partial-{os.getpid()}-{time.monotonic_ns()}"
    envs = args.groups * 4
    config = make_config(args, server.base_url, ratio, batch_envs, partial, tokenizer)
    batcher = Batcher(client, config, run=run)
    servers = ModelServers.for_batcher(batcher, "vllm", watch_s=None)
    procs = start_producers(url, run, 1, "WARNING")
    delivered: list[dict[str, Any]] = []
    update_s: list[float] = []
    stale = 0.0
    try:
        for _ in range(args.steps):
            batch = batcher.get_batch(timeout_s=300)
            delivered += batch.trajectories
            stale += batch.metrics.get("scheduler/stale_dropped", 0)
            version = batcher.version + 1
            t0 = time.perf_counter()
            servers.update(version, f"/ckpt/{version}")
            update_s.append(time.perf_counter() - t0)
            batcher.ack(batch)
            batcher.publish_version(version)
        batch = batcher.get_batch(timeout_s=300)
        delivered += batch.trajectories
        stale += batch.metrics.get("scheduler/stale_dropped", 0)
        batcher.ack(batch)
        # no more publishes: the producer finishes what is admitted (sync: as the next
        # get_batch would, the hand-out's pause is lifted without a new version)
        client.srem(batcher.keys.pause, "sync")
        client.publish(batcher.keys.control, b"pause")
        deadline = time.monotonic() + 300
        while not drained(client, batcher, server, envs):
            if time.monotonic() > deadline:
                raise SystemExit("the producer did not finish its admitted episodes")
            time.sleep(0.05)
        remaining = stream_trajs(client, batcher, args.groups)
        stats = server.stats
        resumed = sum(1 for traj in delivered + remaining for step in traj["steps"]
                      if step.get("resumed"))
        return Result(stats["tokens_generated"], tokens_of(delivered), tokens_of(remaining),
                      args.steps, update_s, stats["tokens_cut"], stats["aborted"],
                      stats["cancelled"], stale, stats["tokens_resumed"], resumed)
    finally:
        servers.close()
        batcher.stop_run()
        stop_processes(procs)
        server.stop()
        delete_run(client, run)
        client.close()


def ratio_text(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else ("1.00x" if a == 0 else "inf")


def row(name: str, res: Result, per: str) -> str:
    return (f"| {name} | {res.generated} | {res.handed} | {res.left} | {res.discarded} | "
            f"{res.per_publish:.0f} per {per} | {res.cut_lost} ({res.aborted} aborted, "
            f"{res.cancelled} closed, {res.resumed} resumed) | {res.discarded - res.cut_lost} "
            f"({res.stale_dropped:.0f} "
            f"dropped stale) | {statistics.mean(res.update_s) * 1000:.0f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="publishes (weight updates)")
    parser.add_argument("--groups", type=int, default=8, help="groups of 4 envs")
    parser.add_argument("--latency-s", type=float, default=0.05, help="server latency median")
    parser.add_argument("--load-time-s", type=float, default=0.2,
                        help="the stand-in's weight load")
    parser.add_argument("--redis-url", default=None, help="default: an embedded Redis")
    parser.add_argument("--async-carry", type=int, default=1,
                        help="async_carry_over of the sixth run (keep, async)")
    parser.add_argument("--parallel", action="store_true",
                        help="run the six at once (the tests: every line, in less time; the "
                             "figures then share the machine)")
    args = parser.parse_args()
    if args.steps < 1 or args.groups < 2:
        parser.error("--steps must be >= 1 and --groups >= 2")
    envs = args.groups * 4
    with EmbeddedRedis() if args.redis_url is None else _Given(args.redis_url) as redis_at, \
            tempfile.TemporaryDirectory() as tokenizer:
        url = redis_at.url
        tiny_model().generate(Path(tokenizer), seed=0)
        half = envs // 2
        arms: list[dict[str, Any]] = [
            *({"ratio": 1, "batch_envs": envs, "tokenizer": tokenizer,
               "partial": {"in_flight": how}} for how in ("keep", "abort", "resume")),
            {"ratio": 1, "batch_envs": envs, "tokenizer": tokenizer,
             "partial": {"in_flight": "keep", "async_carry_over": args.async_carry}},
            {"ratio": 0, "batch_envs": half, "partial": {}},
            {"ratio": 0, "batch_envs": half, "partial": {"sync_carry_over": True}},
        ]
        if args.parallel:
            with ThreadPoolExecutor(len(arms)) as pool:
                results = list(pool.map(lambda arm: one_run(args, url, **arm), arms))
        else:
            results = [one_run(args, url, **arm) for arm in arms]
        keep, abort, resume, keep_carry, on_policy, carry = results
    print(f"{args.groups * 4} envs, {args.steps} publishes, server latency {args.latency_s}s, "
          f"load {args.load_time_s}s")
    print("| run | tokens sampled | handed out | left in streams | discarded | discarded | "
          "of which in requests cut, not resumed | in finished turns of episodes expired or "
          "dropped | "
          "update holds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(row("async, token-in/token-out, in_flight keep", keep, "update"))
    print(row("async, token-in/token-out, in_flight abort", abort, "update"))
    print(row("async, token-in/token-out, in_flight resume", resume, "update"))
    print(row(f"async, token-in/token-out, in_flight keep, async_carry_over "
              f"{args.async_carry}", keep_carry, "update"))
    print(row(f"sync, batch {half}/{envs}, on-policy", on_policy, "step"))
    print(row(f"sync, batch {half}/{envs}, carry-over", carry, "step"))
    print(f"async discarded per update, keep / abort: "
          f"{ratio_text(keep.per_publish, abort.per_publish)}, resume / abort: "
          f"{ratio_text(resume.per_publish, abort.per_publish)} "
          f"({keep.per_publish:.0f} / {resume.per_publish:.0f} / {abort.per_publish:.0f} "
          f"tokens, keep / resume / abort)")
    print(f"async discarded per update, keep with async_carry_over {args.async_carry} / keep: "
          f"{ratio_text(keep_carry.per_publish, keep.per_publish)} "
          f"({keep_carry.per_publish:.0f} / {keep.per_publish:.0f} tokens; "
          f"{keep_carry.stale_dropped:.0f} / {keep.stale_dropped:.0f} dropped stale)")
    print(f"async tokens of requests cut (aborted or closed) thrown away, keep / resume / "
          f"abort: {keep.cut_lost} / {resume.cut_lost} / {abort.cut_lost} (resume carried "
          f"{resume.resumed_cut} on in {resume.resumed} turns resumed)")
    print(f"sync handed out / sampled, carry-over {carry.handed / carry.generated:.2f}, "
          f"on-policy {on_policy.handed / on_policy.generated:.2f}")
    print(f"sync discarded per step, carry-over / on-policy: "
          f"{ratio_text(carry.per_publish, on_policy.per_publish)} "
          f"({carry.per_publish:.0f} / {on_policy.per_publish:.0f} tokens)")
    print(f"an update holds generation, keep / abort: "
          f"{ratio_text(statistics.mean(keep.update_s), statistics.mean(abort.update_s))} "
          f"({statistics.mean(keep.update_s) * 1000:.0f} / "
          f"{statistics.mean(abort.update_s) * 1000:.0f} ms, load {args.load_time_s}s)")


def tiny_model() -> Any:
    """scripts/tiny_model.py, loaded by path (it writes the generated tokenizer)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "tiny_model.py"
    spec = importlib.util.spec_from_file_location("tiny_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Given:
    def __init__(self, url: str):
        self.url = url

    def __enter__(self) -> _Given:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


if __name__ == "__main__":
    main()
