"""What a run reports about itself: the records producers and batchers keep in Redis for
`rollstream status`, and the plain counters behind the Prometheus `/metrics` pages.

Both sides count with plain Python numbers (an integer add per episode or batch, never per
env step) and turn them into Prometheus metric families only when `/metrics` is scraped, so
a run with no metrics port pays next to nothing. prometheus-client is the optional `metrics`
extra, imported only by `serve_metrics`.

Records (msgpack maps, one per producer / batcher) are written at heartbeat cadence:
- `{RUN}:producer_stats` (hash) producer id -> `ProducerRecord`; `{RUN}:producer_seen` (zset)
  producer id -> time of its last record on the Redis server's clock. Both are trimmed of
  producers silent for `STATS_KEEP_S`, so a killed producer stays visible as gone that long.
- `{RUN}:batchers` (hash) consumer name -> `BatcherRecord`: whether `get_batch` is waiting,
  for how long and for what.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from schemas.codec import pack, unpack
from schemas.errors import ConfigError, DecodeError, RollstreamError

logger = logging.getLogger(__name__)

STATS_KEEP_S = 600.0  # a producer silent this long is dropped from the stats records
RECORD_MIN_INTERVAL_S = 1.0  # records are written at most this often (heartbeats can bunch)
METRICS_EXTRA = "pip install 'rollstream[metrics]'"

# Histogram bucket bounds, seconds
WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  120.0)
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
LLM_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


# -- records -------------------------------------------------------------------------------------
@dataclass
class TagCounts:
    """One (mode, tag) of a producer: counts since it started, and since its last record."""

    envs: int = 0  # envs of this tag it runs now
    committed: int = 0  # trajectories committed (failed ones included)
    failed: int = 0  # failed trajectories (the env kept raising)
    successes: int = 0
    actions: int = 0  # sum of num_actions over committed, non-failed trajectories
    recent_committed: int = 0  # the same three, since the previous record
    recent_successes: int = 0
    recent_actions: int = 0


@dataclass
class ProducerRecord:
    """A producer's stats record, written with its heartbeat."""

    producer: str
    host: str = ""
    pid: int = 0
    started_at: float = 0.0  # wall clock
    metrics_port: int | None = None
    rss_bytes: int = 0
    cpu_s: float = 0.0  # user + system, since it started
    interval_s: float = 0.0  # since the previous record
    cpu_recent_s: float = 0.0  # CPU seconds in that interval
    rss_per_env_baseline: float | None = None  # bytes per env once warm (see ProducerStats)
    version: int = 0
    paused: bool = False
    envs: int = 0
    in_flight: int = 0  # envs with an episode started, not yet committed or abandoned
    committed: int = 0
    recent_committed: int = 0
    abandoned: int = 0
    env_errors: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # commit refusals by reason
    tags: dict[str, dict[str, TagCounts]] = field(default_factory=dict)  # mode -> tag ->
    servers_down: dict[str, str] = field(default_factory=dict)  # model servers set aside now:
    # base URL -> why
    sessions: dict[str, int] = field(default_factory=dict)  # sticky sessions' requests since
    # it started, by outcome: preferred (own server), down, overloaded (moved)
    loop_stalls: int = 0  # times its event loop was blocked, since it started
    recent_stalls: int = 0  # of those, since the previous record
    recent_stall_longest_s: float = 0.0
    recent_stall_where: str = ""  # where the loop's thread was in the last of them
    tokens_discarded: dict[str, int] = field(default_factory=dict)  # generated tokens thrown
    # away by reason (aborted, abandoned, failed, stopped), since the process started
    turns_continued: dict[str, int] = field(default_factory=dict)  # model turns continued
    # across a weight update instead of sent again, since the process started: kept (paused,
    # their tokens span versions), resumed (aborted, continued from their tokens)

    def encode(self) -> bytes:
        return pack(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> ProducerRecord:
        raw = _record_map(data)
        tags = {mode: {tag: _known(TagCounts, counts) for tag, counts in by_tag.items()}
                for mode, by_tag in (raw.pop("tags", None) or {}).items()}
        return _known(cls, raw, tags=tags)


@dataclass
class BatcherRecord:
    """A Batcher's state: waiting in `get_batch` (since when, for what) or handed out."""

    consumer: str
    mode: str = "train"
    state: str = "waiting"  # waiting | handed | timed_out
    updated_at: float = 0.0  # the batcher's wall clock
    ttl_s: float = 30.0  # past updated_at + ttl_s the record is stale (the batcher is gone)
    waited_s: float = 0.0  # waiting: seconds so far at updated_at; handed: the last wait
    wanted: int = 0  # complete groups wanted
    complete: int = 0  # complete groups held
    partial: int = 0  # partial groups held
    version: int = 0
    batches: int = 0  # handed out since the Batcher started
    delivered: int = 0  # trajectories handed out since then
    totals: dict[str, float] = field(default_factory=dict)  # Batcher.totals

    def encode(self) -> bytes:
        return pack(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> BatcherRecord:
        return _known(cls, _record_map(data))


def _record_map(data: bytes) -> dict[str, Any]:
    try:
        raw = unpack(data)
    except Exception as exc:  # msgpack raises several types for garbage
        raise DecodeError(f"stats record is not msgpack: {exc}") from None
    if not isinstance(raw, dict):
        raise DecodeError("stats record is not a map")
    return raw


def _known(cls: Any, raw: Mapping[str, Any], **override: Any) -> Any:
    """`cls` from the fields of `raw` it knows (a newer writer's extra fields are skipped)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in raw.items() if k in names}, **override)


# -- plain counters ----------------------------------------------------------------------------
class Histogram:
    """A Prometheus-style histogram kept in plain numbers: `observe` is a bisect and two
    adds; `observe_many` one numpy call for a whole batch."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last bucket: above every bound
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def observe_many(self, values: np.ndarray) -> None:
        if not len(values):
            return
        index = np.searchsorted(self.bounds, values, side="left")
        for i, n in enumerate(np.bincount(index, minlength=len(self.counts)).tolist()):
            self.counts[i] += n
        self.total += float(np.sum(values))

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, ending with `+Inf`."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), list(self.counts), strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


def process_usage() -> tuple[int, float]:
    """(resident memory in bytes, user + system CPU seconds) of this process."""
    times = os.times()
    cpu_s = times.user + times.system
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE"), cpu_s
    except (OSError, ValueError, IndexError):  # not Linux: the peak is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, cpu_s


# -- Prometheus ----------------------------------------------------------------------------------
Family = Any  # a prometheus_client metric family
Sample = tuple[Sequence[str], float]  # label values, value


def _prometheus() -> Any:
    try:
        import prometheus_client.core as core
    except ImportError:
        raise RollstreamError(f"metrics need prometheus-client: {METRICS_EXTRA}") from None
    return core


def counter(name: str, doc: str, labels: Sequence[str], samples: Iterable[Sample]) -> Family:
    """A counter family `name` (without `_total`: prometheus-client adds it)."""
    family = _prometheus().CounterMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def gauge(name: str, doc: str, labels: Sequence[str], samples: Iterable[Sample]) -> Family:
    family = _prometheus().GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def histogram(name: str, doc: str, labels: Sequence[str],
              items: Iterable[tuple[Sequence[str], Histogram]]) -> Family:
    family = _prometheus().HistogramMetricFamily(name, doc, labels=list(labels))
    for values, hist in items:
        family.add_metric(list(values), hist.buckets(), hist.total)
    return family


class _Collector:
    """Adapts a function returning metric families to prometheus-client's collector API."""

    def __init__(self, collect: Callable[[], Iterable[Family]]):
        self._collect = collect

    def collect(self) -> Iterable[Family]:
        try:
            yield from self._collect()
        except Exception:  # a scrape must not kill the page: log it, serve what there is
            logger.exception("collecting metrics failed")


class MetricsServer:
    """A `/metrics` page on its own thread (prometheus-client's server); `close()` stops it."""

    def __init__(self, server: Any, thread: Any):
        self._server = server
        self._thread = thread
        self.port: int = server.server_port
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(collect: Callable[[], Iterable[Family]], port: int, addr: str = "0.0.0.0",
                  *, what: str = "metrics") -> MetricsServer:
    """Serve `collect()`'s families, plus this process's memory and CPU, at
    `http://addr:port/metrics` (port 0: any free port, see `.port`)."""
    core = _prometheus()
    from prometheus_client import ProcessCollector, start_http_server

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"metrics port {port!r}: not a port number (0..65535)")
    registry = core.CollectorRegistry(auto_describe=False)
    registry.register(_Collector(collect))
    ProcessCollector(registry=registry)
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise ConfigError(f"metrics port {port}: cannot serve {what} on {addr}:{port} "
                          f"({exc.strerror or exc})") from None
    result = MetricsServer(server, thread)
    logger.info("%s at http://%s:%d/metrics", what, addr, result.port)
    return result


def elapsed_since(wall_s: float) -> float:
    """Seconds since a wall-clock time (never negative: clocks of two hosts may differ)."""
    return max(0.0, time.time() - wall_s)
