"""`rollstream ui`: a live web page of a run (the server is rollstream/ui/).

Finds the run as the operator commands do (flags, environment, `--config`), connects, reads
its published config (a run without one does not exist here: exit 1), binds the address (a
port in use or a bad host: exit 2), and serves until Ctrl+C (130) or SIGTERM (0).
"""

from __future__ import annotations

import argparse

from rollstream.cli.connect import connect, lookup
from rollstream.cli.errors import RunNotFound
from schemas.config import RolloutConfig
from schemas.errors import RollstreamError
from schemas.keys import Keys
from schemas.redisconn import mask_url

UI_EXTRA = "pip install 'rollstream[ui]'"


def ui(args: argparse.Namespace) -> int:
    """`rollstream ui [--host H] [--port P] [--redis-url URL --run NAME]`."""
    try:
        from rollstream.ui.server import UiServer, bind
        from rollstream.ui.view import RunView
    except ImportError as exc:
        raise RollstreamError(f"rollstream ui needs aiohttp ({exc.name} is missing): "
                              f"{UI_EXTRA}") from None
    url, run = lookup(args)
    client = connect(url)
    keys = Keys(run)
    raw = client.get(keys.config)
    if raw is None:
        client.close()
        raise RunNotFound(f"run {run!r} does not exist here (no config at {keys.config}; a "
                          "trainer publishes it when it starts)")
    sock = bind(args.host, args.port)
    view = RunView(client, keys, RolloutConfig.from_json(raw), str(url))
    view.refresh()  # the first page has the run in it
    server = UiServer(view, sock, interval_s=args.interval_s)
    print(f"rollstream ui: {server.url} (run {run} at {mask_url(str(url))}; Ctrl+C stops it)",
          flush=True)
    try:
        return server.run()
    finally:
        client.close()
