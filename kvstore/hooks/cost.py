"""Restore or recompute: whether bringing a stored state into a slot is predicted faster than letting llama-server
evaluate those tokens again. No aiohttp.

A restore pays off only while the store hands the state over faster than llama-server would recompute it. On these
CPUs that is always so; on a GPU that prefills 10-20k tokens/s a slow restore path would make a returning user
slower than no cache at all. So both sides are measured on the running server, and the cheaper one is chosen.

Contract: `CostModel.prefilled(timings)` learns llama-server's prefill time from a reply's `timings` (`prompt_n`
tokens in `prompt_ms`, replies that evaluated at least MIN_PREFILL tokens); `CostModel.restored(n_tokens,
file_bytes, seconds)` learns the restore path's time (materialize + llama-server's load, timed by `transfer.py`) and
the layout's bytes per token. Each side is a least-squares line, seconds = fixed + per-unit × size, over the last
SAMPLES observations (a fixed cost per call: the HTTP round trip, the file's creation; a rate: bytes or tokens per
second). `decide(restore_tokens, saved_tokens)` predicts restoring a state of `restore_tokens` tokens against
evaluating the `saved_tokens` it spares, and returns a `Decision`: "restore" unless both sides are measured and the
restore is predicted slower. `assume_prefill_tps` (`--assume-prefill-tps`) fixes the prefill rate instead of
measuring it (a faster machine's, to see what the model would choose there; the tests use it). `policy`
(`--restore-policy`): "cost" (the default) decides as above; "always" restores whatever the estimates say (they
are still reported): what the tests of the restore paths themselves run with, so that a machine's rates never
change which path they exercise.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Optional

POLICIES = ("cost", "always")
MIN_PREFILL = 16  # tokens: shorter evaluations are dominated by per-call work, not prefill
SAMPLES = 64  # observations kept per side


class Line:
    """seconds = fixed + per_unit × units, fitted by least squares over the last SAMPLES points; with one size only
    (or a negative fit) the mean rate through the origin. Thread-safe: restores are timed in worker tasks."""

    def __init__(self) -> None:
        self._points: deque[tuple[float, float]] = deque(maxlen=SAMPLES)
        self._lock = threading.Lock()

    def add(self, units: float, seconds: float) -> None:
        if units > 0 and seconds > 0:
            with self._lock:
                self._points.append((float(units), float(seconds)))

    def __len__(self) -> int:
        return len(self._points)

    def fit(self) -> Optional[tuple[float, float]]:
        """(fixed seconds, seconds per unit), or None before the first point."""
        with self._lock:
            pts = list(self._points)
        if not pts:
            return None
        n = len(pts)
        mx = sum(x for x, _ in pts) / n
        my = sum(y for _, y in pts) / n
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        if sxx > 0:
            slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
            fixed = my - slope * mx
            if slope > 0 and fixed >= 0:
                return fixed, slope
        return 0.0, sum(y for _, y in pts) / sum(x for x, _ in pts)

    def predict(self, units: float) -> Optional[float]:
        f = self.fit()
        return None if f is None else f[0] + f[1] * units


@dataclass(frozen=True)
class Decision:
    """The choice for one candidate restore, with both estimates (seconds; None where not yet measured)."""

    restore: bool
    restore_s: Optional[float]
    recompute_s: Optional[float]

    @property
    def word(self) -> str:
        return "restore" if self.restore else "recompute"

    def header(self) -> str:
        """The `X-KV-Decision` value: the choice, then the two estimates in milliseconds."""
        ms = lambda s: "unknown" if s is None else f"{s * 1000:.1f}"  # noqa: E731
        return f"{self.word}; restore_ms={ms(self.restore_s)}; recompute_ms={ms(self.recompute_s)}"


class CostModel:
    def __init__(self, assume_prefill_tps: Optional[float] = None, policy: str = "cost"):
        if assume_prefill_tps is not None and not assume_prefill_tps > 0:
            raise ValueError(f"--assume-prefill-tps {assume_prefill_tps}: must be a positive number of tokens/s")
        if policy not in POLICIES:
            raise ValueError(f"--restore-policy {policy!r}: one of {', '.join(POLICIES)}")
        self.assume_prefill_tps, self.policy = assume_prefill_tps, policy
        self.prefill = Line()  # tokens -> seconds
        self.restore = Line()  # file bytes -> seconds
        self._bytes_per_token: deque[float] = deque(maxlen=SAMPLES)

    def prefilled(self, timings: Optional[Mapping[str, Any]]) -> None:
        """A reply's `timings`: `prompt_n` tokens evaluated in `prompt_ms`."""
        if not timings:
            return
        n, ms = timings.get("prompt_n"), timings.get("prompt_ms")
        if isinstance(n, (int, float)) and isinstance(ms, (int, float)) and n >= MIN_PREFILL and ms > 0:
            self.prefill.add(n, ms / 1000.0)

    def restored(self, n_tokens: int, file_bytes: int, seconds: float) -> None:
        """One restore: a state of `n_tokens` tokens in a file of `file_bytes`, materialized and loaded in
        `seconds`."""
        if n_tokens > 0 and file_bytes > 0:
            self.restore.add(file_bytes, seconds)
            self._bytes_per_token.append(file_bytes / n_tokens)

    def bytes_per_token(self) -> Optional[float]:
        xs = list(self._bytes_per_token)
        return sum(xs) / len(xs) if xs else None

    def recompute_seconds(self, tokens: int) -> Optional[float]:
        if tokens <= 0:
            return 0.0
        if self.assume_prefill_tps is not None:
            return tokens / self.assume_prefill_tps
        return self.prefill.predict(tokens)

    def restore_seconds(self, tokens: int) -> Optional[float]:
        bpt = self.bytes_per_token()
        return None if bpt is None else self.restore.predict(tokens * bpt)

    @property
    def can_refuse(self) -> bool:
        """Could `decide` choose recompute now (policy "cost", both sides measured)? When not, a caller may skip
        what it would read only to size the decision."""
        return self.policy == "cost" and len(self.restore) > 0 and (
            self.assume_prefill_tps is not None or len(self.prefill) > 0)

    def decide(self, restore_tokens: int, saved_tokens: int) -> Decision:
        """Restore a state of `restore_tokens` tokens, sparing the evaluation of `saved_tokens`? Restore unless
        both sides are measured and the restore is predicted slower."""
        r, c = self.restore_seconds(restore_tokens), self.recompute_seconds(saved_tokens)
        return Decision(self.policy == "always" or r is None or c is None or r <= c, r, c)

    def describe(self) -> dict:
        """For /kvstore/stats: the fitted lines and what they predict."""
        def line(ln: Line, unit: str) -> Optional[dict]:
            f = ln.fit()
            if f is None:
                return None
            return {"samples": len(ln), "fixed_s": round(f[0], 6), f"{unit}_per_s": round(1 / f[1]) if f[1] else None}
        bpt = self.bytes_per_token()
        return {"policy": self.policy,
                "prefill": ({"assumed": True, "tokens_per_s": self.assume_prefill_tps}
                            if self.assume_prefill_tps is not None else line(self.prefill, "tokens")),
                "restore": line(self.restore, "bytes"),
                "bytes_per_token": None if bpt is None else round(bpt)}
