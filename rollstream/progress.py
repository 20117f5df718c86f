"""The stand-in trainer's output: a line per step (a live line redrawn in place on a
terminal), the points of each step kept for the plot, and the plot itself (`up --plot`)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from typing import TextIO

from consumer import Batch


def format_step(label: str, batch: Batch) -> str:
    m = batch.metrics
    tags = " ".join(f"{name.split('/')[1]}={value:.2f}" for name, value in sorted(m.items())
                    if name.startswith("env/") and name.endswith("/success"))
    return (f"{label:<9} v{batch.version:<4} wait {m['time/get_batch_cost']:6.2f}s  "
            f"trajs {len(batch):>5}  success {tags}  "
            f"stale_dropped {int(m.get('scheduler/stale_dropped', 0))}  "
            f"staleness_max {int(m.get('scheduler/staleness/max', 0))}")


@dataclass
class StepPoint:
    """One batch as the progress line and the plot see it."""

    step: int
    wait_s: float
    traj_per_s: float  # this batch over the time since the previous one
    success: dict[str, float]  # tag -> success rate


@dataclass
class Progress:
    """The trainer loop's output. Not a terminal (a pipe, a log, the tests): one plain line
    per step. A terminal: one live line redrawn in place (steps, batch wait, traj/s,
    success), with the header, val results and the end as lines of their own."""

    out: TextIO
    live: bool = False
    keep: bool = True  # keep every step's point (for the plot; off: nothing grows per step)
    train: list[StepPoint] = field(default_factory=list)
    val: list[StepPoint] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    delivered: int = 0
    _last: float = field(default_factory=time.monotonic)
    _drawn: bool = False

    @classmethod
    def to(cls, out: TextIO, keep: bool = True) -> Progress:
        isatty = getattr(out, "isatty", None)
        return cls(out, live=bool(isatty and isatty()), keep=keep)

    def note(self, line: str) -> None:
        """A line that stays (the header, a val result, the end)."""
        self._clear()
        print(line, file=self.out, flush=True)

    def batch(self, label: str, step: int, batch: Batch) -> None:
        now = time.monotonic()
        point = StepPoint(step, batch.metrics["time/get_batch_cost"],
                          len(batch) / max(1e-9, now - self._last), _success(batch))
        if batch.mode == "val":
            if self.keep:
                self.val.append(point)
            self.note(format_step(label, batch))
            return
        self._last = now
        if self.keep:
            self.train.append(point)
        self.delivered += len(batch)
        if not self.live:
            print(format_step(label, batch), file=self.out, flush=True)
            return
        rate = self.delivered / max(1e-9, now - self.started)
        tags = " ".join(f"{tag}={value:.2f}" for tag, value in point.success.items())
        line = (f"step {step} v{batch.version}  wait {point.wait_s:.2f}s  "
                f"{rate:,.0f} traj/s  success {tags}  stale_dropped "
                f"{int(batch.metrics.get('scheduler/stale_dropped', 0))}")
        width = shutil.get_terminal_size((100, 24)).columns
        self.out.write("\r\x1b[2K" + line[: max(10, width - 1)])
        self.out.flush()
        self._drawn = True

    def close(self) -> None:
        """End the live line where it stands (the last step stays on screen)."""
        if self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False

    def _clear(self) -> None:
        if self._drawn:
            self.out.write("\r\x1b[2K")
            self.out.flush()
            self._drawn = False


def _success(batch: Batch) -> dict[str, float]:
    return {name.split("/")[1]: value for name, value in sorted(batch.metrics.items())
            if name.startswith("env/") and name.endswith("/success")}


def write_plot(path: str, progress: Progress, title: str) -> None:
    """Throughput, batch wait and success per step, three panels, to a PNG."""
    from rollstream.plots import Panel, plot_panels

    steps = [p.step for p in progress.train]
    success: dict[str, tuple[list[float], list[float]]] = {}
    for label, points in (("", progress.train), ("val ", progress.val)):
        for p in points:
            for tag, value in p.success.items():
                xs, ys = success.setdefault(label + tag, ([], []))
                xs.append(p.step)
                ys.append(value)
    plot_panels(path, [
        Panel({"delivered": (steps, [p.traj_per_s for p in progress.train])},
              "throughput", "trajectories/s"),
        Panel({"train": (steps, [p.wait_s for p in progress.train]),
               **({"val": ([p.step for p in progress.val], [p.wait_s for p in progress.val])}
                  if progress.val else {})}, "batch wait", "seconds"),
        Panel(dict(success.items()), "success", "rate", (-0.05, 1.05)),
    ], title=title, xlabel="train step")
