"""A status snapshot (`rollstream/status/snapshot.py`) for people: plain lines
(`render_text`: logs, pipes, a one-shot `rollstream status`) or rich tables (`render_rich`:
a terminal)."""

from __future__ import annotations

from typing import Any

from schemas.keys import CONSUMER_GROUP


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
    if snap.get("tokens_discarded") or any((snap.get("turns_continued") or {}).values()):
        lines.append(_discarded_line(snap))
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
    affinity = p.get("session_affinity")
    sticky = (f", sessions {100 * affinity:.0f}% on their server" if affinity is not None
              else "")
    return (f", {p['traj_per_s']:.1f} traj/s, rss {p['rss_mb']:.0f} MB, cpu "
            f"{p['cpu_percent']:.0f}%, {p['envs']} envs ({p['in_flight']} in an episode)"
            f"{sticky}{port}")


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
    if snap.get("tokens_discarded") or any((snap.get("turns_continued") or {}).values()):
        parts.append(Text(_discarded_line(snap)))
    parts += [Text(f"! {w}", style="bold yellow") for w in snap["warnings"]]
    return Group(*parts)


def _cell(item: dict[str, Any], name: str, fmt: str) -> str:
    value = item.get(name)
    return "-" if value is None else fmt.format(value)


def _discarded_line(snap: dict[str, Any]) -> str:
    """Generated tokens thrown away, by reason; the turns continued across a weight update
    (kept, resumed) instead of sent again."""
    line = "tokens discarded: " + (", ".join(f"{reason} {n:.0f}" for reason, n
                                             in snap["tokens_discarded"].items()) or "none")
    continued = snap.get("turns_continued") or {}
    if any(continued.values()):
        line += (f"; turns across weight updates: kept {continued.get('kept', 0)}, resumed "
                 f"{continued.get('resumed', 0)}")
    return line
