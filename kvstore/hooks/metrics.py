"""The proxy's counters: `/kvstore/stats`'s `counters` (`snapshot()`) and the Prometheus text of `/metrics`.

Contract: `/metrics` is written by `prometheus_client` (one registry per server, made per scrape): the counters
and gauges below, and save/restore latency as histograms (`kvstore_{save,restore}_seconds_{bucket,sum,count}`).
The status page's own latency percentiles and time series are `kvstore.page.History`'s; `evicted(reason, n)` counts
an eviction pass's victims in both (`kvstore_evictions_total{reason}` and the page's evictions over time).
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any, Iterator, Optional, Union

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvstore.page import EVICTION_REASONS, History

KINDS = ("slot", "restored", "parent", "prefix", "miss")
OPS = ("save", "restore")

# counter name (without `_total`) -> help; the value is `snapshot()[key]`
COUNTERS = {
    "restore_failures": "Restores that failed (corrupt object, fingerprint, llama-server).",
    "restores_prefetched": "Restores whose state was materialized while the request waited for a slot.",
    "save_failures": "Saves or ingests that failed.",
    "saves_behind": "Saves of a slot handed to another request whose ingest ran behind that request.",
    "fork_states": "States stored at a fork on a model with a recurrent section (hooks/fork.py).",
    "fork_tokens_evaluated": "Prompt tokens evaluated to store states at a fork (also in prompt_tokens_evaluated).",
    "prefix_unavailable": "SWA prefix cuts not emitted (window rows not stored); the request was served without one.",
    "remote_failures": "Store calls that failed because the S3 store's bucket was unreachable (saves are kept in "
                       "their slots and retried).",
    "tokens_restored": "Tokens restored into slots.",
    "prompt_tokens_evaluated": "Sum of timings.prompt_n seen in replies.",
    "bytes_ingested": "New stored bytes written by ingests.",
    "bytes_saved": "Bytes of the state files llama-server saved (what keeping one file per save would cost).",
    "bytes_materialized": "Bytes of state files written by materialize.",
    "pins_refused": "Pins refused at a save because the pinned states would pass --max-size.",
    "eviction_failures": "Evictions that failed (the store may pass its cap until the next one).",
    "evictions_deferred": "Evictions put off because another machine's gc held the bucket store's lock (one that "
                          "makes room for a save waits for it first, up to about 3 s).",
}
LATENCY_HELP = {"save": "Time spent saving + ingesting a slot.", "restore": "Time spent materializing + restoring a slot."}
# Seconds: a small state saves in milliseconds, a long context over a slow bucket in tens of seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, float("inf"))

class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.c: Counter = Counter()
        self.kinds: Counter = Counter()
        self.cap_bytes: Optional[int] = None  # --max-size (hooks/bound.py), for kvstore_store_cap_bytes
        self.history = History()  # the status page's time series and latency percentiles
        self.latency = {op: Histogram(f"kvstore_{op}_seconds", LATENCY_HELP[op], buckets=LATENCY_BUCKETS,
                                      registry=None) for op in OPS}

    def evaluated(self, kind: str, timings: Optional[dict], n_restored: int) -> None:
        """A reply's `timings` seen: count its evaluated prompt tokens (by the request's X-KV-Cache kind)."""
        if not timings or not isinstance(timings.get("prompt_n"), (int, float)):
            return
        prompt_n = int(timings["prompt_n"])
        self.inc("prompt_tokens_evaluated", prompt_n)
        cache_n = timings.get("cache_n")
        self.history.request(kind, prompt_n, n_restored,
                             prompt_n + int(cache_n) if isinstance(cache_n, (int, float)) else None)

    def timed(self, op: str, seconds: float) -> None:
        """One save or restore done in `seconds` (op: "save" | "restore")."""
        self.inc(f"{op}_seconds", seconds)
        self.inc(f"{op}_count")
        self.latency[op].observe(seconds)
        self.history.latency(op, seconds)

    def evicted(self, reason: str, n: int = 1) -> None:
        """`n` names evicted for `reason` ("cap", "ttl", "quota") by one eviction pass (hooks/bound.py)."""
        self.inc(f"evictions_{reason}", n)
        self.history.evicted(reason, n)

    def inc(self, key: str, n: float = 1) -> None:
        with self._lock:
            self.c[key] += n

    def kind(self, kind: str) -> None:
        with self._lock:
            self.kinds[kind] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out = dict(self.c)
            out["kinds"] = {k: self.kinds.get(k, 0) for k in KINDS}
        return out

    def prometheus(self, *, queue_length: int, store: Optional[dict] = None,
                   bucket_requests: Optional[dict] = None) -> str:
        """The text of /metrics; `store`: `Store.stats()` (None when it could not be read: its gauges are left out);
        `bucket_requests`: `Store.bucket_requests()` (None: a local store)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Scrape(self, queue_length, store, bucket_requests))
        return generate_latest(registry).decode()


