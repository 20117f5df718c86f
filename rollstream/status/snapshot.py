"""The snapshot of `rollstream status`: what a run is doing, read from Redis.

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
                    "recent_stall_where", "session_affinity", "sessions": {OUTCOME: n}}],
                    (sticky sessions, producers/llm/routing.py: the share of their requests
                    sent to their own server, and counts by outcome; stalls: its event loop
                    blocked, producers/stall.py)
     "modes": {MODE: {"envs", "groups", "shards", "shards_leased",
                      "shards_without_live_producer": [int], "entries", "backlog", "pending",
                      "tags": {TAG: {"envs", "envs_running", "episodes_per_s", "success",
                                     "mean_actions", "committed"}}}},
     "batchers": [{"consumer", "state": waiting|handed|timed_out|closed|gone, "mode", "waiting_s",
                   "wanted", "complete", "partial", "version", "batches", "delivered"}],
     "dropped": {"stale", "late", "failed_groups", "val_discarded", "dead_letters"},
     "tokens_discarded": {REASON: tokens},  (generated tokens thrown away: producers' aborted,
                      abandoned, failed, stopped; batchers' stale, late, val_discarded,
                      failed_group, filtered)
     "turns_continued": {"kept": n, "resumed": n},  (the producers' model turns continued
                      across a weight update instead of sent again: kept, paused through it;
                      resumed, aborted and continued from their tokens; policy.partial_rollout)
     "redis": {"used_mb", "peak_mb", "maxmemory_mb", "limit_mb"},
     "model_servers": [{"url", "version", "model", "set_aside": {producer: why}}],  (what a
                      trainer's ModelServers recorded; which live producers set it aside)
     "warnings": [str]}
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any

from rollstream.status.warnings import Limits, warnings
from schemas.config import RolloutConfig
from schemas.errors import DecodeError
from schemas.keys import BATCHER_CLOSED, CONSUMER_GROUP, Keys
from schemas.policy import read_server_record
from schemas.redisconn import SyncClient, server_ms
from schemas.stats import BatcherRecord, ProducerRecord

MB = 2**20


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
    snap["tokens_discarded"] = _tokens_discarded(raw["batchers"], records)
    snap["turns_continued"] = _turns_continued(records)
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
        "session_affinity": _affinity(record.sessions), "sessions": dict(record.sessions),
    }


def _affinity(sessions: dict[str, int]) -> float | None:
    """The share of sticky sessions' requests that went to their own server (None: none)."""
    total = sum(sessions.values())
    return round(sessions.get("preferred", 0) / total, 4) if total else None


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


def _tokens_discarded(raw: dict[Any, bytes], records: dict[str, ProducerRecord]
                      ) -> dict[str, float]:
    """Generated tokens thrown away, by reason: the producers' (aborted, abandoned, failed,
    stopped) and the batchers' (stale, late, val_discarded, failed_group, filtered)."""
    out: dict[str, float] = defaultdict(float)
    for record in records.values():
        for reason, n in record.tokens_discarded.items():
            out[reason] += n
    for batcher in _batcher_records(raw):
        for name, value in batcher.totals.items():
            if name.startswith("tokens_discarded/"):
                out[name.split("/", 1)[1]] += value
    return dict(sorted(out.items()))


def _turns_continued(records: dict[str, ProducerRecord]) -> dict[str, int]:
    """The producers' turns continued across a weight update: kept and resumed."""
    out = {"kept": 0, "resumed": 0}
    for record in records.values():
        for how, n in record.turns_continued.items():
            out[how] = out.get(how, 0) + int(n)
    return out


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


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
