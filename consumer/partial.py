"""Partial rollouts on the trainer's side: the pause mode `ModelServers.for_batcher` uses by
default, from the run's `policy.partial_rollout.in_flight` (docs/servers.md, "Partial
rollouts").

`keep` (the default): requests in flight at an update are paused and continued under the new
weights, never aborted:
- vLLM 0.33 full weights: `/pause?mode=keep` (`entrypoints/rl/online/api_router.py`; the
  scheduler freezes the running requests with their KV cache, `v1/engine/core.py`), then
  `/resume`. The tokens before the pause were sampled by the old weights, those after by the
  new; the KV of the old tokens stays as the old weights computed it.
- SGLang 0.5.23: `/pause_generation {"mode": "retract"}`: the running requests go back to the
  waiting queue and their KV cache is freed (`managers/scheduler.py` `pause_generation`,
  `retract_all`); on `/continue_generation` each one's prompt and tokens so far are
  prefilled again under the new weights (one prefill of that length per request in flight),
  so everything after the update is the new weights' own. Not `in_place`: it keeps the KV the
  old weights computed, and an update with requests still running fails its cache flush
  (`update_weights_from_disk` flushes by default and reports "Weights were updated, but the
  cache was not flushed because requests are still running or queued",
  `managers/scheduler_components/weight_updater.py:120-133`). Pass `pause_mode="in_place"`
  to choose it anyway.
- vLLM LoRA adapters: no pause at all: a request in flight names its adapter, which stays
  loaded through the staleness window.
`abort`: the old behaviour: vLLM `/pause?mode=abort`, SGLang `update_weights_from_disk` with
`abort_all_requests`; the producers send the aborted turns again from scratch.
`resume` (token-in/token-out): the same aborting modes; each aborted answer carries the tokens
sampled so far, and the producer continues the turn from them (`producers.llm.tito.Resumed`).
"""

from __future__ import annotations

from typing import Any

KEEPING = {"vllm": "keep", "sglang": "retract"}  # the pause mode that keeps requests
ABORTING = {"vllm": "abort"}  # SGLang: None, one update_weights_from_disk that aborts


def keeping_pause_mode(method: str, policy: Any) -> str | None:
    """The pause mode for `method` that the policy's `partial_rollout.in_flight` asks for
    (None: the method's own default)."""
    partial = getattr(policy, "partial_rollout", None)
    keep = partial is None or partial.in_flight == "keep"
    return (KEEPING if keep else ABORTING).get(method)
