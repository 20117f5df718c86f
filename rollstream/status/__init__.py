"""`rollstream status`: what a run is doing, read from Redis.

    snapshot.py  one snapshot: a few Redis round trips made into a JSON-ready dict
    warnings.py  what an operator should look at (and `Limits`: when to warn)
    render.py    the snapshot as plain text or rich tables
    watch.py     `--watch`: a snapshot every interval, redrawn in place on a terminal
"""