class _Scrape(Collector):
    """One scrape's metric families, in a fixed order: counters, latency histograms, gauges."""

    def __init__(self, metrics: Metrics, queue_length: int, store: Optional[dict], bucket_requests: Optional[dict]):
        self.metrics, self.queue_length, self.store = metrics, queue_length, store
        self.bucket_requests = bucket_requests

    def collect(self) -> Iterator[Metric]:
        snap = self.metrics.snapshot()
        kinds: dict[str, int] = snap["kinds"]
        requests = CounterMetricFamily("kvstore_requests", "Requests routed to a slot, by cache kind.", labels=["kind"])
        hits = CounterMetricFamily("kvstore_hits", "Requests that reused a state, by kind (slot, restored, parent, "
                                   "prefix).", labels=["kind"])
        for k in KINDS:
            requests.add_metric([k], kinds[k])
            if k != "miss":
                hits.add_metric([k], kinds[k])
        yield requests
        yield hits
        yield CounterMetricFamily("kvstore_misses", "Requests that found no state to reuse.", value=kinds["miss"])
        for key, help_ in COUNTERS.items():
            yield CounterMetricFamily(f"kvstore_{key}", help_, value=snap.get(key, 0))
        evictions = CounterMetricFamily("kvstore_evictions", "Names evicted from the store, by reason (cap: "
                                        "--max-size, ttl: expired, quota: the tenant's quota).", labels=["reason"])
        for r in EVICTION_REASONS:
            evictions.add_metric([r], snap.get(f"evictions_{r}", 0))
        yield evictions
        decisions = CounterMetricFamily("kvstore_decisions", "Restores weighed against evaluating the same tokens "
                                        "(hooks/cost.py), by what was chosen.", labels=["decision"])
        for d in ("restore", "recompute"):
            decisions.add_metric([d], snap.get(f"decisions_{d}", 0))
        yield decisions
        if self.bucket_requests is not None:
            sent = CounterMetricFamily("kvstore_bucket_requests", "Requests sent to the S3 store's bucket, by kind "
                                       "(get, get_range, head, list, put, delete; a listing counts once).",
                                       labels=["kind"])
            for kind, n in sorted(self.bucket_requests.items()):
                sent.add_metric([kind], n)
            yield sent
        for op in OPS:
            yield from self.metrics.latency[op].collect()
        yield _gauge("kvstore_queue_length", "Requests waiting for a slot.", self.queue_length)
        if self.metrics.cap_bytes is not None:
            yield _gauge("kvstore_store_cap_bytes", "The store's cap (--max-size).", self.metrics.cap_bytes)
        if self.store:
            yield _gauge("kvstore_store_bytes", "Bytes stored on disk (objects, compressed).",
                         self.store.get("stored_bytes", 0))
            yield _gauge("kvstore_store_names", "Names in the store.", self.store.get("names", 0))


def _gauge(name: str, help_: str, value: Union[int, float]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_, value=value)


def timings_from_sse_tail(tail: bytes) -> Optional[dict]:
    """The `timings` of the last SSE `data:` chunk that has them, from the tail of a stream."""
    for line in reversed(tail.split(b"\n")):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            continue
        try:
            obj = json.loads(payload)
        except ValueError:
            continue  # a chunk cut by the tail window
        if isinstance(obj, dict) and isinstance(obj.get("timings"), dict):
            return obj["timings"]
    return None
