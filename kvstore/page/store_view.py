"""The store section of the page: sizes and ratios, names per namespace, and the lineage drawn as a tree.

Contract: `store_section(snap)` returns one `<section id="store">` as `Markup` from an autoescaped template, from
`snap["store"]` (the dict `store_snapshot` builds; "" when absent). Stats with "unavailable": message (an S3
store's bucket unreachable) put a notice with that message first. The lineage tree is nested `<ul class="tree">`
lists (CSS draws the connectors): an article at the root, the states saved from it below. States whose parent was
saved again since (the parent's manifest has no name any more) hang under one dashed "earlier state" node per
parent manifest. With a bound in play (a running server's operator view) the cap card and the evictions over time
(live.py `evictions_figure`) follow the cards.
"""
from __future__ import annotations

from typing import Any, Union

from markupsafe import Markup

from kvstore.page import fmt
from kvstore.page.fmt import template
from kvstore.page.live import evictions_figure
from kvstore.page.svg import hbars

_NODE = template('<span class="node" data-name="{{ n.name }}"><span class="name">{{ n.name }}</span>'
                 '<small>{{ n.n_tokens|num }} tokens · {{ n.file_bytes|size }}</small></span>')
_BRANCH = template('<li>{{ node }}{% if inner %}<ul>{{ inner }}</ul>{% endif %}</li>')
_EARLIER = template('<li><span class="node gone" title="manifest {{ pid }}">an earlier state '
                    '<small class="mono">{{ pid[:12] }}…</small></span><ul>{{ inner }}</ul></li>')
_TREE = template('{% if items %}<ul class="tree">{% for i in items %}{{ i }}{% endfor %}</ul>'
                 '{% else %}<p class="empty">No lineage: no state here was saved with a parent.</p>{% endif %}')
_NAMES = template(
    '<table class="names"><thead><tr><th>Name</th><th class="n">Tokens</th><th class="n">Size</th>'
    '<th>Last used</th><th>Parent</th><th class="n">Children</th></tr></thead><tbody>'
    '{% for n in names %}<tr data-name="{{ n.name }}"><td class="name">{{ n.name }}</td>'
    '<td class="n">{{ n.n_tokens|num }}</td><td class="n">{{ n.file_bytes|size }}</td>'
    '<td>{{ ago(n.get("last_used"), now) }}</td>'
    '<td>{% if n.parent %}{{ n.parent }}{% elif n.get("parent_id") %}an earlier state{% else %}–{% endif %}</td>'
    '<td class="n">{% if n.children %}{{ n.children|length|num }}{% else %}–{% endif %}</td></tr>{% endfor %}'
    '</tbody></table>')
_NAMESPACE = template(
    '<div class="namespace" data-namespace="{{ ns.namespace }}"><h3>'
    '{% if ns.namespace %}Namespace <span class="name">{{ ns.namespace }}</span>{% else %}Default namespace{% endif %}'
    ' <small>· {{ n|num }} name{{ "s" if n != 1 else "" }} · {{ ns.n_tokens|num }} tokens · '
    '{{ ns.file_bytes|size }}</small></h3>'
    '{% if lineage %}<div class="grid2"><div>{{ table }}</div><div class="lineage"><p class="note">Lineage: an '
    'article and the states saved from it.</p>{{ lineage }}</div></div>{% else %}{{ table }}{% endif %}</div>')
