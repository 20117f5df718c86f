"""Line plots of named series to a PNG (learning curves, benchmark timelines).

matplotlib is an optional extra (`pip install 'rollstream[plot]'`), imported only when a plot
is drawn; without it `plot_series` raises `RollstreamError` saying how to install it. The
figure is drawn with matplotlib's object API on the Agg canvas: no pyplot state, no display.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.errors import RollstreamError

Series = tuple[Sequence[float], Sequence[float]]  # (x values, y values)


@dataclass
class Panel:
    """One axes of a figure: named series sharing a y axis."""

    series: Mapping[str, Series]
    title: str = ""
    ylabel: str = ""
    ylim: tuple[float, float] | None = None


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
    return plot_panels(path, [Panel(series, title, ylabel, ylim)], xlabel=xlabel,
                       width_in=width_in, height_in=height_in)


def plot_panels(
    path: str | Path,
    panels: Sequence[Panel],
    *,
    title: str = "",
    xlabel: str = "step",
    width_in: float = 7.0,
    height_in: float | None = None,
) -> Path:
    """Panels stacked top to bottom, sharing the x axis; writes the PNG, returns its path.
    `height_in` defaults to 4 inches for one panel, 2.6 per panel for more."""
    if not panels:
        raise ValueError("plot_panels needs at least one panel")
    FigureCanvasAgg, Figure = _matplotlib()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if height_in is None:
        height_in = 4.0 if len(panels) == 1 else 2.6 * len(panels)
    figure = Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes_list = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for axes, panel in zip(axes_list, panels, strict=True):
        _draw(axes, panel)
    axes_list[-1].set_xlabel(xlabel)
    if title:
        figure.suptitle(title)
    figure.savefig(out, format="png")
    return out


def require_matplotlib() -> None:
    """Raise `RollstreamError` saying how to install matplotlib when it is missing (call
    before a long run that plots at its end)."""
    _matplotlib()


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RollstreamError("plotting needs matplotlib: pip install 'rollstream[plot]'") \
            from None
    return FigureCanvasAgg, Figure


def _draw(axes: Any, panel: Panel) -> None:
    for name, (xs, ys) in panel.series.items():
        if len(xs) != len(ys):
            raise ValueError(f"series {name!r}: {len(xs)} x values, {len(ys)} y values")
        axes.plot(list(xs), list(ys), marker="o", markersize=3, label=name)
    axes.set_title(panel.title)
    axes.set_ylabel(panel.ylabel)
    if panel.ylim is not None:
        axes.set_ylim(*panel.ylim)
    axes.grid(alpha=0.3)
    if panel.series:
        axes.legend()
