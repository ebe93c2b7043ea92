"""The store section of the page: sizes and ratios, names per namespace, and the lineage drawn as a tree.

Contract: `store_section(snap)` returns one escaped `<section id="store">` from `snap["store"]` (the dict
`store_snapshot` builds; "" when absent). The lineage tree is nested `<ul class="tree">` lists (CSS draws the
connectors): an article at the root, the states saved from it below. States whose parent was saved again since
(the parent's manifest has no name any more) hang under one dashed "earlier state" node per parent manifest.
"""
from __future__ import annotations

from typing import Any

from kvstore.page import fmt
from kvstore.page.fmt import esc
from kvstore.page.svg import hbars


def _node(n: dict) -> str:
    return (f'<span class="node" data-name="{esc(n["name"])}"><span class="name">{esc(n["name"])}</span>'
            f'<small>{fmt.num(n["n_tokens"])} tokens · {fmt.size(n["file_bytes"])}</small></span>')


def _branch(n: dict, by_name: dict[str, dict], seen: set[str]) -> str:
    seen.add(n["name"])
    kids = [by_name[c] for c in n["children"] if c in by_name and c not in seen]
    inner = "".join(_branch(k, by_name, seen) for k in kids)
    return f'<li>{_node(n)}{f"<ul>{inner}</ul>" if inner else ""}</li>'


def lineage_tree(names: list[dict]) -> str:
    """The families among `names` (one namespace): roots are states with children and no named parent."""
    by_name = {n["name"]: n for n in names}
    seen: set[str] = set()
    items = [_branch(n, by_name, seen) for n in names if n["children"] and n["parent"] is None]
    orphans: dict[str, list[dict]] = {}
    for n in names:
        if n["parent"] is None and n.get("parent_id"):
            orphans.setdefault(n["parent_id"], []).append(n)
    for pid, kids in sorted(orphans.items()):
        inner = "".join(_branch(k, by_name, seen) for k in kids if k["name"] not in seen)
        if inner:
            items.append(f'<li><span class="node gone" title="manifest {esc(pid)}">an earlier state '
                         f'<small class="mono">{esc(pid[:12])}…</small></span><ul>{inner}</ul></li>')
    if not items:
        return '<p class="empty">No lineage: no state here was saved with a parent.</p>'
    return f'<ul class="tree">{"".join(items)}</ul>'


def _names_table(names: list[dict], now: float) -> str:
    rows = "".join(
        f'<tr data-name="{esc(n["name"])}"><td class="name">{esc(n["name"])}</td>'
        f'<td class="n">{fmt.num(n["n_tokens"])}</td><td class="n">{fmt.size(n["file_bytes"])}</td>'
        f'<td>{fmt.ago(n.get("last_used"), now)}</td>'
        f'<td>{esc(n["parent"]) if n["parent"] else ("an earlier state" if n.get("parent_id") else "–")}</td>'
        f'<td class="n">{fmt.num(len(n["children"])) if n["children"] else "–"}</td></tr>' for n in names)
    return ('<table class="names"><thead><tr><th>Name</th><th class="n">Tokens</th><th class="n">Size</th>'
            '<th>Last used</th><th>Parent</th><th class="n">Children</th></tr></thead>'
            f'<tbody>{rows}</tbody></table>')


def store_section(snap: dict[str, Any]) -> str:
    st = snap.get("store")
    if st is None:
        return ""
    s, now = st.get("stats") or {}, float(snap.get("generated") or 0)
    logical, unique, stored = (float(s.get(k) or 0) for k in ("logical_bytes", "unique_raw_bytes", "stored_bytes"))
    cards = (f'<div class="cards"><div class="card"><b>{fmt.num(s.get("names"))}</b><span>names</span></div>'
             f'<div class="card"><b>{fmt.size(logical)}</b><span>logical (the saved files)</span></div>'
             f'<div class="card"><b>{fmt.size(stored)}</b><span>stored on disk</span></div>'
             f'<div class="card"><b id="dedup-ratio">{fmt.ratio(s.get("dedup_ratio"))}</b><span>dedup ratio</span></div>'
             f'<div class="card"><b id="compression-ratio">{fmt.ratio(s.get("compression_ratio"))}</b>'
             f'<span>compression ratio</span></div>'
             f'<div class="card"><b id="total-ratio">{fmt.ratio(s.get("total_ratio"))}</b><span>total ratio</span></div></div>')
    bars = hbars([("logical", logical, "b-logical", fmt.size(logical)),
                  ("unique (deduplicated)", unique, "b-unique", fmt.size(unique)),
                  ("stored (compressed)", stored, "b-stored", fmt.size(stored))],
                 title="Logical, unique and stored bytes")
    scope = st.get("scope")
    scope_note = (f"namespace {esc(scope)!s} only" if scope else "the default namespace only") if scope is not None \
        else "all namespaces"
    parts = []
    for ns in st.get("namespaces") or []:
        title = (f'Namespace <span class="name">{esc(ns["namespace"])}</span>' if ns["namespace"]
                 else "Default namespace")
        n = len(ns["names"])
        head = (f'<h3>{title} <small>· {fmt.num(n)} name{"s" if n != 1 else ""} · {fmt.num(ns["n_tokens"])} '
                f'tokens · {fmt.size(ns["file_bytes"])}</small></h3>')
        table = _names_table(ns["names"], now)
        if any(x["parent"] or x["children"] or x.get("parent_id") for x in ns["names"]):
            table = (f'<div class="grid2"><div>{table}</div><div class="lineage"><p class="note">Lineage: an '
                     f'article and the states saved from it.</p>{lineage_tree(ns["names"])}</div></div>')
        parts.append(f'<div class="namespace" data-namespace="{esc(ns["namespace"])}">{head}{table}</div>')
    body = "".join(parts) or '<p class="empty">The store holds no names.</p>'
    return (f'<section id="store"><h2>Store</h2><p class="note"><span class="mono">{esc(st.get("path") or "")}</span>'
            f' · {scope_note} · blocks of {fmt.num(s.get("block_size"))} tokens · {fmt.num(s.get("objects"))} '
            f'objects in {fmt.num(s.get("manifests"))} manifests</p>{cards}<h3>Bytes</h3>{bars}'
            '<p class="note">Sizes and ratios are for the whole store. Dedup: logical ÷ unique (blocks shared '
            'between states are kept once). Compression: unique ÷ stored.</p>'
            f'{body}</section>')
