"""A producer's counters: plain numbers bumped per episode, commit and flush (never per env
step), read by its heartbeat's stats record and, with `--metrics-port`, by `/metrics`.

LLM policies record their requests here with two calls, process-wide (a producer process
serves one `/metrics` page, as Prometheus's own default registry is process-wide):

    from producers import metrics
    metrics.llm_request(server_url, latency_s)   # each request a server answered
    metrics.llm_error(server_url, reason)        # each failed attempt: timeout, connection,
                                                 #   http_5xx, http_429, http_4xx, bad_reply,
                                                 #   lost_weights (a restarted server)
    metrics.llm_session(outcome)                 # a sticky session's request: preferred,
                                                 #   down, overloaded (producers.llm.routing)
    metrics.turn_continued(mode, how)            # a turn continued across a weight update:
                                                 #   kept (paused, its tokens span versions)
                                                 #   or resumed (aborted, continued from its
                                                 #   tokens: policy.partial_rollout)
Each costs a dict lookup and a bisect; they are recorded whether or not metrics are served.
"""

from __future__ import annotations

import os
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from schemas.connection import mask_url
from schemas.stats import (
    LLM_BUCKETS_S,
    Family,
    Histogram,
    MetricsServer,
    ProducerRecord,
    TagCounts,
    counter,
    gauge,
    histogram,
    process_usage,
    serve_metrics,
)

WARM_S = 30.0  # the memory baseline is taken once the env count has held this long


# -- LLM requests (process-wide) ---------------------------------------------------------------
class LlmCounters:
    """Request latency per server and errors per (server, reason)."""

    def __init__(self) -> None:
        self.latency: dict[str, Histogram] = {}
        self.errors: dict[tuple[str, str], int] = defaultdict(int)
        self._names: dict[str, str] = {}  # server URL -> its label (a password masked)
        # generated tokens thrown away, by (mode, reason): aborted (a turn the server aborted
        # at an update or pause, sent again), abandoned (an episode expired or left
        # mid-way), failed (its env or model request failed), stopped (the producer stopped)
        self.discarded: dict[tuple[str, str], int] = defaultdict(int)
        self.sessions: dict[str, int] = defaultdict(int)  # sticky routing: outcome -> requests
        # turns continued across a weight update instead of sent again, by (mode, how): kept
        # (paused and finished under the new weights: its tokens span versions), resumed
        # (aborted and continued from the tokens it had: `in_flight: resume`)
        self.continued: dict[tuple[str, str], int] = defaultdict(int)

    def request(self, server: str, latency_s: float) -> None:
        hist = self.latency.get(server)
        if hist is None:
            hist = self.latency[server] = Histogram(LLM_BUCKETS_S)
        hist.observe(latency_s)

    def error(self, server: str, reason: str) -> None:
        self.errors[(server, reason)] += 1

    def tokens_discarded(self, mode: str, reason: str, tokens: int) -> None:
        self.discarded[(mode, reason)] += tokens
    def session(self, outcome: str) -> None:
        self.sessions[outcome] += 1

    def turn_continued(self, mode: str, how: str) -> None:
        self.continued[(mode, how)] += 1

    def label(self, server: str) -> str:
        name = self._names.get(server)
        if name is None:
            name = self._names[server] = mask_url(server)
        return name

    def families(self) -> Iterator[Family]:
        if self.latency:
            yield histogram("rollstream_llm_request_seconds",
                            "Latency of model requests a server answered", ["server"],
                            [((self.label(s),), h) for s, h in list(self.latency.items())])
        if self.errors:
            yield counter("rollstream_llm_request_errors",
                          "Failed model request attempts by server and reason",
                          ["server", "reason"], [((self.label(s), reason), n) for (s, reason), n
                                                 in list(self.errors.items())])
        if self.discarded:
            yield counter("rollstream_tokens_discarded",
                          "Generated tokens a producer threw away, by mode and reason "
                          "(aborted, abandoned, failed, stopped)", ["mode", "reason"],
                          list(self.discarded.items()))
        for how, doc in (("kept", "paused through a weight update and finished under the "
                                  "new weights (its tokens span versions)"),
                         ("resumed", "aborted by a weight update and continued from the tokens "
                                     "it had (in_flight: resume)")):
            rows = [((mode,), n) for (mode, h), n in list(self.continued.items()) if h == how]
            if rows:
                yield counter(f"rollstream_turns_{how}", f"Model turns {doc}, by mode",
                              ["mode"], rows)
        if self.sessions:
            yield counter("rollstream_llm_session_requests",
                          "Requests of sticky sessions by where they went: preferred (the "
                          "session's own server), down or overloaded (moved to its next one)",
                          ["outcome"], [((o,), n) for o, n in list(self.sessions.items())])


