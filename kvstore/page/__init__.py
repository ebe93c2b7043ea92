"""The status page: what is stored, what it saves, at a glance. Pure rendering (no aiohttp, no I/O but the
store reads in `store_snapshot`); the hooks serve it at `GET /kvstore/`, `kvstore stats --html FILE` writes it.

    render_page(snapshot, live=True|False) -> str   one self-contained HTML page (render.py)
    render_fragment(snapshot) -> str                the live page's `<main>` content, fetched with ?fragment=1
    History                                         what the hooks did since start (history.py)
    store_snapshot(store, namespace=None) -> dict   the "store" part, from a kvstore.Store (snapshot.py)
    operator_view(remote, headers) -> bool          whether a request may see every namespace

The snapshot (every key optional; a section whose key is missing is left out, so the store-only page of
`kvstore stats --html` is just {"store": ...}). The live keys are those of `/kvstore/stats`, plus two:

    {
      "generated": float,            # unix time of the snapshot (default: now)
      "upstream": str,               # the llama-server URL the hooks front
      "n_slots": int, "queue_length": int,
      "fingerprint": {str: str},     # Hooks.expect(): what a state must match to be restored here
      "slots": [{"id": int, "name": str|None, "namespace": str, "n_tokens": int, "dirty": bool,
                 "busy": bool, "last_used": float, "parent": str|None}],      # SlotTable.as_list(viewer)
                                     # (another tenant's slot: {"id", "busy", "other_namespace": True})
      "slot_clock": float,           # SlotTable.clock() now: slots' last_used is on that (monotonic) clock
      "history": History.snapshot(): {
          "start": float, "now": float, "bucket_s": float,
          "buckets": [{"t": float, "requests": {kind: int}, "prompt": int, "evaluated": int, "restored": int,
                       "evicted": {reason: int}}],   # names evicted in the bucket, by reason
          "totals": {kind: {"requests": int, "prompt": int, "evaluated": int, "restored": int}},
          "evicted": {reason: int},                  # names evicted since start, by reason
          "latency": {"save"|"restore": {"count": int, "window": int, "p50", "p90", "p99", "max": float|None}}},
      "store": store_snapshot(store, namespace): {
          "path": str, "scope": str|None,          # None: every namespace is listed
          "stats": Store.stats(),                  # names, manifests, objects, logical_bytes, unique_raw_bytes,
                                                   # stored_bytes, dedup_ratio, compression_ratio, total_ratio, block_size
          "stats_scope": str|None,                 # the namespace the sizes are of (a tenant's view); None: the store
          "namespaces": [{"namespace": str, "n_tokens": int, "file_bytes": int, "names": [
              {"name": str, "manifest_id": str, "n_tokens": int, "file_bytes": int, "created": float,
               "last_used": float, "parent": str|None, "parent_id": str|None, "children": [str]}]}]},
      "bound": Bound.describe() (hooks/bound.py): {"enabled": bool, "max_bytes", "used_bytes",
                                                   "evicted": {"cap", "ttl", "quota"}, ..}
    }
kind is one of "slot", "restored", "parent", "prefix", "miss" (the X-KV-Cache values); reason one of "cap"
(--max-size), "ttl" (expired), "quota" (a tenant's quota), EVICTION_REASONS. Every string is
HTML-escaped when rendered; names, namespaces and fingerprint values may hold anything.
"""
from __future__ import annotations

import ipaddress
from typing import Mapping, Optional

from kvstore.llama import API_KEY_HEADERS
from kvstore.page.history import EVICTION_REASONS, KINDS, History
from kvstore.page.render import render_fragment, render_page
from kvstore.page.snapshot import store_snapshot


def operator_view(remote: Optional[str], headers: Mapping[str, str]) -> bool:
    """True for the operator: a request from the loopback interface with no API key (`Authorization`, `X-Api-Key`)
    and no namespace header; it sees every namespace. Anyone else sees their own namespace only (as on the API).
    Behind a reverse proxy on the same host every request comes from loopback: that proxy must then send a key or
    a namespace."""
    if any(headers.get(h) for h in API_KEY_HEADERS) or headers.get("X-KV-Namespace") is not None:
        return False
    try:
        return remote is not None and ipaddress.ip_address(remote.split("%")[0]).is_loopback
    except ValueError:  # a unix socket or an unknown peer
        return False


__all__ = ["operator_view", "render_page", "render_fragment", "History", "store_snapshot", "KINDS", "EVICTION_REASONS"]
