"""Progress lines on stderr, only when stderr is a terminal (never in pipes, logs or --json consumers)."""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO


def progress(label: str, stream: Optional[TextIO] = None) -> Optional[Callable[[int, int], None]]:
    """A `callback(done, total)` that redraws one line at most 10 times a second, or None when not a TTY."""
    out = stream or sys.stderr
    try:
        if not out.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    last = [0.0]

    def update(done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < 0.1:
            return
        last[0] = now
        pct = f"{100.0 * done / total:5.1f}%" if total else ""
        out.write(f"\r{label}: {done}/{total} {pct}")
        if done >= total:
            out.write("\n")
        out.flush()

    return update
