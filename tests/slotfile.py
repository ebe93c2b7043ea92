#!/usr/bin/env python3
"""An independent reader of llama.cpp slot-save files (`ggsq` v4), the test suite's oracle.

Written for the tests from the file format alone; it never imports kvstore, so a bug in the Rust parser
cannot hide itself. Python 3.9+ and numpy only.

    python3 tests/slotfile.py info FILE       # structure, one fact per line
    python3 tests/slotfile.py check FILE      # split into pieces and rebuild: byte-exact or exit 1
    python3 tests/slotfile.py diff A B        # per (part, section, layer, K|V): rows equal at common positions

Library: `parse(data)` -> dict (header, tokens, sections with streams and per-layer K/V, appendix, trailing);
`split(data)` -> pieces (raw bytes, and K/V rows cell-major as numpy arrays); `rebuild(pieces)` -> bytes;
`rows(data)` -> {(part, section, layer, "K"|"V"): (positions, rows)}; `diff(a, b)` -> list of dicts.

File layout (little-endian): u32 magic 0x67677371, u32 version 4, u32 n_token_words, i32 words[...]; then KV
sections (u32 n_stream; per stream u32 cell_count and, if non-zero: per cell i32 pos, u32 n_seq_id, [12-byte
ext], i32 seq_id[n_seq_id]; u32 v_trans, n_layer, n_rot_k, n_rot_v; per layer K: i32 type, u64 row, rows;
per layer V: i32 type, u64 row, rows, or if v_trans: i32 type, u32 el, u32 n_embd, element-major data);
then optionally the server's "SCKP" appendix of checkpoints (i64 n_tokens, i32 pos_min, i32 pos_max, three
u64-length blobs; the first is u32 0xAF143CD8, i32 seq_id, KV sections). Whether entries carry the ext is not
recorded, and neither is the number of sections: both are found by parsing.
"""
from __future__ import annotations

import struct
import sys

import numpy as np

MAGIC, VERSION, SCKP, IO_MAGIC = 0x67677371, 4, 0x504B4353, 0xAF143CD8
TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 20: "iq4_nl", 30: "bf16"}


class Bad(ValueError):
    pass


