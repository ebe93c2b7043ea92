"""A user's state moving between machines: two `kvstore serve` on one S3 store (a real SeaweedFS on loopback).

* time to first token of a returning user whose turn lands on the other server: its cache cold (the state comes
  from the bucket) and warm (the state is in that server's cache), next to a full evaluation of the same prompt;
* restore throughput from the bucket (a cold cache materializing the state) vs one plain GET of as many bytes,
  and from a warm cache.
"""
from __future__ import annotations

import os
import random
import time
import urllib.request
from pathlib import Path

from . import text
from .client import complete, tokenize
from .targets import BUCKET, TARGETS, Target, bucket_env, seaweed


def _get(url: str) -> dict:
    import json

    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _wait(cond, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"handoff: {what} not within {timeout:.0f} s")
        time.sleep(0.2)


def _stored(url: str, name: str) -> bool:
    try:
        _get(f"{url}/kvstore/states/{name}")
        return True
    except OSError:
        return False


def _clean(url: str) -> bool:
    return not any(s["dirty"] for s in _get(f"{url}/kvstore/stats")["slots"])


def run(model: str, work: Path, parallel: int, ctx_size: int, history_words: int = 1400, n_predict: int = 8,
        seed: int = 5) -> dict:
    rng = random.Random(seed)
    p1 = ("System: You are a helpful assistant.\nUser: " + text.paragraph(rng, history_words) + " "
          + text.paragraph(rng, 20) + "\nAssistant:")
    target = Target(TARGETS["s3x2"], model, parallel, ctx_size, work)
    try:
        a, b = target.urls
        r1 = complete(a, p1, n_predict, {"cache_prompt_name": "mover"})
        p2 = p1 + r1.text + "\nUser: " + text.paragraph(rng, 20) + "\nAssistant:"
        _wait(lambda: _stored(b, "mover") and _clean(a), "A's save of the user")
        cold = complete(b, p2, n_predict, {"cache_prompt_name": "mover"})
        assert cold.kv_cache == "restored", cold.kv_cache
        # evict "mover" from B's slots (saved first: into B's cache and the bucket), then return to B
        _wait(lambda: _clean(b), "B's save of the user")
        for i in range(parallel):
            complete(b, text.paragraph(random.Random(i), 30), 1, {"cache_prompt_name": f"filler{i}"})
        _wait(lambda: _clean(b), "B's fillers saved")
        p3 = p2 + cold.text + "\nUser: " + text.paragraph(rng, 20) + "\nAssistant:"
        warm = complete(b, p3, n_predict, {"cache_prompt_name": "mover"})
        assert warm.kv_cache == "restored", warm.kv_cache
        # the same prompt evaluated in full (a namespace with nothing stored)
        full = complete(b, p3, n_predict, {}, headers={"X-KV-Namespace": "nothing-stored"})
        n_tokens = len(tokenize(b, p3))
        throughput = _throughput(target, work)
    finally:
        target.close()
    return {"prompt_tokens": n_tokens,
            "ttft_cold_s": round(cold.ttft_s, 4), "prompt_n_cold": cold.prompt_n,
            "ttft_warm_s": round(warm.ttft_s, 4), "prompt_n_warm": warm.prompt_n,
            "ttft_full_eval_s": round(full.ttft_s, 4), "prompt_n_full": full.prompt_n,
            **throughput}


def _throughput(target: Target, work: Path, repeats: int = 3) -> dict:
    """Materialize the user's state in this process from a cold cache (bucket) and a warm one, vs one GET of as
    many bytes as the cold restore read from the bucket."""
    import kvstore

    sw = seaweed()
    with bucket_env(target.env):  # the bench process talks to the bucket only here
        best: dict = {}
        for rep in range(repeats):
            st = kvstore.open_store(target.remote, cache=work / f"probe{rep}")
            t0 = time.perf_counter()
            cold = st.materialize("mover", str(work / "cold.bin"))
            best["cold"] = min(best.get("cold", 1e9), time.perf_counter() - t0)
            t0 = time.perf_counter()
            st.materialize("mover", str(work / "warm.bin"))
            best["warm"] = min(best.get("warm", 1e9), time.perf_counter() - t0)
        n_read = int(cold.get("read_stored_bytes") or 0)
        key = f"get-baseline/{os.getpid()}.bin"
        sw.put_object(BUCKET, key, os.urandom(n_read))
        for _ in range(repeats):
            t0 = time.perf_counter()
            sw.get_object(BUCKET, key)
            best["get"] = min(best.get("get", 1e9), time.perf_counter() - t0)
    file_bytes = int(cold["file_bytes"])
    return {"state_file_bytes": file_bytes, "bucket_bytes_read": n_read, "objects_read": cold.get("objects_read"),
            "restore_cold_s": round(best["cold"], 4), "restore_warm_s": round(best["warm"], 4),
            "get_same_bytes_s": round(best["get"], 4),
            "restore_cold_mb_s": round(n_read / best["cold"] / 1e6, 1),
            "get_mb_s": round(n_read / best["get"] / 1e6, 1),
            "restore_cold_file_mb_s": round(file_bytes / best["cold"] / 1e6, 1),
            "restore_warm_file_mb_s": round(file_bytes / best["warm"] / 1e6, 1)}
