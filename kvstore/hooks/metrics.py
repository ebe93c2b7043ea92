"""Counters for /kvstore/stats and the Prometheus text of /metrics."""
from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any, Optional

from kvstore.page import History

KINDS = ("slot", "restored", "parent", "prefix", "miss")

# name -> (type, help)
_HELP = {
    "kvstore_requests_total": ("counter", "Requests routed to a slot, by cache kind."),
    "kvstore_hits_total": ("counter", "Requests that reused a state, by kind (slot, restored, parent, prefix)."),
    "kvstore_misses_total": ("counter", "Requests that found no state to reuse."),
    "kvstore_restore_failures_total": ("counter", "Restores that failed (corrupt object, fingerprint, llama-server)."),
    "kvstore_save_failures_total": ("counter", "Saves or ingests that failed."),
    "kvstore_prefix_unavailable_total": ("counter", "SWA prefix cuts not emitted (window rows not stored); the "
                                         "request was served without one."),
    "kvstore_remote_failures_total": ("counter", "Store calls that failed because the S3 store's bucket was "
                                      "unreachable (saves are kept in their slots and retried)."),
    "kvstore_tokens_restored_total": ("counter", "Tokens restored into slots."),
    "kvstore_prompt_tokens_evaluated_total": ("counter", "Sum of timings.prompt_n seen in replies."),
    "kvstore_bytes_ingested_total": ("counter", "New stored bytes written by ingests."),
    "kvstore_bytes_saved_total": ("counter", "Bytes of the state files llama-server saved (what keeping one file "
                                  "per save would cost)."),
    "kvstore_bytes_materialized_total": ("counter", "Bytes of state files written by materialize."),
    "kvstore_save_seconds_sum": ("counter", "Time spent saving + ingesting slots."),
    "kvstore_save_seconds_count": ("counter", "Number of slot saves."),
    "kvstore_restore_seconds_sum": ("counter", "Time spent materializing + restoring slots."),
    "kvstore_restore_seconds_count": ("counter", "Number of slot restores."),
    "kvstore_queue_length": ("gauge", "Requests waiting for a slot."),
    "kvstore_store_bytes": ("gauge", "Bytes stored on disk (objects, compressed)."),
    "kvstore_store_names": ("gauge", "Names in the store."),
}


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.c: Counter = Counter()
        self.kinds: Counter = Counter()
        self.history = History()  # the status page's time series and latency percentiles

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
        self.history.latency(op, seconds)

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

    def prometheus(self, *, queue_length: int, store: Optional[dict] = None) -> str:
        snap = self.snapshot()
        lines: list[str] = []

        def emit(name: str, value: float, labels: str = "", header: bool = True) -> None:
            if header:
                typ, hlp = _HELP[name]
                lines.append(f"# HELP {name} {hlp}")
                lines.append(f"# TYPE {name} {typ}")
            lines.append(f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}")

        for i, k in enumerate(KINDS):
            emit("kvstore_requests_total", snap["kinds"][k], f'{{kind="{k}"}}', header=i == 0)
        for i, k in enumerate(KINDS[:-1]):
            emit("kvstore_hits_total", snap["kinds"][k], f'{{kind="{k}"}}', header=i == 0)
        emit("kvstore_misses_total", snap["kinds"]["miss"])
        for key in ("restore_failures", "save_failures", "prefix_unavailable", "remote_failures", "tokens_restored",
                    "prompt_tokens_evaluated",
                    "bytes_ingested", "bytes_saved", "bytes_materialized"):
            emit(f"kvstore_{key}_total", snap.get(key, 0))
        for op in ("save", "restore"):
            emit(f"kvstore_{op}_seconds_sum", float(snap.get(f"{op}_seconds", 0.0)))
            emit(f"kvstore_{op}_seconds_count", snap.get(f"{op}_count", 0))
        emit("kvstore_queue_length", queue_length)
        if store:
            emit("kvstore_store_bytes", store.get("stored_bytes", 0))
            emit("kvstore_store_names", store.get("names", 0))
        return "\n".join(lines) + "\n"


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
