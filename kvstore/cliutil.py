"""The `kvstore` command's shared pieces: the one-line error, text and JSON output, argument checks."""
from __future__ import annotations

import datetime
import json
from typing import Any, Callable, Optional, Sequence

PROG = "kvstore"
MIB = float(1 << 20)


class CliError(Exception):
    """An error found by the CLI itself (bad argument value): printed as one line, exit 2."""


# ---------------------------------------------------------------------------------------------------------------
# formatting

def mib(n: Optional[float]) -> str:
    if n is None:
        return "-"
    return f"{n / MIB:.2f} MiB"


def ratio(x: Optional[float]) -> str:
    if x is None:
        return "-"
    try:
        return f"{float(x):.2f}"
    except (TypeError, ValueError):
        return str(x)


def when(t: Optional[float]) -> str:
    if not t:
        return "-"
    return datetime.datetime.fromtimestamp(float(t)).strftime("%Y-%m-%d %H:%M:%S")


def table(rows: list[list[str]], header: list[str], right: Sequence[int] = ()) -> str:
    cols = [header] + rows
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]

    def fmt(r):
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    return "\n".join([fmt(header)] + [fmt(r) for r in rows])


def pairs(items: list[tuple[str, Any]]) -> str:
    w = max(len(k) for k, _ in items)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in items)


def emit(args, doc: Any, text: Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print(text())


def parse_kv(items: Optional[list[str]], what: str) -> Optional[dict[str, str]]:
    if not items:
        return None
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what} {item!r}: expected key=value")
        out[key] = value
    return out


def valid_server_filename(filename: str) -> bool:
    """llama-server's `fs_validate_filename` (no subdirectories), so that `action=restore` accepts the file."""
    if not filename or len(filename.encode("utf-8", "surrogatepass")) > 255:
        return False
    for ch in filename:
        c = ord(ch)
        if (c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or c in (0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF)
                or 0xD800 <= c <= 0xDFFF or ch in ':*?"<>|/\\'):
            return False
    if filename[0] == " " or filename[-1] in " .":
        return False
    return ".." not in filename and filename != "."