_STORE = template(
    '<section id="store"><h2>Store</h2>'
    '{% if unavailable %}<p class="alert" id="bucket-unreachable" role="alert"><b>The bucket is unreachable:</b> '
    '{{ unavailable }}. Until it answers, sizes and names are those this server\'s local index holds; saves and '
    'restores that need the bucket fail.</p>{% endif %}'
    '<p class="note"><span class="mono">{{ path }}</span>'
    ' · {{ scope_note }} · blocks of {{ s.get("block_size")|num }} tokens · {{ s.get("objects")|num }} '
    'objects in {{ s.get("manifests")|num }} manifests</p>'
    '<div class="cards"><div class="card"><b>{{ s.get("names")|num }}</b><span>names</span></div>'
    '<div class="card"><b>{{ logical|size }}</b><span>logical (the saved files)</span></div>'
    '<div class="card"><b>{{ stored|size }}</b><span>stored on disk</span></div>'
    '<div class="card"><b id="dedup-ratio">{{ s.get("dedup_ratio")|ratio }}</b><span>dedup ratio</span></div>'
    '<div class="card"><b id="compression-ratio">{{ s.get("compression_ratio")|ratio }}</b>'
    '<span>compression ratio</span></div>'
    '<div class="card"><b id="total-ratio">{{ s.get("total_ratio")|ratio }}</b><span>total ratio</span></div>'
    '{% if bound and bound.max_bytes %}<div class="card" id="store-cap"><b>{{ (bound.used_bytes or 0)|size }} of '
    '{{ bound.max_bytes|size }}</b><span>stored of the cap (--max-size) · {{ evicted|num }} names evicted '
    '(cap {{ bound.evicted.cap|num }}, ttl {{ bound.evicted.ttl|num }}, quota {{ bound.evicted.quota|num }})'
    '</span></div>{% endif %}</div>{{ evictions }}'
    '<h3>Bytes</h3>{{ bars }}'
    '<p class="note" id="sizes-scope">Sizes and ratios are for {{ sizes_note }}. Dedup: logical ÷ unique (blocks '
    'shared between states are kept once). Compression: unique ÷ stored.</p>'
    '{% for p in parts %}{{ p }}{% else %}<p class="empty">The store holds no names.</p>{% endfor %}</section>')


def _branch(n: dict, by_name: dict[str, dict], seen: set[str]) -> Markup:
    seen.add(n["name"])
    kids = [by_name[c] for c in n["children"] if c in by_name and c not in seen]
    inner = Markup("").join(_branch(k, by_name, seen) for k in kids)
    return Markup(_BRANCH.render(node=Markup(_NODE.render(n=n)), inner=inner))


def lineage_tree(names: list[dict]) -> Markup:
    """The families among `names` (one namespace): roots are states with children and no named parent."""
    by_name = {n["name"]: n for n in names}
    seen: set[str] = set()
    items = [_branch(n, by_name, seen) for n in names if n["children"] and n["parent"] is None]
    orphans: dict[str, list[dict]] = {}
    for n in names:
        if n["parent"] is None and n.get("parent_id"):
            orphans.setdefault(n["parent_id"], []).append(n)
    for pid, kids in sorted(orphans.items()):
        inner = Markup("").join(_branch(k, by_name, seen) for k in kids if k["name"] not in seen)
        if inner:
            items.append(Markup(_EARLIER.render(pid=pid, inner=inner)))
    return Markup(_TREE.render(items=items))


def store_section(snap: dict[str, Any]) -> Union[Markup, str]:
    st = snap.get("store")
    if st is None:
        return ""
    s, now = st.get("stats") or {}, float(snap.get("generated") or 0)
    # "unavailable": an S3 store's bucket unreachable (AsyncStore.stats_or_unavailable); the sizes are the index's
    logical, unique, stored = (float(s.get(k) or 0) for k in ("logical_bytes", "unique_raw_bytes", "stored_bytes"))
    bars = hbars([("logical", logical, "b-logical", fmt.size(logical)),
                  ("unique (deduplicated)", unique, "b-unique", fmt.size(unique)),
                  ("stored (compressed)", stored, "b-stored", fmt.size(stored))],
                 title="Logical, unique and stored bytes")
    scope = st.get("scope")
    scope_note = (f"namespace {scope} only" if scope else "the default namespace only") if scope is not None \
        else "all namespaces"
    parts = []
    for ns in st.get("namespaces") or []:
        names = ns["names"]
        lineage = lineage_tree(names) if any(x["parent"] or x["children"] or x.get("parent_id") for x in names) \
            else None
        parts.append(Markup(_NAMESPACE.render(ns=ns, n=len(names), table=Markup(_NAMES.render(names=names, now=now)),
                                              lineage=lineage)))
    bound = snap.get("bound")  # the store's cap (hooks/bound.py describe()); the operator's view only
    evicted = sum((bound.get("evicted") or {}).values()) if bound else 0
    sizes_scope = st.get("stats_scope")
    sizes_note = "the whole store" if sizes_scope is None else \
        (f"namespace {sizes_scope} only" if sizes_scope else "the default namespace only")
    return Markup(_STORE.render(path=st.get("path") or "", scope_note=scope_note, sizes_note=sizes_note, s=s,
                                logical=logical, stored=stored, bars=bars, parts=parts,
                                unavailable=s.get("unavailable"), bound=bound, evicted=evicted,
                                evictions=evictions_figure(snap)))
