"""`rollstream ui`: a live, read-only web page of a run.

The parts, each found by name:
    server.py   the aiohttp application (the page and a JSON API), binding, signals
    view.py     `RunView`: the run as the page sees it, refreshed by one reader
    feed.py     `SampleFeed`: the sampled trajectories (`{RUN}:samples`), by group episode
    history.py  `History`: the figures plotted over time
    redact.py   no secret leaves: URLs' credentials and bearer tokens masked, the config by an
                allow-list
    static/     the page: index.html, app.js, style.css (no build step)
The command is `rollstream/cli/ui.py`; the samples' format is `schemas/samples.py`.
"""