LLM = LlmCounters()


def llm_request(server: str, latency_s: float) -> None:
    """Record one answered model request (its server's base URL, seconds it took)."""
    LLM.request(server, latency_s)


def llm_error(server: str, reason: str) -> None:
    """Record one failed attempt (`timeout`, `connection`, `http_5xx`, `http_429`, `http_4xx`,
    `bad_reply`, or another short word)."""
    LLM.error(server, reason)


def tokens_discarded(mode: str, reason: str, tokens: int) -> None:
    """Record `tokens` generated tokens thrown away (`aborted`, `abandoned`, `failed`,
    `stopped`)."""
    LLM.tokens_discarded(mode, reason, tokens)
def turn_continued(mode: str, how: str) -> None:
    """Record a turn continued across a weight update: `kept` or `resumed` (see
    `LlmCounters.continued`)."""
    LLM.turn_continued(mode, how)


def llm_session(outcome: str) -> None:
    """Record where a sticky session's request went (`producers.llm.routing`: preferred,
    down, overloaded)."""
    LLM.session(outcome)


# -- the producer's own counters ---------------------------------------------------------------
@dataclass
class Held:
    """What a producer holds right now, as its collector and record see it."""

    shards: dict[str, int] = field(default_factory=dict)  # mode -> shards
    envs: dict[tuple[str, str], int] = field(default_factory=dict)  # (mode, tag) -> envs
    version: int = 0
    paused: bool = False
    servers_down: dict[str, str] = field(default_factory=dict)  # model servers set aside


