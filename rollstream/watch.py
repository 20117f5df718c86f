"""`rollstream status [--json] [--watch]`: what a run is doing, read from Redis.

One snapshot is a handful of Redis round trips: the control keys, heartbeats, the producers'
and batchers' stats records (`schemas/stats.py`), lease owners, stream lengths and pending
counts, Redis's memory. Rates (trajectories/s, episodes/s, CPU) come from the producers'
records, which count since their previous record, so one snapshot shows them.

`--json` prints the snapshot as one JSON document:
    {"run", "version", "val_round", "pause": [reasons], "stopped", "sync", "ratio",
     "live_producers", "server_time",
     "producers": [{"id", "state": live|gone, "heartbeat_age_s", "shards": ["train:0"],
                    "traj_per_s", "rss_mb", "cpu_percent", "envs", "in_flight", "committed",
                    "host", "pid", "metrics_port", "rss_per_env_mb", "rss_per_env_baseline_mb",
                    "loop_stalls", "recent_stalls", "recent_stall_longest_s",
                    "recent_stall_where"}],  (stalls: its event loop blocked, producers/stall.py)
     "modes": {MODE: {"envs", "groups", "shards", "shards_leased",
                      "shards_without_live_producer": [int], "entries", "backlog", "pending",
                      "tags": {TAG: {"envs", "envs_running", "episodes_per_s", "success",
                                     "mean_actions", "committed"}}}},
     "batchers": [{"consumer", "state": waiting|handed|timed_out|closed|gone, "mode", "waiting_s",
                   "wanted", "complete", "partial", "version", "batches", "delivered"}],
     "dropped": {"stale", "late", "failed_groups", "val_discarded", "dead_letters"},
     "redis": {"used_mb", "peak_mb", "maxmemory_mb", "limit_mb"},
     "model_servers": [{"url", "version", "model", "set_aside": {producer: why}}],  (what a
                      trainer's ModelServers recorded; which live producers set it aside)
     "warnings": [str]}
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from schemas.config import RolloutConfig
from schemas.errors import DecodeError
from schemas.keys import BATCHER_CLOSED, CONSUMER_GROUP, Keys
from schemas.policy import read_server_record
from schemas.redisconn import SyncClient, server_ms
from schemas.stats import BatcherRecord, ProducerRecord

MB = 2**20


@dataclass
class Limits:
    """When status warns."""

    wait_warn_s: float = 30.0  # get_batch waiting longer than this
    redis_limit_mb: float | None = None  # default: 80% of maxmemory, else 1024 MB
    memory_growth: float = 1.5  # rss per env this many times its warm baseline ...
    memory_growth_min_mb: float = 64.0  # ... and at least this much above it


# -- the snapshot ------------------------------------------------------------------------------
def snapshot(client: SyncClient, keys: Keys, config: RolloutConfig,
             limits: Limits | None = None) -> dict[str, Any]:
    """The run's state as a JSON-ready dict (see the module docstring)."""
    limits = limits or Limits()
    raw = _read(client, keys, config)
    now_ms = raw["now_ms"]
    # a heartbeat's score is when it expires, by its producer's own lease ttl
    expiries = {_text(m): s for m, s in raw["beats"]}
    live = {p for p, s in expiries.items() if s >= now_ms}
    # when each beat last (as this config's ttl has it; the stats records say it exactly)
    beats = {p: s - config.lease_ttl_s * 1000 for p, s in expiries.items()}
    owners = raw["owners"]
    records = _producer_records(raw["stats"])
    snap: dict[str, Any] = {
        "run": keys.run,
        "version": int(raw["version"] or 0),
        "val_round": int(raw["val_round"] or 0),
        "pause": sorted(_text(r) for r in raw["pause"]),
        "stopped": bool(raw["stop"]),
        "sync": config.is_sync,
        "ratio": config.ratio,
        "live_producers": len(live),
        "server_time": now_ms / 1000,
    }
    snap["producers"] = _producers(records, beats, dict(raw["seen"]), live, owners, now_ms)
    snap["modes"] = _modes(config, raw, owners, live, records)
    snap["batchers"] = _batchers(raw["batchers"], raw["alive"])
    snap["dropped"] = _dropped(raw["batchers"], raw["dead"])
    snap["redis"] = _redis_memory(raw["memory"], limits)
    snap["model_servers"] = _model_servers(raw["servers"], records, live)
    snap["warnings"] = warnings(snap, limits)
    return snap


