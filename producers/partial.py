"""Partial rollouts on the producer's side: which policy calls in flight a control change cuts
short (`policy.partial_rollout`, docs/servers.md "Partial rollouts").

The producer cuts short (closes the HTTP request of) a policy call in flight whose gate would
no longer pass (`producers.rollout.InFlight`). What the gate says decides:
- abandon (the episode expired, the producer stops or hands the shard over): cut, always;
- wait, for a pause: with `in_flight: keep` the call is not cut: the server finishes the turn
  (and holds it through a weight update in a keeping pause mode), the turn is kept, and the
  episode waits at its next gate. Except a sync hand-out's pause whose episodes expire at the
  publish (sync mode without `sync_carry_over`): finishing their turns would only keep the
  servers busy while the trainer updates them;
- wait, for weights (a policy that takes weights through the stream): cut, as before;
- `in_flight: abort`, and `resume`: every wait cuts, as before partial rollouts. A closed request
  answers nothing to resume from: with `resume` only a server's abort (a weight update) is
  continued from its tokens, a pause's cut turn is sent again from scratch.
"""

from __future__ import annotations

from schemas.config import RolloutConfig

SYNC = "sync"  # the pause reason of a sync hand-out (`{RUN}:pause`)


class InFlightRule:
    """`must_cut(verdict, paused)`: whether a policy call in flight must be cut short now, from
    the gate's verdict (True go on, False abandon, None wait) and the pause reasons."""

    def __init__(self, config: RolloutConfig):
        self.keep = config.policy.partial_rollout.in_flight == "keep"
        # a sync hand-out's episodes outlive it only with the carry-over
        self.sync_survives = config.carry_steps > 0

    def must_cut(self, verdict: bool | None, paused: frozenset[str]) -> bool:
        if verdict is True:
            return False
        if verdict is False or not self.keep or not paused:
            return True  # abandoned; or abort mode; or waiting for weights, not a pause
        return SYNC in paused and not self.sync_survives