class ProducerStats:
    """Counters of one producer. Each method is a few integer adds; call once per event."""

    def __init__(self, producer_id: str) -> None:
        self.producer_id = producer_id
        self.started_at = time.time()
        self.metrics_port: int | None = None
        self.tags: dict[tuple[str, str], TagCounts] = {}
        self.refused: dict[tuple[str, str], int] = defaultdict(int)  # (mode, reason)
        self.abandoned: dict[tuple[str, str, str], int] = defaultdict(int)  # mode, tag, reason
        self.replayed: dict[tuple[str, str], int] = defaultdict(int)  # an env raised: retry
        self.env_errors: dict[tuple[str, str], int] = defaultdict(int)
        self.resumed: dict[str, int] = defaultdict(int)  # envs started at an earlier cursor
        self.in_flight: dict[str, int] = defaultdict(int)  # mode -> envs in an episode
        self.context_full_by: dict[tuple[str, str], int] = defaultdict(int)  # (mode, tag)
        self.loop_stalls = 0  # times the event loop was blocked (see producers/stall.py)
        self.loop_stalled_s = 0.0
        self._recent_stalls: tuple[int, float, str] = (0, 0.0, "")  # count, longest, where
        self.held: Callable[[], Held] = Held
        self._last_at = time.monotonic()
        self._last_cpu = process_usage()[1]
        self._envs_since: tuple[int, float] = (0, time.monotonic())  # env count, since when
        self._baseline: float | None = None

    def _tag(self, mode: str, tag: str) -> TagCounts:
        counts = self.tags.get((mode, tag))
        if counts is None:
            counts = self.tags[(mode, tag)] = TagCounts()
        return counts

    # events
    def committed(self, mode: str, tag: str, failed: bool, success: bool,
                  num_actions: int) -> None:
        """A trajectory was committed: whether it is a failed one, its success, its actions."""
        counts = self._tag(mode, tag)
        counts.committed += 1
        counts.recent_committed += 1
        if failed:
            counts.failed += 1
            return
        won = 1 if success else 0
        counts.successes += won
        counts.recent_successes += won
        counts.actions += num_actions
        counts.recent_actions += num_actions

    def refused_commit(self, mode: str, reason: str) -> None:
        self.refused[(mode, reason)] += 1

    def abandoned_episode(self, mode: str, tag: str, reason: str) -> None:
        self.abandoned[(mode, tag, reason)] += 1

    def env_error(self, mode: str, tag: str, retried: bool) -> None:
        self.env_errors[(mode, tag)] += 1
        if retried:
            self.replayed[(mode, tag)] += 1

    def context_full(self, mode: str, tag: str) -> int:
        """An episode ended by the model's context window; returns how many so far."""
        self.context_full_by[(mode, tag)] += 1
        return sum(self.context_full_by.values())

    def loop_stalled(self, seconds: float, where: str) -> None:
        """The event loop was blocked `seconds` (a `LoopWatch` saw it), last in `where`."""
        self.loop_stalls += 1
        self.loop_stalled_s += seconds
        count, longest, _ = self._recent_stalls
        self._recent_stalls = (count + 1, max(longest, seconds), where)

    # the heartbeat's record
    def record(self) -> ProducerRecord:
        """The stats record for this heartbeat; starts the next 'recent' interval."""
        held = self.held()
        now = time.monotonic()
        rss, cpu = process_usage()
        envs = sum(held.envs.values())
        tags: dict[str, dict[str, TagCounts]] = defaultdict(dict)
        for (mode, tag), counts in list(self.tags.items()):
            tags[mode][tag] = TagCounts(**vars(counts))
        for (mode, tag), n in held.envs.items():
            tags[mode].setdefault(tag, TagCounts()).envs = n
        record = ProducerRecord(
            producer=self.producer_id, host=socket.gethostname(), pid=os.getpid(),
            started_at=self.started_at, metrics_port=self.metrics_port, rss_bytes=rss,
            cpu_s=cpu, interval_s=now - self._last_at, cpu_recent_s=cpu - self._last_cpu,
            rss_per_env_baseline=self._memory_baseline(envs, rss, now),
            version=held.version, paused=held.paused, envs=envs,
            in_flight=sum(self.in_flight.values()),
            committed=sum(c.committed for c in tags_values(tags)),
            recent_committed=sum(c.recent_committed for c in tags_values(tags)),
            abandoned=sum(self.abandoned.values()), env_errors=sum(self.env_errors.values()),
            refused=_by_last(self.refused), tags=dict(tags),
            servers_down=dict(held.servers_down), sessions=dict(LLM.sessions),
            loop_stalls=self.loop_stalls,
            recent_stalls=self._recent_stalls[0], recent_stall_longest_s=self._recent_stalls[1],
            recent_stall_where=self._recent_stalls[2],
            tokens_discarded=_by_last(dict(LLM.discarded)),
            turns_continued=_by_last(dict(LLM.continued)),
        )
        self._recent_stalls = (0, 0.0, "")
        for counts in self.tags.values():
            counts.recent_committed = counts.recent_successes = counts.recent_actions = 0
        self._last_at, self._last_cpu = now, cpu
        return record

    def _memory_baseline(self, envs: int, rss: int, now: float) -> float | None:
        """Bytes per env once warm: taken when the env count has held `WARM_S`, taken again
        when it changes. A later record far above it means memory grows per env."""
        count, since = self._envs_since
        if envs != count:
            self._envs_since, self._baseline = (envs, now), None
        elif envs and self._baseline is None and now - since >= WARM_S:
            self._baseline = rss / envs
        return self._baseline

    # Prometheus
    def families(self) -> Iterator[Family]:
        held = self.held()
        tags = list(self.tags.items())
        yield counter("rollstream_trajectories_committed",
                      "Trajectories committed to the streams", ["mode", "tag"],
                      [(key, c.committed) for key, c in tags])
        yield counter("rollstream_trajectories_failed",
                      "Failed trajectories committed (the env kept raising; the group is "
                      "dropped)", ["mode", "tag"], [(key, c.failed) for key, c in tags])
        yield counter("rollstream_episode_successes",
                      "Committed trajectories whose episode succeeded", ["mode", "tag"],
                      [(key, c.successes) for key, c in tags])
        yield counter("rollstream_episode_actions",
                      "Actions of the committed trajectories", ["mode", "tag"],
                      [(key, c.actions) for key, c in tags])
        yield counter("rollstream_commits_refused",
                      "Commits the commit script refused or found done, by reason "
                      "(lease_lost, paused, stale_round, duplicate)", ["mode", "reason"],
                      list(self.refused.items()))
        yield counter("rollstream_episodes_abandoned",
                      "Episodes given up: expired (never played again) or leaving (a stop, "
                      "handover or lost lease: the next holder replays it, same seed)",
                      ["mode", "tag", "reason"], list(self.abandoned.items()))
        yield counter("rollstream_episodes_replayed",
                      "Episodes played again with the same seed after their env raised",
                      ["mode", "tag"], list(self.replayed.items()))
        yield counter("rollstream_episodes_context_full",
                      "Episodes ended truncated because the conversation outgrew the model's "
                      "context window (committed with their turns)", ["mode", "tag"],
                      list(self.context_full_by.items()))
        yield counter("rollstream_env_errors", "Exceptions raised by envs", ["mode", "tag"],
                      list(self.env_errors.items()))
        yield counter("rollstream_envs_resumed",
                      "Envs started at a cursor an earlier holder of their shard left "
                      "(a takeover or handover)", ["mode"],
                      [((m,), n) for m, n in list(self.resumed.items())])
        yield counter("rollstream_event_loop_stalls",
                      "Times this producer's event loop was blocked past the stall threshold "
                      "(a policy's act or an env's step that blocks: every env waits)", [],
                      [((), self.loop_stalls)])
        yield counter("rollstream_event_loop_stalled_seconds",
                      "Seconds this producer's event loop spent in those stalls", [],
                      [((), self.loop_stalled_s)])
        yield gauge("rollstream_shards_held", "Shards this producer holds", ["mode"],
                    [((m,), n) for m, n in held.shards.items()])
        yield gauge("rollstream_envs_held", "Envs of the shards this producer holds",
                    ["mode", "tag"], list(held.envs.items()))
        yield gauge("rollstream_envs_in_flight",
                    "Envs with an episode started, not yet committed or abandoned", ["mode"],
                    [((m,), n) for m, n in list(self.in_flight.items())])
        yield gauge("rollstream_producer_version", "Policy version this producer acts with",
                    [], [((), held.version)])
        yield gauge("rollstream_producer_paused", "1 while train rollouts are paused", [],
                    [((), 1 if held.paused else 0)])
        yield from LLM.families()

    def serve(self, port: int, addr: str = "0.0.0.0") -> MetricsServer:
        server = serve_metrics(self.families, port, addr, what="producer metrics")
        self.metrics_port = server.port
        return server


def tags_values(tags: dict[str, dict[str, TagCounts]]) -> Iterable[TagCounts]:
    return (counts for by_tag in tags.values() for counts in by_tag.values())


def _by_last(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    """Sum (mode, reason) counts by reason."""
    out: dict[str, int] = defaultdict(int)
    for (_, reason), n in list(counts.items()):
        out[reason] += n
    return dict(out)
