"""GRPO on FrozenLake, learning through the stream.

Producers play ROLL's FrozenLake (a random 4x4 map per episode seed with the start and the
goal anywhere on it, not slippery, 10 steps) with the numpy softmax policy of
`frozenlake_policy.py`; this trainer takes complete groups from
the Batcher, computes GRPO advantages per `traj_group_id` (reward minus the group mean, over
the group std), takes a policy-gradient step and publishes the new weights as the next
version. The producers fetch them from Redis and act with them.

    python examples/grpo_frozenlake.py                   # sync: embedded Redis, 2 producers
    python examples/grpo_frozenlake.py --async-ratio 1   # async, at most 1 version stale
    rollstream up --trainer examples/grpo_frozenlake.py  # the same, started by rollstream

With a Redis URL (`--redis-url` or ROLLSTREAM_REDIS_URL) it only trains, against producers
started elsewhere with this folder on their PYTHONPATH (`rollstream up --trainer` does that).
It writes `OUT_DIR/progress.csv` and `OUT_DIR/learning_curve.png`; its last line is
`final success_rate=<val success at the end>`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis

from consumer import Batch, Batcher
from rollstream.embedded import EmbeddedRedis
from rollstream.launcher import interrupt_signals, start_producers, stop_processes
from schemas.config import RolloutConfig
from schemas.errors import RollstreamError, RunStopped
from schemas.redisconn import sync_client

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from frozenlake_policy import FEATURES, action_features, encode_weights, parse_grid, softmax  # noqa: E402,I001

TAG = "FrozenLake"


def opt(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass
class Args:
    seed: int = opt(1, "seed of every episode (maps and the policy's sampling)")
    steps: int = opt(40, "train steps, one policy version each")
    groups: int = opt(16, "train env groups; every member of a group plays the same map")
    group_size: int = opt(8, "members per group: GRPO compares their returns")
    val_envs: int = opt(128, "val episodes per val round (the same maps every round)")
    val_every: int = opt(5, "a val round every N steps (and one at the end)")
    async_ratio: int = opt(0, "0: sync (producers pause while the trainer updates); "
                              "k >= 1: async, at most k versions stale")
    lr: float = opt(0.1, "Adam step size")
    greedy_val: bool = opt(False, "val episodes take the most likely action "
                                  "(default: they sample, as in training)")
    producers: int = opt(2, "producer processes to start (without a Redis URL)")
    redis_url: str = opt("", "an existing Redis where producers run "
                             "(default: ROLLSTREAM_REDIS_URL, else an embedded one)")
    run: str = opt("", "run name (default: ROLLSTREAM_RUN, else grpo-frozenlake)")
    out_dir: str = opt("runs/grpo_frozenlake", "where the CSV and the PNG go")
    timeout_s: float = opt(60.0, "give up when a batch takes longer than this")


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for field in dataclasses.fields(Args):
        flag = f"--{field.name.replace('_', '-')}"
        if isinstance(field.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                default=field.default, help=field.metadata["help"])
        else:
            parser.add_argument(flag, type=type(field.default), default=field.default,
                                help=field.metadata["help"])
    args = Args(**vars(parser.parse_args(argv)))
    args.redis_url = args.redis_url or os.environ.get("ROLLSTREAM_REDIS_URL", "")
    args.run = args.run or os.environ.get("ROLLSTREAM_RUN", "") or "grpo-frozenlake"
    return args


def rollout_config(args: Args) -> RolloutConfig:
    """Train: `groups` x `group_size` envs, one episode each per step; val: `val_envs` envs."""
    return RolloutConfig.from_dict({
        "seed": args.seed,
        "async_generation_ratio": args.async_ratio,
        "rollout_batch_size": args.groups * args.group_size,
        "val_batch_size": args.val_envs,
        "train_env_manager": {"max_env_num_per_worker": 32, "num_env_groups": args.groups,
                              "group_size": args.group_size, "tags": [TAG]},
        "val_env_manager": {"max_env_num_per_worker": 64, "num_env_groups": args.val_envs,
                            "group_size": 1, "tags": [TAG]},
        # the producers import the policy module from their PYTHONPATH (this folder)
        "policy": {"type": "python", "entrypoint": "frozenlake_policy:make_policy",
                   "greedy_val": args.greedy_val},  # the factory's keyword argument
    })


def grpo_advantages(batch: Batch) -> np.ndarray:
    """Per trajectory: (return - group mean) / group std, groups by `traj_group_id`."""
    returns = batch.scores.astype(np.float64)
    groups = np.array(batch.traj_group_ids)
    advantages = np.zeros_like(returns)
    for group in np.unique(groups):
        members = groups == group
        r = returns[members]
        advantages[members] = (r - r.mean()) / (r.std() + 1e-6)
    return advantages


def policy_gradient(w: np.ndarray, batch: Batch, advantages: np.ndarray) -> np.ndarray:
    """Mean over steps of advantage * grad log pi(action | observation); features are rebuilt
    from each step's text observation exactly as the policy built them."""
    grad = np.zeros_like(w)
    steps = 0
    for traj, advantage in zip(batch.trajectories, advantages, strict=True):
        previous = None
        for step in traj["steps"]:
            feats = action_features(step["observation"], previous)
            probs = softmax(feats @ w)
            grad += advantage * (feats[int(step["action"])] - probs @ feats)
            previous = parse_grid(step["observation"])[1]
            steps += 1
    return grad / max(steps, 1)


