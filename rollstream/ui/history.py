"""The figures the page plots over time, one point per refresh, kept while `rollstream ui`
runs (a run's past before it started is not in Redis: status records hold only the latest).

Series (each a list of `[t, value]`, t in seconds since the epoch):
- `throughput`: trajectories/s committed by the live producers (their last interval);
- `batch_wait`: the longest `get_batch` wait of the batchers (a waiting batcher: so far;
  one that handed a batch out: that batch's wait);
- `staleness_mean`, `staleness_max`: of the trajectories sampled since the previous point,
  in versions between the run's version at commit and the trajectory's first step;
- `version`: the run's policy version.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from rollstream.ui.feed import staleness

SERIES = ("throughput", "batch_wait", "staleness_mean", "staleness_max", "version")


class History:
    """Bounded time series of a run (see the module docstring)."""

    def __init__(self, points: int = 900):
        self.series: dict[str, deque[list[float]]] = {
            name: deque(maxlen=points) for name in SERIES}

    def add(self, t: float, snap: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        live = [p for p in snap.get("producers", []) if p.get("state") == "live"]
        self._put("throughput", t, sum(float(p.get("traj_per_s") or 0.0) for p in live))
        waits = [float(b.get("waiting_s") or 0.0) for b in snap.get("batchers", [])
                 if b.get("state") in ("waiting", "handed")]
        if waits:
            self._put("batch_wait", t, max(waits))
        self._put("version", t, float(snap.get("version") or 0))
        if samples:
            values = [staleness(s) for s in samples]
            self._put("staleness_mean", t, sum(values) / len(values))
            self._put("staleness_max", t, float(max(values)))

    def _put(self, name: str, t: float, value: float) -> None:
        self.series[name].append([round(t, 3), round(value, 4)])

    def view(self) -> dict[str, list[list[float]]]:
        return {name: list(points) for name, points in self.series.items()}
