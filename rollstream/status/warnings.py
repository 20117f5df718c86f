"""What `rollstream status` warns of, one line each: gone producers and batchers, a blocked
event loop, memory per env grown past its baseline, shards with no live producer, a long
get_batch wait, a model server set aside or behind, Redis memory, dead letters. `Limits`
says when."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Limits:
    """When status warns."""

    wait_warn_s: float = 30.0  # get_batch waiting longer than this
    redis_limit_mb: float | None = None  # default: 80% of maxmemory, else 1024 MB
    memory_growth: float = 1.5  # rss per env this many times its warm baseline ...
    memory_growth_min_mb: float = 64.0  # ... and at least this much above it


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
