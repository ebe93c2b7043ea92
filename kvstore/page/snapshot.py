"""The store part of a page snapshot, from a `kvstore.Store` (the compiled core's `list` and `stats`).

Contract: `store_snapshot(store, namespace=None, *, stats=None) -> dict` (shape in kvstore/page/__init__.py). `namespace`
None lists every namespace (the operator's view); a string lists only that namespace, so a tenant's page never
names another tenant's states. Blocking (it reads the index): the hooks call it in a worker thread.

Lineage: the core records a state's parent as the parent's *manifest id* at ingest (`Store.ingest`, whose
`resolve_parent` turns a parent name into its manifest id), and `list` gives each name's current manifest id, so parent names are derived here by
matching ids among the listed names. A parent whose name has since been saved again (or removed) no longer has a
name; it is kept as `parent_id` with `parent` None, and the page shows it as "an earlier state".
"""
from __future__ import annotations

from typing import Any, Optional


def store_snapshot(store: Any, namespace: Optional[str] = None, *, stats: Optional[dict[str, Any]] = None,
                   stats_namespace: Optional[str] = None) -> dict[str, Any]:
    """`stats`: `store.stats()` read already by the caller (the hooks pass {"unavailable": message} while an S3
    store's bucket is unreachable); None reads it here. `stats_namespace`: the sizes are that namespace's only
    (`store.stats(namespace=...)`: what a tenant sees when the server has API keys); None: the whole store's."""
    if stats is None:
        stats = store.stats() if stats_namespace is None else store.stats(namespace=stats_namespace)
    items = [dict(x) for x in store.list(namespace=namespace)]
    by_id: dict[str, dict] = {}
    for x in items:
        by_id.setdefault(x["manifest_id"], x)  # two names may share a manifest: the first in list order wins
    children: dict[tuple[str, str], list[str]] = {}
    for x in items:
        pid = x.get("parent")
        p = by_id.get(pid) if pid else None
        if p is not None and (p["namespace"], p["name"]) == (x["namespace"], x["name"]):
            p = None  # a name re-saved over itself: its old manifest is its own current one only by dedup
        x["parent_id"] = pid or None
        x["parent"] = p["name"] if p is not None and p["namespace"] == x["namespace"] else None
        if x["parent"] is not None:
            children.setdefault((x["namespace"], x["parent"]), []).append(x["name"])
    namespaces: dict[str, list[dict]] = {}
    for x in items:
        namespaces.setdefault(x["namespace"], []).append({
            "name": x["name"], "manifest_id": x["manifest_id"], "n_tokens": int(x.get("n_tokens") or 0),
            "file_bytes": int(x.get("file_bytes") or 0), "created": x.get("created"),
            "last_used": x.get("last_used"), "parent": x["parent"], "parent_id": x["parent_id"],
            "children": sorted(children.get((x["namespace"], x["name"]), [])),
        })
    return {
        "path": str(getattr(store, "path", "")),
        "scope": namespace,
        "stats": dict(stats),
        "stats_scope": stats_namespace,
        "namespaces": [{"namespace": ns, "names": names, "n_tokens": sum(n["n_tokens"] for n in names),
                        "file_bytes": sum(n["file_bytes"] for n in names)} for ns, names in sorted(namespaces.items())],
    }
