"""`rollstream status --watch`: a snapshot every `interval_s`, redrawn in place on a
terminal (rich), else one JSON document or one block of text per refresh."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TextIO

from rollstream.status.render import render_rich, render_text


def watch(take: Callable[[], dict[str, Any]], out: TextIO, *, as_json: bool, live: bool,
          interval_s: float, count: int | None) -> int:
    """Print a snapshot every `interval_s` (`count` times, or until Ctrl+C). `live`: redraw in
    place with rich; else one JSON document or one block of text per refresh."""
    if live and not as_json:
        return _watch_rich(take, interval_s, count)
    shown = 0
    while count is None or shown < count:
        if shown:
            time.sleep(interval_s)
        snap = take()
        print(json.dumps(snap) if as_json else render_text(snap) + "\n", file=out, flush=True)
        shown += 1
    return 0


def _watch_rich(take: Callable[[], dict[str, Any]], interval_s: float,
                count: int | None) -> int:
    from rich.live import Live

    shown = 0
    with Live(render_rich(take()), auto_refresh=False, screen=False) as view:
        shown += 1
        while count is None or shown < count:
            time.sleep(interval_s)
            view.update(render_rich(take()), refresh=True)
            shown += 1
    return 0