class Adam:
    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None
        self.t = 0

    def ascent(self, w: np.ndarray, grad: np.ndarray) -> np.ndarray:
        if self.m is None or self.v is None:
            self.m, self.v = np.zeros_like(w), np.zeros_like(w)
        self.t += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad**2
        m_hat = self.m / (1 - self.beta1**self.t)
        v_hat = self.v / (1 - self.beta2**self.t)
        return w + self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


def metric_line(prefix: str, metrics: dict[str, float], names: list[str]) -> str:
    return " ".join(f"{prefix}{name}={metrics.get(name, 0.0):.3f}" for name in names)


TRAIN_METRICS = [f"env/{TAG}/success", f"env/{TAG}/num_actions", "rollout/score/mean",
                 "scheduler/stale_dropped", "scheduler/staleness/max", "time/get_batch_cost"]


def validate(batcher: Batcher, args: Args, step: int, started: float) -> float:
    val = batcher.get_batch("val", timeout_s=args.timeout_s)
    success = float(val.metrics[f"env/{TAG}/success"])
    print(f"val   step {step:3d} v{val.version:<3d} "
          f"{metric_line('val/', val.metrics, [f'env/{TAG}/success'])} "
          f"wall_s={time.monotonic() - started:.1f}", flush=True)
    return success


CSV_FIELDS = ["step", "version", "wall_s", "train_success", "val_success", *TRAIN_METRICS]


def train(batcher: Batcher, args: Args, out: Path) -> float:
    """The training loop; returns the val success at the end. One CSV row per step."""
    w = np.zeros(len(FEATURES), dtype=np.float64)  # version 0: the factory's uniform policy
    optimizer = Adam(args.lr)
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "progress.csv", "w", newline="") as csv_file:
        progress = csv.DictWriter(csv_file, fieldnames=CSV_FIELDS, restval="")
        progress.writeheader()
        val_success = validate(batcher, args, 0, started)
        rows: list[dict[str, Any]] = [{"step": 0, "version": 0, "wall_s": 0.0,
                                       "val_success": val_success}]
        progress.writerow(rows[0])
        for step in range(1, args.steps + 1):
            batch = batcher.get_batch("train", timeout_s=args.timeout_s)
            advantages = grpo_advantages(batch)
            w = optimizer.ascent(w, policy_gradient(w, batch, advantages))
            batcher.ack(batch)
            version = batcher.publish_version(weights=encode_weights(w))
            print(f"train step {step:3d} v{batch.version:<3d} "
                  f"{metric_line('', batch.metrics, TRAIN_METRICS)} "
                  f"wall_s={time.monotonic() - started:.1f}", flush=True)
            row: dict[str, Any] = {"step": step, "version": version,
                                   "wall_s": round(time.monotonic() - started, 3),
                                   "train_success": batch.metrics[f"env/{TAG}/success"]}
            row.update({name: batch.metrics.get(name, 0.0) for name in TRAIN_METRICS})
            if step % args.val_every == 0 or step == args.steps:
                val_success = row["val_success"] = validate(batcher, args, step, started)
            progress.writerow(row)
            csv_file.flush()
            rows.append(row)
    plot_curve(out, rows)
    return val_success


def plot_curve(out: Path, rows: list[dict[str, Any]]) -> None:
    from rollstream.plots import plot_series

    train = [r for r in rows if "train_success" in r]
    val = [r for r in rows if "val_success" in r]
    try:
        png = plot_series(out / "learning_curve.png", {
            "train success": ([r["step"] for r in train], [r["train_success"] for r in train]),
            "val success": ([r["step"] for r in val], [r["val_success"] for r in val]),
        }, title="GRPO on FrozenLake 4x4", xlabel="train step (policy version)",
            ylabel="success rate", ylim=(0.0, 1.0))
        print(f"wrote {out / 'progress.csv'} and {png}", flush=True)
    except RollstreamError as exc:  # matplotlib missing: the CSV is still there
        print(f"wrote {out / 'progress.csv'}; no PNG: {exc}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # seeding: every episode's map and every sampled action derive from `args.seed` (numpy
    # SeedSequence per episode and member, in the producers), so a sync run repeats exactly
    config = rollout_config(args)
    mode = "sync" if config.is_sync else f"async (ratio {config.ratio})"
    try:  # Ctrl+C and SIGTERM: the same cleanup, nothing left running
        with interrupt_signals(), ExitStack() as stack:
            url = args.redis_url
            if not url:  # self-contained: our own Redis and producers, stopped on the way out
                url = stack.enter_context(EmbeddedRedis()).url
                procs = start_producers(url, args.run, args.producers, "WARNING",
                                        pythonpath=[str(HERE)])
                stack.callback(stop_processes, procs)
            client = sync_client(url, socket_timeout=30, socket_connect_timeout=5)
            stack.callback(client.close)
            batcher = Batcher(client, config, run=args.run)
            stack.callback(batcher.close)
            # (a given URL is not printed: it can hold a password)
            where = "producers elsewhere" if args.redis_url else f"embedded Redis at {url}"
            print(f"grpo_frozenlake: run {args.run!r}, {mode}, {where}, "
                  f"{args.steps} steps of {config.train_batch_size} episodes", flush=True)
            success = train(batcher, args, Path(args.out_dir))
    except KeyboardInterrupt:
        print("interrupted; everything stopped", flush=True)
        return 130
    except RunStopped as exc:  # `rollstream stop`: the run's end, not a failure
        print(f"grpo_frozenlake: {exc}; stopping", flush=True)
        return 0
    except (RollstreamError, redis.RedisError) as exc:
        print(f"grpo_frozenlake: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"final success_rate={success:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
