"""Episode admission and expiry in closed form (ROLL's per-step group creation and expiry).

With T episodes per env per step and ratio r (`async_generation_ratio`):
- episode k belongs to step `create(k) = max(0, k // T - r)`;
- it is admitted (may start) while `k < (version + 1 + r) * T`;
- it is expired once `version - create(k) > r`: members abandon it, the batcher drops it.
A trajectory started at version v0 was admitted, so `create(k) <= v0`; delivered unexpired at
version v, its staleness `v - v0 <= v - create(k) <= r`.

Carry-over (`carry` c: in sync mode 1 with `policy.partial_rollout.sync_carry_over`, in
async mode `policy.partial_rollout.async_carry_over`): admission is unchanged, and an episode
expires only once `version - create(k) > r + c`: a sync step's unfinished episodes live on
through the next step (once), as slime's `--partial-rollout` carries unfinished samples; an
async episode, once admitted, c versions past the ratio (AReaL's bound at admission). So
staleness `v - v0 <= r + c`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """Admission/expiry rules for one mode: `episodes_per_step` (T) and `ratio` (r)."""

    episodes_per_step: int
    ratio: int
    carry: int = 0  # steps an episode may outlive the bound (sync carry-over: 1)

    def create_step(self, k: int) -> int:
        return max(0, k // self.episodes_per_step - self.ratio)

    def admitted(self, k: int, version: int) -> bool:
        return k < (version + 1 + self.ratio) * self.episodes_per_step

    @property
    def bound(self) -> int:
        """The staleness a delivered trajectory may have: `ratio + carry`."""
        return self.ratio + self.carry

    def expired(self, k: int, version: int) -> bool:
        return version - self.create_step(k) > self.ratio + self.carry

    def first_live(self, version: int) -> int:
        """The smallest k that is not expired at `version`."""
        bound = self.ratio + self.carry
        return (version - self.carry) * self.episodes_per_step if version > bound else 0

    def admit_limit(self, version: int) -> int:
        """One past the largest k admitted at `version`."""
        return (version + 1 + self.ratio) * self.episodes_per_step
