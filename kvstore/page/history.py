"""What the hooks did since start, in bounded memory: prompt tokens and evictions per time bucket, latency samples.

Contract: `History.request(kind, evaluated, restored, prompt)` once per routed request (kind is one of KINDS,
`evaluated` llama-server's `timings.prompt_n`, `restored` the tokens restored from the store for it, `prompt`
the whole prompt's tokens); `History.latency("save"|"restore", seconds)` once per slot save or restore;
`History.evicted(reason, n)` once per eviction pass that evicted `n` names for `reason` (one of EVICTION_REASONS:
"cap" --max-size, "ttl" expired, "quota" a tenant's quota; Metrics.evicted, from hooks/bound.py).
`snapshot()` returns plain JSON-able data (shape in kvstore/page/__init__.py). Thread-safe: the hooks may call
it from the event loop and from worker threads.

The series always covers the whole time since start: when the ring of buckets is full, neighbouring buckets are
merged and the bucket width doubles, so memory stays bounded (at most `max_buckets`) however long it runs.
Latency percentiles come from the last `max_samples` samples of each operation (recent behaviour matters most).
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

KINDS = ("slot", "restored", "parent", "prefix", "miss")
OPS = ("save", "restore")
EVICTION_REASONS = ("cap", "ttl", "quota")
PERCENTILES = (50, 90, 99)


def _bucket() -> dict[str, Any]:
    return {"requests": {k: 0 for k in KINDS}, "prompt": 0, "evaluated": 0, "restored": 0,
            "evicted": {r: 0 for r in EVICTION_REASONS}}


def _merge(a: dict, b: dict) -> dict:
    out = _bucket()
    for k in KINDS:
        out["requests"][k] = a["requests"][k] + b["requests"][k]
    for f in ("prompt", "evaluated", "restored"):
        out[f] = a[f] + b[f]
    for r in EVICTION_REASONS:
        out["evicted"][r] = a["evicted"][r] + b["evicted"][r]
    return out


def percentile(sorted_xs: list[float], p: float) -> Optional[float]:
    """Nearest-rank percentile of sorted samples (None when empty): always a value that was observed."""
    if not sorted_xs:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_xs)))
    return sorted_xs[min(rank, len(sorted_xs)) - 1]


class History:
    def __init__(self, *, bucket_s: float = 5.0, max_buckets: int = 120, max_samples: int = 2048,
                 clock: Callable[[], float] = time.time) -> None:
        if bucket_s <= 0 or max_buckets < 2:
            raise ValueError("History needs bucket_s > 0 and max_buckets >= 2")
        self._lock = threading.Lock()
        self._clock = clock
        self.start = clock()
        self.bucket_s = float(bucket_s)
        self.max_buckets = max_buckets
        self._buckets: list[dict] = []
        self._totals = {k: {"requests": 0, "prompt": 0, "evaluated": 0, "restored": 0} for k in KINDS}
        self._samples = {op: deque(maxlen=max_samples) for op in OPS}
        self._counts = {op: 0 for op in OPS}
        self._evicted = {r: 0 for r in EVICTION_REASONS}

    def _current(self) -> dict:
        """The bucket for now, growing the ring (and coarsening it when full). Caller holds the lock."""
        i = max(0, int((self._clock() - self.start) // self.bucket_s))
        while i >= self.max_buckets:
            pairs = [self._buckets[j:j + 2] for j in range(0, len(self._buckets), 2)]
            self._buckets = [_merge(p[0], p[1]) if len(p) == 2 else p[0] for p in pairs]
            self.bucket_s *= 2
            i //= 2
        while len(self._buckets) <= i:
            self._buckets.append(_bucket())
        return self._buckets[i]

    def request(self, kind: str, evaluated: int, restored: int = 0, prompt: Optional[int] = None) -> None:
        """One routed request. `prompt` None (unknown): taken as evaluated + restored, the least it can be."""
        if kind not in KINDS:
            raise ValueError(f"unknown cache kind {kind!r}; expected one of {', '.join(KINDS)}")
        evaluated, restored = max(0, int(evaluated or 0)), max(0, int(restored or 0))
        prompt = max(int(prompt), evaluated) if prompt is not None else evaluated + restored
        with self._lock:
            b = self._current()
            b["requests"][kind] += 1
            t = self._totals[kind]
            t["requests"] += 1
            for f, v in (("prompt", prompt), ("evaluated", evaluated), ("restored", restored)):
                b[f] += v
                t[f] += v

    def evicted(self, reason: str, n: int = 1) -> None:
        """`n` names evicted now for `reason` (one of EVICTION_REASONS)."""
        if reason not in EVICTION_REASONS:
            raise ValueError(f"unknown eviction reason {reason!r}; expected one of {', '.join(EVICTION_REASONS)}")
        n = max(0, int(n))
        with self._lock:
            self._current()["evicted"][reason] += n
            self._evicted[reason] += n

    def latency(self, op: str, seconds: float) -> None:
        if op not in OPS:
            raise ValueError(f"unknown operation {op!r}; expected one of {', '.join(OPS)}")
        with self._lock:
            self._samples[op].append(float(seconds))
            self._counts[op] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            self._current()  # extend the series up to now, so idle time shows as empty buckets
            buckets = [{"t": self.start + i * self.bucket_s, "requests": dict(b["requests"]), "prompt": b["prompt"],
                        "evaluated": b["evaluated"], "restored": b["restored"], "evicted": dict(b["evicted"])}
                       for i, b in enumerate(self._buckets)]
            totals = {k: dict(v) for k, v in self._totals.items()}
            evicted = dict(self._evicted)
            lat = {}
            for op in OPS:
                xs = sorted(self._samples[op])
                lat[op] = {"count": self._counts[op], "window": len(xs), "max": xs[-1] if xs else None,
                           **{f"p{p}": percentile(xs, p) for p in PERCENTILES}}
            return {"start": self.start, "now": self._clock(), "bucket_s": self.bucket_s, "buckets": buckets,
                    "totals": totals, "evicted": evicted, "latency": lat}
