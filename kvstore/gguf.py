"""The few GGUF metadata values kvstore needs, read from the file header (no tensor data is touched).

`sliding_window(path)` is the model's SWA window (`<arch>.attention.sliding_window`), 0 for a model without
sliding-window layers: the slot files do not record it, and a prefix state's window depends on it
(docs/design.md "Prefix states"). `shape(path)` adds the layer count (`<arch>.block_count`), with which the
core refuses a slot file missing a section (`rust/src/format/complete.rs`). GGUF v2/v3 header: magic "GGUF", u32 version, u64 tensor count, u64 kv count,
then key/value pairs (key: u64 length + utf-8; value: u32 type + payload), little-endian.
"""
from __future__ import annotations

import struct
from typing import Any, BinaryIO

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """Not a GGUF file this reader understands."""


def _read(f: BinaryIO, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise GGUFError("GGUF header truncated")
    return b


def _value(f: BinaryIO, ty: int, keep: bool) -> Any:
    if ty in _SCALARS:
        fmt = _SCALARS[ty]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if ty == _STRING:
        (n,) = struct.unpack("<Q", _read(f, 8))
        if not keep:
            f.seek(n, 1)
            return None
        return _read(f, n).decode("utf-8", "replace")
    if ty == _ARRAY:
        ety, n = struct.unpack("<IQ", _read(f, 12))
        if ety in _SCALARS and not keep:  # skip arrays (the tokenizer's are large) without decoding them
            f.seek(n * struct.calcsize(_SCALARS[ety]), 1)
            return None
        return [_value(f, ety, keep) for _ in range(n)]
    raise GGUFError(f"unknown GGUF value type {ty}")


def metadata(path: str, wanted: set[str]) -> dict[str, Any]:
    """The values of the `wanted` keys present in the header (others are skipped, not decoded)."""
    out: dict[str, Any] = {}
    with open(path, "rb") as f:
        if _read(f, 4) != b"GGUF":
            raise GGUFError(f"{path}: not a GGUF file")
        (version,) = struct.unpack("<I", _read(f, 4))
        if version < 2:
            raise GGUFError(f"{path}: GGUF version {version} is not supported")
        _, n_kv = struct.unpack("<QQ", _read(f, 16))
        for _ in range(n_kv):
            (n,) = struct.unpack("<Q", _read(f, 8))
            key = _read(f, n).decode("utf-8", "replace")
            (ty,) = struct.unpack("<I", _read(f, 4))
            val = _value(f, ty, key in wanted or key == "general.architecture")
            if key in wanted or key == "general.architecture":
                out[key] = val
            arch = out.get("general.architecture")
            if arch and f"{arch}.attention.sliding_window" not in wanted:
                wanted = wanted | {f"{arch}{k}" for k in _PER_ARCH}
    return out


# The per-architecture keys `metadata` always reads once it knows the architecture.
_PER_ARCH = (".attention.sliding_window", ".block_count")


def _positive(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0


def sliding_window(path: str) -> int:
    """The model's sliding window in tokens, 0 when it has no SWA layers."""
    return shape(path)[0]


def shape(path: str) -> tuple[int, int]:
    """(sliding window, layer count) of the model; each 0 when the header does not say."""
    meta = metadata(path, set())
    arch = meta.get("general.architecture")
    if not arch:
        return 0, 0
    return _positive(meta, f"{arch}.attention.sliding_window"), _positive(meta, f"{arch}.block_count")