def _read(client: SyncClient, keys: Keys, config: RolloutConfig) -> dict[str, Any]:
    """Everything a snapshot needs, in two pipelines and an INFO."""
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.version)
    pipe.get(keys.val_round)
    pipe.smembers(keys.pause)
    pipe.exists(keys.stop)
    pipe.zrange(keys.producers, 0, -1, withscores=True)
    pipe.hgetall(keys.producer_stats)
    pipe.zrange(keys.producer_seen, 0, -1, withscores=True)
    pipe.hgetall(keys.batchers)
    pipe.xlen(keys.dead)
    pipe.hgetall(keys.servers)
    names = ["version", "val_round", "pause", "stop", "beats", "stats", "seen",
             "batchers", "dead", "servers"]
    raw = dict(zip(names, pipe.execute(), strict=True))
    raw["now_ms"] = server_ms(client, keys.producers)
    raw["seen"] = [(_text(m), s) for m, s in raw["seen"]]
    pipe = client.pipeline(transaction=False)
    for mode in config.modes():
        manager = config.manager(mode)
        for shard in range(manager.num_shards):  # GETs, not MGET: a cluster pipeline has none
            pipe.get(keys.lease(mode, shard))
        for g in range(manager.num_env_groups):
            pipe.xlen(keys.stream(mode, g))
            pipe.xpending(keys.stream(mode, g), CONSUMER_GROUP)
    consumers = [_text(name) for name in raw["batchers"]]
    for consumer in consumers:  # each batcher's liveness key: is its process alive?
        pipe.get(keys.batcher_alive(consumer))
    replies = iter(pipe.execute(raise_on_error=False))
    raw["owners"], raw["streams"] = {}, {}
    for mode in config.modes():
        manager = config.manager(mode)
        owners = [next(replies) for _ in range(manager.num_shards)]
        raw["owners"][mode] = [_text(o) if isinstance(o, bytes) and o else None for o in owners]
        entries = pending = 0
        for _ in range(manager.num_env_groups):
            length, info = next(replies), next(replies)
            entries += length if isinstance(length, int) else 0
            pending += int(info.get("pending") or 0) if isinstance(info, dict) else 0
        raw["streams"][mode] = (entries, pending)
    raw["alive"] = {consumer: next(replies) for consumer in consumers}
    raw["memory"] = client.info("memory")
    return raw


def _producer_records(raw: dict[Any, bytes]) -> dict[str, ProducerRecord]:
    out = {}
    for producer, data in raw.items():
        try:
            out[_text(producer)] = ProducerRecord.decode(data)
        except (DecodeError, TypeError):
            continue  # a record this version cannot read: the producer still shows by heartbeat
    return out


def _producers(records: dict[str, ProducerRecord], beats: dict[str, float],
               seen: dict[str, float], live: set[str], owners: dict[str, list[str | None]],
               now_ms: int) -> list[dict[str, Any]]:
    held: dict[str, list[str]] = defaultdict(list)
    for mode, shard_owners in owners.items():
        for shard, owner in enumerate(shard_owners):
            if owner is not None:
                held[owner].append(f"{mode}:{shard}")
    out = []
    for pid in sorted(set(records) | set(beats)):
        # the stats record's time (the server's clock) when there is one: the expiry less the
        # config's ttl is wrong for a producer running another ttl
        last = seen[pid] if pid in seen else beats.get(pid, 0.0)
        item: dict[str, Any] = {
            "id": pid, "state": "live" if pid in live else "gone",
            "heartbeat_age_s": round(max(0.0, now_ms - last) / 1000, 2),
            "shards": held.get(pid, []),
        }
        record = records.get(pid)
        if record is not None:
            item.update(_producer_figures(record))
        out.append(item)
    return out


