"""The train/inference mismatch: how far the logprobs the inference server sampled with are
from the trainer's logprobs of the same tokens.

The trainer computes its logprobs of a batch's generated tokens (`Batch.trajectory_tokens()`
gives `input_ids`, `loss_mask` and the server's `rollout_logprobs`, aligned); then

    figures = rollout_kl(tokens.rollout_logprobs, trainer_logprobs, tokens.loss_mask)

gives, over the masked tokens (tokens sampled from the rollout policy q, scored by the
trainer's p; r = p / q, log r = trainer - rollout):

- `mismatch/kl_k1`: mean of -log r, the plain estimator of KL(q || p) (unbiased, high
  variance, can be negative on a sample);
- `mismatch/kl_k3`: mean of (r - 1) - log r, unbiased and never negative, lower variance;
- `mismatch/max_abs_diff`, `mismatch/mean_abs_diff`: of |trainer - rollout| per token;
- `mismatch/tokens`: how many tokens were compared.

k1 and k3 are the estimators of J. Schulman's note "Approximating KL Divergence" (2020), the
ones RL trainers log as the train/inference mismatch (a bf16 inference server against an
fp32 trainer shows a k3 around 1e-3; a wrong version or template shows far more).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def rollout_kl(rollout_logprobs: Any, trainer_logprobs: Any,
               mask: Any | None = None) -> dict[str, float]:
    """The mismatch figures over the tokens where `mask` is true (all, without a mask); the
    arrays have one shape ([N, L] or [L]). No token: every figure 0 and `tokens` 0."""
    rollout = np.asarray(rollout_logprobs, dtype=np.float64)
    trainer = np.asarray(trainer_logprobs, dtype=np.float64)
    if rollout.shape != trainer.shape:
        raise ValueError(f"rollout_kl: rollout logprobs {rollout.shape} and trainer logprobs "
                         f"{trainer.shape} must have one shape")
    keep = np.ones(rollout.shape, dtype=bool) if mask is None else np.asarray(mask).astype(bool)
    if keep.shape != rollout.shape:
        raise ValueError(f"rollout_kl: mask {keep.shape} must have the logprobs' shape "
                         f"{rollout.shape}")
    log_ratio = trainer[keep] - rollout[keep]  # log p/q per token
    if not len(log_ratio):
        return {"mismatch/kl_k1": 0.0, "mismatch/kl_k3": 0.0, "mismatch/max_abs_diff": 0.0,
                "mismatch/mean_abs_diff": 0.0, "mismatch/tokens": 0.0}
    diff = np.abs(log_ratio)
    return {
        "mismatch/kl_k1": float(np.mean(-log_ratio)),
        "mismatch/kl_k3": float(np.mean(np.expm1(log_ratio) - log_ratio)),
        "mismatch/max_abs_diff": float(diff.max()),
        "mismatch/mean_abs_diff": float(diff.mean()),
        "mismatch/tokens": float(len(log_ratio)),
    }
