"""Store throughput vs a plain file copy of the same bytes, and stored vs raw bytes for parent + delta.

Real slot files from the embedded llama.cpp server: one parent (an article) and children that each restore the
parent and add a question, as a batch job does. Every figure comes from the same run on the same files.
`long_words`: also one long state (a user with a long history, the size a state has on a larger model),
restored again and again from one store as a server does, beside a copy of its file, alternating.
"""
from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

from kvstore import Store
from kvstore.engine import EmbeddedServer, EngineConfig

from . import text
from .client import post_json


def make_family(model: str, out: Path, article_words: int, children: int, seed: int = 7,
                ctx_size: int = 4096) -> list:
    """Save parent.bin and child-<i>.bin (parent restored, then a question added) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    article = text.paragraph(rng, article_words) + "\n\nQuestion:"
    cfg = EngineConfig(model=model, parallel=1, ctx_size=ctx_size, slot_save_path=str(out), cache_ram=0)
    with EmbeddedServer(cfg) as srv:
        post_json(srv.url + "/completion", {"prompt": article, "n_predict": 0, "id_slot": 0, "cache_prompt": True})
        post_json(srv.url + "/slots/0?action=save", {"filename": "parent.bin"})
        for i in range(children):
            post_json(srv.url + "/slots/0?action=restore", {"filename": "parent.bin"})
            prompt = article + " " + text.question(rng) + "\nAnswer:"
            post_json(srv.url + "/completion", {"prompt": prompt, "n_predict": 8, "id_slot": 0,
                                                "cache_prompt": True, "temperature": 0})
            post_json(srv.url + f"/slots/0?action=save", {"filename": f"child-{i}.bin"})
    return [out / "parent.bin"] + [out / f"child-{i}.bin" for i in range(children)]


def _copy(src: Path, dst: Path, durable: bool) -> None:
    shutil.copyfile(src, dst)
    if durable:
        fd = os.open(dst, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def run(model: str, work: Path, article_words: int, children: int, repeats: int = 5, long_words: int = 0) -> dict:
    files = make_family(model, work / "files", article_words, children)
    raw = sum(f.stat().st_size for f in files)
    best = {}

    def timed(key, fn, items):
        """fn(item) for each item, each timed after a sync: the dirty pages of the step before are written back
        first, or their writeback (which this machine's memory cgroup throttles early) is charged to the next."""
        total = 0.0
        for item in items:
            os.sync()
            t0 = time.perf_counter()
            fn(item)
            total += time.perf_counter() - t0
        best[key] = min(best.get(key, total), total)

    stored = None
    for rep in range(repeats):
        copy_dir = work / f"copy{rep}"
        copy_dir.mkdir()
        timed("copy_fsync", lambda f: _copy(f, copy_dir / f.name, True), files)
        timed("copy", lambda f: _copy(f, copy_dir / (f.name + ".2"), False), files)
        store = Store(str(work / f"store{rep}"))
        timed("ingest", lambda f: store.ingest(f.stem, str(f), parent=None if f.stem == "parent" else "parent"),
              files)
        out_dir = work / f"out{rep}"
        out_dir.mkdir()
        timed("materialize", lambda f: store.materialize(f.stem, str(out_dir / f.name)), files)
        for f in files:
            assert (out_dir / f.name).read_bytes() == f.read_bytes(), f"materialize not byte-exact: {f.name}"
        stored = store.stats()
        shutil.rmtree(copy_dir)
        shutil.rmtree(out_dir)
    mbps = {k: round(raw / v / 1e6, 1) for k, v in best.items()}
    child_sizes = [f.stat().st_size for f in files[1:]]
    return {
        "files": len(files), "raw_bytes": raw, "parent_bytes": files[0].stat().st_size,
        "child_bytes_mean": int(sum(child_sizes) / max(1, len(child_sizes))),
        "stored_bytes": stored["stored_bytes"], "unique_raw_bytes": stored["unique_raw_bytes"],
        "raw_over_stored": round(raw / stored["stored_bytes"], 2),
        "mb_per_s": mbps,
        "ingest_vs_copy_fsync": round(mbps["ingest"] / mbps["copy_fsync"], 2),
        "materialize_vs_copy": round(mbps["materialize"] / mbps["copy"], 2),
        **({"long": run_long(model, work / "long", long_words)} if long_words else {}),
    }


def run_long(model: str, work: Path, words: int, repeats: int = 15) -> dict:
    """One long state: its materialize from one store, repeated, beside a copy of the file (medians)."""
    (src,) = make_family(model, work / "files", words, 0, ctx_size=8192)
    store = Store(str(work / "store"))
    store.ingest("long", str(src))
    size = src.stat().st_size
    ways = {"copy": lambda dst: _copy(src, dst, False), "materialize": lambda dst: store.materialize("long", str(dst))}
    times = {key: [] for key in ways}
    for rep in range(repeats):
        for key, write in ways.items():
            dst = work / f"{key}.bin"
            os.sync()
            t0 = time.perf_counter()
            write(dst)
            times[key].append(time.perf_counter() - t0)
            if key == "materialize" and rep == 0:
                assert dst.read_bytes() == src.read_bytes(), "materialize not byte-exact: the long state"
            dst.unlink()
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {"bytes": size, "repeats": repeats, "ms": {k: round(v * 1e3, 1) for k, v in med.items()},
            "mb_per_s": {k: round(size / v / 1e6, 1) for k, v in med.items()},
            "materialize_vs_copy": round(med["copy"] / med["materialize"], 2)}