def _producer_figures(record: ProducerRecord) -> dict[str, Any]:
    interval = record.interval_s or 0.0
    per_env = record.rss_bytes / record.envs / MB if record.envs else None
    baseline = record.rss_per_env_baseline
    return {
        "host": record.host, "pid": record.pid, "metrics_port": record.metrics_port,
        "traj_per_s": round(record.recent_committed / interval, 2) if interval > 0 else 0.0,
        "rss_mb": round(record.rss_bytes / MB, 1),
        "cpu_percent": round(100 * record.cpu_recent_s / interval, 1) if interval > 0 else 0.0,
        "envs": record.envs, "in_flight": record.in_flight, "committed": record.committed,
        "version": record.version, "paused": record.paused,
        "rss_per_env_mb": round(per_env, 3) if per_env is not None else None,
        "rss_per_env_baseline_mb": round(baseline / MB, 3) if baseline else None,
        "loop_stalls": record.loop_stalls, "recent_stalls": record.recent_stalls,
        "recent_stall_longest_s": round(record.recent_stall_longest_s, 2),
        "recent_stall_where": record.recent_stall_where,
    }


def _modes(config: RolloutConfig, raw: dict[str, Any], owners: dict[str, list[str | None]],
           live: set[str], records: dict[str, ProducerRecord]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in config.modes():
        manager = config.manager(mode)
        shard_owners = owners[mode]
        entries, pending = raw["streams"][mode]
        env_tags = Counter(manager.tag_of_group(g) for g in range(manager.num_env_groups))
        out[mode] = {
            "envs": manager.num_envs, "groups": manager.num_env_groups,
            "shards": manager.num_shards,
            "shards_leased": sum(1 for o in shard_owners if o is not None),
            "shards_without_live_producer": [s for s, o in enumerate(shard_owners)
                                             if o is None or o not in live],
            "entries": entries, "backlog": max(0, entries - pending), "pending": pending,
            "tags": {tag: _tag_figures(mode, tag, n * manager.members, records, live)
                     for tag, n in env_tags.items()},
        }
    return out


def _tag_figures(mode: str, tag: str, envs: int, records: dict[str, ProducerRecord],
                 live: set[str]) -> dict[str, Any]:
    """Rates from live producers' last interval; success and mean actions over that interval
    (over everything committed so far when the interval saw no episode)."""
    running = per_s = committed = 0.0
    recent = [0, 0, 0]  # committed, successes, actions
    total = [0, 0, 0]
    for pid, record in records.items():
        counts = record.tags.get(mode, {}).get(tag)
        if counts is None:
            continue
        total = [total[0] + counts.committed - counts.failed, total[1] + counts.successes,
                 total[2] + counts.actions]
        committed += counts.committed
        if pid not in live:
            continue
        running += counts.envs
        if record.interval_s > 0:
            per_s += counts.recent_committed / record.interval_s
        recent = [recent[0] + counts.recent_committed, recent[1] + counts.recent_successes,
                  recent[2] + counts.recent_actions]
    basis = recent if recent[0] else total
    return {
        "envs": envs, "envs_running": int(running), "episodes_per_s": round(per_s, 2),
        "success": round(basis[1] / basis[0], 4) if basis[0] else None,
        "mean_actions": round(basis[2] / basis[0], 3) if basis[0] else None,
        "committed": int(committed),
    }


def _batcher_records(raw: dict[Any, bytes]) -> list[BatcherRecord]:
    out = []
    for data in raw.values():
        try:
            out.append(BatcherRecord.decode(data))
        except (DecodeError, TypeError):
            continue
    return sorted(out, key=lambda r: r.consumer)


def _batchers(raw: dict[Any, bytes], alive: dict[str, Any]) -> list[dict[str, Any]]:
    """Each batcher's record; `gone` when its record is past its ttl or its liveness key is
    missing (the trainer's process died), `closed` when the key says it closed."""
    now = time.time()
    out = []
    for record in _batcher_records(raw):
        since = max(0.0, now - record.updated_at)
        key = alive.get(record.consumer)
        if key == BATCHER_CLOSED or record.state == "closed":
            state = "closed"
        elif since > record.ttl_s or not isinstance(key, bytes):
            state = "gone"
        else:
            state = record.state
        waited = record.waited_s + since if state == "waiting" else record.waited_s
        out.append({
            "consumer": record.consumer, "state": state, "mode": record.mode,
            "waiting_s": round(waited, 2), "wanted": record.wanted,
            "complete": record.complete, "partial": record.partial,
            "version": record.version, "batches": record.batches,
            "delivered": record.delivered,
        })
    return out


def _model_servers(raw: dict[Any, bytes], records: dict[str, ProducerRecord],
                   live: set[str]) -> list[dict[str, Any]]:
    """What `{RUN}:servers` records (a trainer's `ModelServers`): the weight version each
    model server holds; and which live producers have set a server aside, and why (also a
    server with no record)."""
    aside: dict[str, dict[str, str]] = defaultdict(dict)
    for pid, producer in records.items():
        if pid in live:
            for url, why in producer.servers_down.items():
                aside[url.rstrip("/")][pid] = why
    out = {}
    for url, value in sorted((_text(k), v) for k, v in raw.items()):
        record = read_server_record(value)
        if record is not None:
            out[url] = {"url": url, "version": record.version, "model": record.model,
                        "set_aside": {}}
    for url, by in aside.items():
        out.setdefault(url, {"url": url, "version": None, "model": None,
                             "set_aside": {}})["set_aside"] = dict(sorted(by.items()))
    return [out[url] for url in sorted(out)]


def _dropped(raw: dict[Any, bytes], dead: int) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for record in _batcher_records(raw):
        for name, value in record.totals.items():
            totals[name] += value
    return {"stale": totals["scheduler/stale_dropped"], "late": totals["scheduler/late_dropped"],
            "failed_groups": totals["scheduler/failed_groups"],
            "val_discarded": totals["scheduler/val_discarded"], "dead_letters": int(dead or 0)}


def _redis_memory(info: dict[str, Any], limits: Limits) -> dict[str, Any]:
    if "used_memory" not in info:  # a cluster client answers per node: count the fullest
        nodes = [v for v in info.values() if isinstance(v, dict) and "used_memory" in v]
        info = max(nodes, key=lambda n: float(n["used_memory"]), default={})
    maxmemory = float(info.get("maxmemory") or 0)
    limit = limits.redis_limit_mb
    if limit is None:
        limit = 0.8 * maxmemory / MB if maxmemory else 1024.0
    return {"used_mb": round(float(info.get("used_memory", 0)) / MB, 2),
            "peak_mb": round(float(info.get("used_memory_peak", 0)) / MB, 2),
            "maxmemory_mb": round(maxmemory / MB, 2), "limit_mb": round(limit, 2)}


# -- warnings --------------------------------------------------------------------------------------
def warnings(snap: dict[str, Any], limits: Limits) -> list[str]:
    """What an operator should look at, one line each."""
    out: list[str] = []
    for producer in snap["producers"]:
        out += _producer_warnings(producer, limits)
    for mode, info in snap["modes"].items():
        orphans = info["shards_without_live_producer"]
        if orphans and not snap["stopped"]:  # a stopped run's producers have left: expected
            out.append(f"{mode}: {len(orphans)}/{info['shards']} shard(s) with no live "
                       f"producer: {_ranges(orphans)}")
    for batcher in snap["batchers"]:
        if batcher["state"] == "waiting" and batcher["waiting_s"] > limits.wait_warn_s:
            out.append(_wait_warning(batcher, snap))
        if batcher["state"] == "gone" and not snap["stopped"]:  # (closed: it ended cleanly)
            held = " (the run stays paused until a trainer asks again)" \
                if "sync" in snap["pause"] else ""
            out.append(f"batcher {batcher['consumer']} is gone: its trainer died{held}; a "
                       "trainer started again gets its unacked batch again")
    for server in snap["model_servers"]:
        if server["set_aside"]:
            why = sorted(set(server["set_aside"].values()))
            out.append(f"model server {server['url']} set aside by {len(server['set_aside'])} "
                       f"producer(s): {why[0]}" + (f" (and {len(why) - 1} other reasons)"
                                                  if len(why) > 1 else ""))
        if server["version"] is None:
            continue
        behind = snap["version"] - server["version"]
        if behind > snap["ratio"]:
            out.append(f"model server {server['url']} holds weight version {server['version']}, "
                       f"{behind} behind the run's {snap['version']} (staleness bound "
                       f"{snap['ratio']}): its turns would be stale")
    memory = snap["redis"]
    if memory["used_mb"] > memory["limit_mb"]:
        out.append(f"Redis uses {memory['used_mb']:.1f} MB, past the {memory['limit_mb']:.0f} MB "
                   "limit (--redis-limit-mb; default 80% of maxmemory, else 1024 MB)")
    if snap["dropped"]["dead_letters"]:
        out.append(f"{snap['dropped']['dead_letters']} entries in the dead-letter stream "
                   "(undecodable trajectories)")
    return out


def _producer_warnings(producer: dict[str, Any], limits: Limits) -> list[str]:
    name = producer["id"]
    if producer["state"] == "gone":
        return [f"producer {name} is gone (no heartbeat for {producer['heartbeat_age_s']:.0f}s)"]
    out = []
    if producer.get("recent_stalls"):
        out.append(f"producer {name}: its event loop was blocked {producer['recent_stalls']} "
                   f"time(s) since its previous heartbeat, up to "
                   f"{producer['recent_stall_longest_s']:.1f}s, last in "
                   f"{producer['recent_stall_where']} (a blocking act or env step holds every "
                   "env of the producer)")
    per_env, baseline = producer.get("rss_per_env_mb"), producer.get("rss_per_env_baseline_mb")
    if per_env and baseline and per_env > limits.memory_growth * baseline:
        grown_mb = (per_env - baseline) * producer["envs"]
        if grown_mb >= limits.memory_growth_min_mb:
            out.append(f"producer {name}: memory per env grew from {baseline:.2f} to "
                       f"{per_env:.2f} MB ({grown_mb:.0f} MB more over {producer['envs']} envs)")
    return out


def _wait_warning(batcher: dict[str, Any], snap: dict[str, Any]) -> str:
    why = [f"{batcher['complete']}/{batcher['wanted']} complete groups, "
           f"{batcher['partial']} partial"]
    if snap["pause"]:
        why.append(f"paused: {', '.join(snap['pause'])}")
    if not snap["live_producers"]:
        why.append("no live producer")
    mode = snap["modes"].get(batcher["mode"], {})
    orphans = mode.get("shards_without_live_producer", [])
    if orphans:
        why.append(f"{len(orphans)} shard(s) with no live producer")
    if snap["stopped"]:
        why.append("the run is stopped")
    return (f"{batcher['consumer']} has waited {batcher['waiting_s']:.0f}s for a "
            f"{batcher['mode']} batch: {'; '.join(why)}")


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


# -- text ------------------------------------------------------------------------------------------
def render_text(snap: dict[str, Any]) -> str:
    """Plain lines (for logs, pipes and a one-shot `rollstream status`)."""
    stopped = ", stopped" if snap["stopped"] else ""
    lines = [f"run {snap['run']}: version {snap['version']}, val round {snap['val_round']}, "
             f"pause reasons {snap['pause'] or 'none'}, live producers "
             f"{snap['live_producers']}{stopped}"]
    if snap.get("node"):
        lines.append(f"  held by {snap['node']}")
    for mode, info in snap["modes"].items():
        lines.append(f"  {mode}: {info['entries']} entries in streams, {info['shards_leased']}/"
                     f"{info['shards']} shards leased, consumer group {CONSUMER_GROUP!r}; "
                     f"{info['backlog']} unread, {info['pending']} pending")
        for tag, t in info["tags"].items():
            lines.append(f"    {tag}: {t['envs_running']}/{t['envs']} envs, "
                         f"{t['episodes_per_s']:.1f} episodes/s, success {_num(t['success'])}, "
                         f"mean actions {_num(t['mean_actions'])}")
    if snap["producers"]:
        lines.append("producers:")
    for p in snap["producers"]:
        lines.append(f"  {p['id']} {p['state']}, heartbeat {p['heartbeat_age_s']:.1f}s ago, "
                     f"shards {','.join(p['shards']) or '-'}" + _producer_tail(p))
    if snap["batchers"]:
        lines.append("batchers:")
    for b in snap["batchers"]:
        lines.append(f"  {b['consumer']} {_batcher_state(b)}, v{b['version']}, "
                     f"{b['batches']} batches, {b['delivered']} trajectories delivered")
    if snap["model_servers"]:
        lines.append(_servers_line(snap))
    d, m = snap["dropped"], snap["redis"]
    lines.append(f"dropped: stale {d['stale']:.0f}, late {d['late']:.0f}, failed groups "
                 f"{d['failed_groups']:.0f}, dead letters {d['dead_letters']}; redis "
                 f"{m['used_mb']:.1f} MB (peak {m['peak_mb']:.1f} MB)")
    if snap["warnings"]:
        lines.append("warnings:")
        lines += [f"  ! {w}" for w in snap["warnings"]]
    return "\n".join(lines)


def _servers_line(snap: dict[str, Any]) -> str:
    return "model servers: " + ", ".join(
        f"{ms['url']} " + (f"v{ms['version']}" if ms["version"] is not None else "v?")
        + (" (set aside)" if ms["set_aside"] else "") for ms in snap["model_servers"])


def _producer_tail(p: dict[str, Any]) -> str:
    if "rss_mb" not in p:
        return ""
    port = f", metrics :{p['metrics_port']}" if p.get("metrics_port") else ""
    return (f", {p['traj_per_s']:.1f} traj/s, rss {p['rss_mb']:.0f} MB, cpu "
            f"{p['cpu_percent']:.0f}%, {p['envs']} envs ({p['in_flight']} in an episode)"
            f"{port}")


def _batcher_state(b: dict[str, Any]) -> str:
    if b["state"] == "waiting":
        return (f"waiting {b['waiting_s']:.1f}s for a {b['mode']} batch ({b['complete']}/"
                f"{b['wanted']} complete groups, {b['partial']} partial)")
    if b["state"] == "handed":
        return f"handed out a {b['mode']} batch (waited {b['waiting_s']:.2f}s)"
    if b["state"] == "timed_out":
        return f"timed out waiting {b['waiting_s']:.1f}s for a {b['mode']} batch"
    if b["state"] == "closed":
        return "closed (its trainer ended)"
    return "gone (its liveness key expired: the trainer's process died)"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# -- rich ------------------------------------------------------------------------------------------
def render_rich(snap: dict[str, Any]) -> Any:
    """The same snapshot as rich tables (for a terminal)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    stopped = "  [red]stopped[/red]" if snap["stopped"] else ""
    mode = "sync" if snap["sync"] else f"async (ratio {snap['ratio']})"
    head = Text.from_markup(
        f"[bold]run {snap['run']}[/bold]  version {snap['version']}  {mode}  pause "
        f"{', '.join(snap['pause']) or 'none'}  live producers {snap['live_producers']}  "
        f"redis {snap['redis']['used_mb']:.1f} MB{stopped}")
    producers = Table("producer", "state", "heartbeat", "shards", "traj/s", "RSS MB", "CPU %",
                      "envs", "in episode", title="producers", title_justify="left")
    for p in snap["producers"]:
        state = "[green]live[/green]" if p["state"] == "live" else "[red]gone[/red]"
        producers.add_row(p["id"], state, f"{p['heartbeat_age_s']:.1f}s",
                          ",".join(p["shards"]) or "-", _cell(p, "traj_per_s", "{:.1f}"),
                          _cell(p, "rss_mb", "{:.0f}"), _cell(p, "cpu_percent", "{:.0f}"),
                          _cell(p, "envs", "{}"), _cell(p, "in_flight", "{}"))
    modes = Table("mode", "tag", "envs", "episodes/s", "success", "mean actions", "backlog",
                  "pending", "shards leased", title="modes", title_justify="left")
    for name, info in snap["modes"].items():
        for tag, t in info["tags"].items():
            modes.add_row(name, tag, f"{t['envs_running']}/{t['envs']}",
                          f"{t['episodes_per_s']:.1f}", _num(t["success"]),
                          _num(t["mean_actions"]), str(info["backlog"]), str(info["pending"]),
                          f"{info['shards_leased']}/{info['shards']}")
    d = snap["dropped"]
    parts: list[Any] = [head, producers, modes]
    parts += [Text(f"batcher {b['consumer']}: {_batcher_state(b)}") for b in snap["batchers"]]
    if snap["model_servers"]:
        parts.append(Text(_servers_line(snap)))
    parts.append(Text(f"dropped: stale {d['stale']:.0f}, late {d['late']:.0f}, failed groups "
                      f"{d['failed_groups']:.0f}, dead letters {d['dead_letters']}"))
    parts += [Text(f"! {w}", style="bold yellow") for w in snap["warnings"]]
    return Group(*parts)


def _cell(item: dict[str, Any], name: str, fmt: str) -> str:
    value = item.get(name)
    return "-" if value is None else fmt.format(value)


# -- the loop --------------------------------------------------------------------------------------
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


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
