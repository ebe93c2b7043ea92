"""GC: mark from names, sweep unreachable objects older than the grace period; never rob a running ingest."""
from __future__ import annotations

import threading
import time

from conftest import manifests_by_name, object_path, tree_snapshot


def _objects(store_dir) -> set[str]:
    return {p.name for p in (store_dir / "objects").glob("*/*") if not p.name.startswith(".")}


def test_rm_then_gc_frees_only_unique_objects(store, state_files, tmp_path):
    d = tmp_path / "store"
    parent, child = state_files["smollm2_parent"], state_files["smollm2_child"]
    store.ingest("article", str(parent))
    alone = store.stats()
    objs_alone = _objects(d)
    store.ingest("a", str(parent), parent="article")  # same bytes as the parent: shares everything
    r_b = store.ingest("b", str(child), parent="article")  # restored from the parent: shares the prefix
    assert r_b["reused_bytes"] > 0, r_b
    full = store.stats()
    assert full["stored_bytes"] > alone["stored_bytes"]
    m = manifests_by_name(d)
    b_only = (set(m["b"]["blocks"]) | {m["b"]["skeleton"], m["b"]["_id"]}) - (
        set(m["article"]["blocks"]) | {m["article"]["skeleton"], m["article"]["_id"]}
        | set(m["a"]["blocks"]) | {m["a"]["skeleton"], m["a"]["_id"]})
    b_only &= _objects(d)  # the ones stored as object files (blocks, skeleton, manifest)
    assert b_only

    assert store.remove("b") is True
    assert store.remove("b") is False
    snap = tree_snapshot(d / "objects")

    # dry run: reports, deletes nothing
    dry = store.gc(grace_seconds=0, dry_run=True)
    assert dry["dry_run"] is True and dry["dead_objects"] == len(b_only) and dry["freed_bytes"] > 0, dry
    assert tree_snapshot(d / "objects") == snap

    # the grace period keeps young unreferenced objects
    young = store.gc(grace_seconds=3600)
    assert young["kept_young"] >= len(b_only) and young["freed_bytes"] == 0, young
    assert tree_snapshot(d / "objects") == snap

    done = store.gc(grace_seconds=0)
    assert done["dead_objects"] == len(b_only) and done["freed_bytes"] == dry["freed_bytes"], done
    after = store.stats()
    assert after["stored_bytes"] == full["stored_bytes"] - done["freed_bytes"]
    assert after["stored_bytes"] < full["stored_bytes"]
    left = _objects(d)
    assert not (left & b_only)
    assert all(object_path(d, o).is_file() for o in m["article"]["blocks"] + m["a"]["blocks"])
    assert objs_alone <= left
    for name in ("article", "a"):
        out = tmp_path / f"{name}.bin"
        store.materialize(name, str(out))
        assert out.read_bytes() == parent.read_bytes()
    assert store.verify()["corrupt"] == [] and store.verify()["missing"] == []
    # nothing left to collect
    again = store.gc(grace_seconds=0)
    assert again["dead_objects"] == 0 and again["freed_bytes"] == 0


def test_concurrent_ingest_and_gc(store, state_files, tmp_path):
    """gc with grace 0 in a loop while other threads ingest: every ingested name materializes byte-exactly."""
    files = {"g_child": state_files["gemma3_child"], "g_parent": state_files["gemma3_parent"],
             "s_child": state_files["smollm2_child"]}
    errors: list[BaseException] = []
    stop = threading.Event()
    gcs = [0]

    def collector():
        try:
            while not stop.is_set():
                store.gc(grace_seconds=0)
                gcs[0] += 1
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def ingester(name, path):
        try:
            for i in range(2):
                store.ingest(f"{name}-{i}", str(path))
                if i == 0:
                    store.remove(f"{name}-{i}")  # its objects become garbage while the next ingest reuses them
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    t_gc = threading.Thread(target=collector)
    t_gc.start()
    workers = [threading.Thread(target=ingester, args=(n, p)) for n, p in files.items()]
    t0 = time.time()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    stop.set()
    t_gc.join(timeout=300)
    assert not errors, errors
    assert gcs[0] >= 1
    store.gc(grace_seconds=0)
    for name, path in files.items():
        out = tmp_path / f"{name}.bin"
        store.materialize(f"{name}-1", str(out))
        assert out.read_bytes() == path.read_bytes(), name
    v = store.verify()
    assert v["corrupt"] == [] and v["missing"] == [], v
    print(f"\n[gc] {gcs[0]} gc passes during {time.time() - t0:.1f}s of concurrent ingests")
