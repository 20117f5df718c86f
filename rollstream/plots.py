"""Line plots of named series to a PNG (learning curves, benchmark timelines).

matplotlib is an optional extra (`pip install 'rollstream[plot]'`), imported only when a plot
is drawn; without it `plot_series` raises `RollstreamError` saying how to install it. The
figure is drawn with matplotlib's object API on the Agg canvas: no pyplot state, no display.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from schemas.errors import RollstreamError

Series = tuple[Sequence[float], Sequence[float]]  # (x values, y values)


def plot_series(
    path: str | Path,
    series: Mapping[str, Series],
    *,
    title: str = "",
    xlabel: str = "step",
    ylabel: str = "",
    ylim: tuple[float, float] | None = None,
    width_in: float = 7.0,
    height_in: float = 4.0,
) -> Path:
    """Draw each named series as a line with markers and write the PNG; returns its path."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RollstreamError("plotting needs matplotlib: pip install 'rollstream[plot]'") \
            from None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for name, (xs, ys) in series.items():
        if len(xs) != len(ys):
            raise ValueError(f"series {name!r}: {len(xs)} x values, {len(ys)} y values")
        axes.plot(list(xs), list(ys), marker="o", markersize=3, label=name)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if ylim is not None:
        axes.set_ylim(*ylim)
    axes.grid(alpha=0.3)
    if series:
        axes.legend()
    figure.savefig(out, format="png")
    return out
