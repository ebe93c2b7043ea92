"""Bucket-store costs of the core (`_core.Store("s3://...")`) against a running S3 endpoint (SeaweedFS).

    AWS_ENDPOINT_URL=http://127.0.0.1:PORT python -m bench.remote_core s3://BUCKET/PREFIX STATE.bin [N]

Prints: save (upload) and restore (cold cache / warm cache) throughput next to a local store's, a plain GET of
one object as large as the state's stored bytes, the cost of a save whose objects are all known (lock + name
compare-and-swap), of the first save after a gc elsewhere (the cache re-check), and how long a dead endpoint
takes to fail. Each timing is the median of N runs (default 5).
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from kvstore import _core


def med(f, n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(url: str, state: str, n: int = 5) -> None:
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    size = Path(state).stat().st_size
    mb = size / 1e6
    tmp = Path(tempfile.mkdtemp(prefix="kvs-bench-"))
    local = _core.Store(str(tmp / "local"))
    t_local_save = med(lambda: local.ingest("s", state), 1)
    t_local_load = med(lambda: local.materialize("s", str(tmp / "l.bin")), n)
    t_local_resave = med(lambda: local.ingest("s", state), n)

    a = _core.Store(url, cache=str(tmp / "a"))
    t0 = time.perf_counter()
    r = a.ingest("s", state)
    t_save = time.perf_counter() - t0
    stored = r["new_stored_bytes"]
    t_resave = med(lambda: a.ingest("s", state), n)
    colds = []
    for k in range(n):
        b = _core.Store(url, cache=str(tmp / f"b{k}"))
        t0 = time.perf_counter()
        b.materialize("s", str(tmp / "b.bin"))
        colds.append(time.perf_counter() - t0)
    t_cold = statistics.median(colds)
    t_warm = med(lambda: b.materialize("s", str(tmp / "b.bin")), n)

    # A plain GET of one object as large as the state's stored bytes (anonymous endpoint).
    bucket, _, prefix = url[len("s3://"):].partition("/")
    key = f"{endpoint}/{bucket}/{prefix}/bench-blob"
    urllib.request.urlopen(urllib.request.Request(key, data=os.urandom(stored), method="PUT")).read()
    t_get = med(lambda: urllib.request.urlopen(key).read(), n)

    # The first save after a gc elsewhere re-checks the cache (one listing), then saves as usual.
    b.gc(grace_seconds=3600)
    t0 = time.perf_counter()
    a.ingest("s", state)
    t_after_gc = time.perf_counter() - t0

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{dead}"
    t0 = time.perf_counter()
    try:
        _core.Store(url, cache=str(tmp / "dead"))
    except _core.RemoteUnavailable:
        pass
    t_dead = time.perf_counter() - t0
    os.environ["AWS_ENDPOINT_URL"] = endpoint

    print(f"state {Path(state).name}: {mb:.1f} MB, {r['new_objects']} objects, {stored / 1e6:.1f} MB stored")
    print(f"save     local {mb / t_local_save:7.1f} MB/s   bucket {mb / t_save:7.1f} MB/s ({t_save:.2f} s)")
    print(f"restore  local {mb / t_local_load:7.1f} MB/s   bucket cold {mb / t_cold:7.1f} MB/s ({t_cold:.2f} s)"
          f"   warm {mb / t_warm:7.1f} MB/s ({t_warm:.3f} s)")
    print(f"plain GET of {stored / 1e6:.1f} MB: {t_get:.3f} s = {stored / 1e6 / t_get:.1f} MB/s "
          f"(cold restore moves the same bytes in {t_cold:.3f} s)")
    print(f"save of known objects: bucket {t_resave * 1e3:.0f} ms, local {t_local_resave * 1e3:.0f} ms "
          f"(the difference: lock + gc generation + CAS of one name)")
    print(f"first save after a gc elsewhere: {t_after_gc * 1e3:.0f} ms")
    print(f"dead endpoint -> RemoteUnavailable in {t_dead:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(x) for x in sys.argv[3:4]))