class Cur:
    def __init__(self, data: bytes, off: int = 0, end: int | None = None):
        self.d, self.o, self.end = data, off, len(data) if end is None else end

    def get(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        if self.o + n > self.end:
            raise Bad(f"{what}: truncated at {self.o}")
        v = struct.unpack_from("<" + fmt, self.d, self.o)
        self.o += n
        return v[0] if len(v) == 1 else v

    def skip(self, n: int, what: str) -> int:
        if n < 0 or self.o + n > self.end:
            raise Bad(f"{what}: {n} bytes at {self.o} run past {self.end}")
        start, self.o = self.o, self.o + n
        return start


def _stream(c: Cur, index: int, ext: bool, spans: list) -> dict:
    count = c.get("I", "cell_count")
    st = {"index": index, "cell_count": count, "meta_off": c.o, "pos": [], "seq_ids": [], "K": [], "V": []}
    if not count:
        return st
    for _ in range(count):
        pos, n_seq = c.get("iI", "cell meta")
        if ext:
            c.skip(12, "cell ext")
        st["pos"].append(pos)
        st["seq_ids"].append(tuple(c.get("i", "seq_id") for _ in range(n_seq)))
    st["v_trans"], st["n_layer"], st["n_rot_k"], st["n_rot_v"] = c.get("IIII", "layer header")
    if st["v_trans"] > 1 or st["n_layer"] * 24 > c.end - c.o:
        raise Bad(f"implausible v_trans/n_layer at {c.o - 16}")
    for kv in ("K", "V"):
        for _ in range(st["n_layer"]):
            hdr = c.o
            ty = c.get("i", "type")
            if kv == "V" and st["v_trans"]:
                el, n_embd = c.get("II", "V el/n_embd")
                e = {"type": ty, "el": el, "n_embd": n_embd, "row": el * n_embd}
            else:
                e = {"type": ty, "row": c.get("Q", "row size")}
            e.update(hdr=hdr, off=c.skip(e["row"] * count, f"{kv} rows"))
            spans.append((e["off"], count, e.get("el"), e.get("n_embd"), e["row"]))
            st[kv].append(e)
    return st


def _section(c: Cur, ext: bool, spans: list) -> dict:
    start = c.o
    n_stream = c.get("I", "n_stream")
    if not 1 <= n_stream <= 65536:
        raise Bad(f"n_stream {n_stream} at {start}")
    streams = [_stream(c, i, ext, spans) for i in range(n_stream)]
    return {"start": start, "end": c.o, "n_stream": n_stream, "cell_ext": ext, "streams": streams}


def _sections(c: Cur, ext: bool, spans: list, fill: bool) -> list:
    """KV sections until the end (fill) or until the rest is empty, zero padding or the SCKP magic."""
    out = [_section(c, ext, spans)]
    while c.o < c.end:
        rest = c.d[c.o:c.end]
        if not fill and (rest[:4] == struct.pack("<I", SCKP) or not any(rest)):
            break
        out.append(_section(c, ext, spans))
    return out


def _tokens(words: list) -> dict:
    if not words or words[0] != -1:
        return {"format": "legacy", "n_tokens": len(words), "tokens": np.array(words, dtype=np.int32)}
    if len(words) < 3 or words[1] != 1 or words[2] > len(words) - 3:
        raise Bad(f"packed token payload: {words[:3]}")
    n = words[2]
    rest = words[3 + n:]
    return {"format": "packed-v1", "n_tokens": n, "tokens": np.array(words[3:3 + n], dtype=np.int32),
            "n_media": rest[0] if rest else None}


def _checkpoint(c: Cur, spans: list) -> dict:
    n_tokens, pos_min, pos_max = c.get("qii", "checkpoint head")
    ck = {"n_tokens": n_tokens, "pos_min": pos_min, "pos_max": pos_max}
    for part in ("tgt", "dft", "spec"):
        n = c.get("Q", f"{part} length")
        off = c.skip(n, part)
        ck[part] = {"off": off, "len": n}
    t = ck["tgt"]
    if t["len"] >= 8 and struct.unpack_from("<I", c.d, t["off"])[0] == IO_MAGIC:
        for ext in (False, True):
            inner: list = []
            try:
                b = Cur(c.d, t["off"] + 8, t["off"] + t["len"])
                t.update(seq_id=struct.unpack_from("<i", c.d, t["off"] + 4)[0],
                         sections=_sections(b, ext, inner, fill=True))
                spans.extend(inner)
                break
            except Bad:
                t.pop("sections", None)
    return ck


def _parse(data: bytes, ext: bool) -> tuple[dict, list]:
    c, spans = Cur(data), []
    magic, version, n_words = c.get("III", "header")
    if magic != MAGIC or version != VERSION:
        raise Bad(f"magic {magic:#x} version {version}")
    words = list(struct.unpack_from(f"<{n_words}i", data, c.skip(4 * n_words, "token words")))
    info = {"size": len(data), "magic": magic, "version": version, "n_token_words": n_words,
            "tokens": _tokens(words), "body_start": c.o}
    info["sections"] = _sections(c, ext, spans, fill=False)
    info["body_end"] = c.o
    info["appendix"] = None
    if data[c.o:c.o + 4] == struct.pack("<I", SCKP):
        start = c.o
        _, app_version, count = c.get("III", "SCKP head")
        if app_version != 1:
            raise Bad(f"SCKP version {app_version}")
        cks = [_checkpoint(c, spans) for _ in range(count)]
        info["appendix"] = {"start": start, "end": c.o, "version": app_version, "checkpoints": cks}
    info["trailing"] = len(data) - c.o
    return info, spans


def parse(data: bytes) -> dict:
    """The structure of a slot file; raises Bad if it is not one."""
    return _parse_spans(data)[0]


def _parse_spans(data: bytes) -> tuple[dict, list]:
    try:
        return _parse(bytes(data), False)
    except Bad:
        return _parse(bytes(data), True)


def split(data: bytes) -> list:
    """Pieces in file order: ("raw", bytes) and ("rows", ndarray[cells, row bytes], (el, n_embd) or None)."""
    data = bytes(data)
    _, spans = _parse_spans(data)
    out, at = [], 0
    for off, count, el, n_embd, row in sorted(spans):
        out.append(("raw", data[at:off]))
        buf = np.frombuffer(data, np.uint8, count * row, off)
        if el is None:
            out.append(("rows", buf.reshape(count, row), None))
        else:  # element-major -> cell-major
            out.append(("rows", buf.reshape(n_embd, count, el).transpose(1, 0, 2).reshape(count, row), (el, n_embd)))
        at = off + count * row
    out.append(("raw", data[at:]))
    return out


def rebuild(pieces: list) -> bytes:
    parts = []
    for p in pieces:
        if p[0] == "raw":
            parts.append(p[1])
        elif p[2] is None:
            parts.append(np.ascontiguousarray(p[1]).tobytes())
        else:
            el, n_embd = p[2]
            count = p[1].shape[0]
            parts.append(np.ascontiguousarray(p[1].reshape(count, n_embd, el).transpose(1, 0, 2)).tobytes())
    return b"".join(parts)


def rows(data: bytes) -> dict:
    """{(part, section, layer, "K"|"V"): (positions int32[cells], rows uint8[cells, bytes])}, cell-major."""
    data = bytes(data)
    info = parse(data)
    parts = [("body", info["sections"])]
    for i, ck in enumerate((info["appendix"] or {}).get("checkpoints", [])):
        parts.append((f"ckpt{i}", ck["tgt"].get("sections", [])))
    out = {}
    for part, secs in parts:
        for si, sec in enumerate(secs):
            for st in sec["streams"]:
                n = st["cell_count"]
                for kv in ("K", "V"):
                    for li, e in enumerate(st[kv]):
                        buf = np.frombuffer(data, np.uint8, n * e["row"], e["off"])
                        if "el" in e:
                            buf = buf.reshape(e["n_embd"], n, e["el"]).transpose(1, 0, 2)
                        out[(part, si, li, kv)] = (np.array(st["pos"], np.int32), buf.reshape(n, e["row"]))
    return out


def diff(a: bytes, b: bytes) -> list:
    """Per key present in both files: positions in common, how many of their rows are identical."""
    ra, rb = rows(a), rows(b)
    out = []
    for key in sorted(set(ra) & set(rb), key=str):
        (pa, xa), (pb, xb) = ra[key], rb[key]
        common, ia, ib = np.intersect1d(pa, pb, return_indices=True)
        same = int((xa[ia] == xb[ib]).all(axis=1).sum()) if xa.shape[1:] == xb.shape[1:] else 0
        out.append({"key": key, "common": len(common), "identical": same})
    return out


def _info_lines(path: str) -> list:
    data = open(path, "rb").read()
    i = parse(data)
    t = i["tokens"]
    lines = [f"size {i['size']} version {i['version']} token_words {i['n_token_words']}",
             f"tokens {t['format']} n {t['n_tokens']} first {t['tokens'][:8].tolist()} last {t['tokens'][-3:].tolist()}"]

    def secs(prefix, ss):
        for n, s in enumerate(ss):
            lines.append(f"{prefix}section {n} @{s['start']}..{s['end']} n_stream {s['n_stream']} ext {s['cell_ext']}")
            for st in s["streams"]:
                if not st["cell_count"]:
                    continue
                p = st["pos"]
                lines.append(f"{prefix}  stream {st['index']} cells {st['cell_count']} pos {p[0]}..{p[-1]} "
                             f"min {min(p)} max {max(p)} seq {sorted(set(st['seq_ids']))} v_trans {st['v_trans']} "
                             f"n_layer {st['n_layer']} rot {st['n_rot_k']},{st['n_rot_v']}")
                for kv in ("K", "V"):
                    lines.append(f"{prefix}  {kv} " + " ".join(
                        f"{TYPES.get(e['type'], e['type'])}/{e['row']}" for e in st[kv]))

    secs("", i["sections"])
    app = i["appendix"]
    if app:
        lines.append(f"appendix @{app['start']}..{app['end']} checkpoints {len(app['checkpoints'])}")
        for ck in app["checkpoints"]:
            lines.append(f"  checkpoint n_tokens {ck['n_tokens']} pos {ck['pos_min']}..{ck['pos_max']} "
                         f"tgt {ck['tgt']['len']} dft {ck['dft']['len']} spec {ck['spec']['len']}")
            secs("    ", ck["tgt"].get("sections", []))
    lines.append(f"trailing {i['trailing']}")
    return lines


def main(argv: list) -> int:
    if len(argv) == 2 and argv[0] == "info":
        print("\n".join(_info_lines(argv[1])))
        return 0
    if len(argv) == 2 and argv[0] == "check":
        data = open(argv[1], "rb").read()
        ok = rebuild(split(data)) == data
        print(f"{argv[1]}: rebuild {'byte-exact' if ok else 'DIFFERS'}")
        return 0 if ok else 1
    if len(argv) == 3 and argv[0] == "diff":
        for d in diff(open(argv[1], "rb").read(), open(argv[2], "rb").read()):
            print(f"{d['key']}: {d['identical']}/{d['common']} rows identical")
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
