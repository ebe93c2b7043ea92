"""`python -m bench.blocksize`: choose the block size B on real files (docs/design.md, "Block size").

For each model: a parent (an article) and children that restore it and add a question, ingested into one store
per B. Smaller B shares more of a child's rows with its parent (the fork falls inside fewer unshared blocks) but
makes more, smaller objects (per-object header, file, fsync and index row).
"""
from __future__ import annotations

import json
import sys
import time

from kvstore import Store
from kvstore.models import model_path

from . import storage
from .targets import cleanup, workdir

SIZES = (16, 32, 64, 128, 256)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    models = argv or ["smollm2", "gemma3"]
    rows = []
    for model in models:
        wd = workdir()
        try:
            files = storage.make_family(str(model_path(model)), wd / "files", article_words=400, children=10)
            raw = sum(f.stat().st_size for f in files)
            for b in SIZES:
                st = Store(str(wd / f"store{b}"), block_size=b)
                t0 = time.perf_counter()
                for f in files:
                    st.ingest(f.stem, str(f), parent=None if f.stem == "parent" else "parent")
                t_in = time.perf_counter() - t0
                t0 = time.perf_counter()
                for f in files:
                    st.materialize(f.stem, str(wd / "out.bin"))
                t_out = time.perf_counter() - t0
                s = st.stats()
                rows.append({"model": model, "block_size": b, "raw_bytes": raw, "stored_bytes": s["stored_bytes"],
                             "objects": s["objects"], "raw_over_stored": round(raw / s["stored_bytes"], 2),
                             "ingest_mb_s": round(raw / t_in / 1e6), "materialize_mb_s": round(raw / t_out / 1e6)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            cleanup(wd)
    print("| model | B | objects | stored MiB | raw / stored | ingest MB/s | materialize MB/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['block_size']} | {r['objects']} | {r['stored_bytes'] / 2**20:.1f} | "
              f"{r['raw_over_stored']} | {r['ingest_mb_s']} | {r['materialize_mb_s']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
