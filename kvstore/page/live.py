"""The live sections of the page (only a running `kvstore serve` has them): slots, savings, server.

Contract: `slots_section(snap)`, `savings_section(snap)`, `server_section(snap)` each return one `<section>` as
`Markup` from an autoescaped template (or "" when the snapshot lacks its data); snapshot keys as in
kvstore/page/__init__.py. `evictions_figure(snap)` returns the bounded store's evictions over time (one
`<div id="evictions-over-time">`: per reason the names evicted since start, in `[data-reason]` elements, and a
column per history bucket), which the store section shows; "" unless a bound is in play (`snap["bound"]["enabled"]`)
and the snapshot has the history.
"""
from __future__ import annotations

from typing import Any, Union

from markupsafe import Markup

from kvstore.page import fmt
from kvstore.page.fmt import template
from kvstore.page.history import EVICTION_REASONS, KINDS
from kvstore.page.svg import stacked_columns

KIND_HELP = {
    "slot": "already in a slot",
    "restored": "its own name restored from the store",
    "parent": "started from its parent's state",
    "prefix": "longest stored prefix restored",
    "miss": "evaluated from scratch",
}

_SLOTS = template(
    '<section id="slots"><h2>Slots</h2><p class="note">{{ slots|length|num }} llama-server slots'
    '{% if queue %} · {{ queue|num }} waiting for a slot{% endif %}. '
    'A saved slot can be evicted without losing anything; unsaved changes are saved before eviction.</p>'
    '<table><thead><tr><th class="n">Slot</th><th>Holds</th><th>Activity</th><th class="n">Tokens</th>'
    '<th>Store</th><th>Parent</th><th>Last used</th></tr></thead><tbody>'
    '{% for r in rows %}<tr data-slot="{{ r.id }}"><td class="n">{{ r.id }}</td><td>'
    '{% if r.held %}<span class="empty">{{ r.held }}</span>{% else %}{{ qualified(r.namespace, r.name) }}{% endif %}'
    '</td><td>{% if r.busy %}<span class="badge busy">busy</span>{% else %}<span class="badge">idle</span>{% endif %}'
    '</td><td class="n">{{ r.tokens }}</td><td>'
    '{% if r.saved == "unnamed" %}<span class="badge">not named</span>'
    '{% elif r.saved == "dirty" %}<span class="badge dirty">unsaved changes</span>'
    '{% else %}<span class="badge ok">saved</span>{% endif %}</td>'
    '<td>{{ r.parent }}</td><td>{{ r.idle }}</td></tr>'
    '{% else %}<tr><td colspan="7" class="empty">no slots</td></tr>{% endfor %}'
    '</tbody></table></section>')


def slots_section(snap: dict[str, Any]) -> Union[Markup, str]:
    slots = snap.get("slots")
    if slots is None:
        return ""
    clock = snap.get("slot_clock")
    rows = []
    for s in slots:
        name = s.get("name")
        if s.get("other_namespace"):
            held = "another namespace"
        elif name is None:
            held = "unnamed" if s.get("n_tokens") else "empty"
        else:
            held = ""
        if name is None or s.get("other_namespace"):
            saved = "unnamed"
        else:
            saved = "dirty" if s.get("dirty") else "saved"
        # a slot's tokens are known only when the hooks tokenized its last prompt: 0 for a named slot is unknown
        tokens = fmt.num(s.get("n_tokens")) if s.get("n_tokens") or name is None else "–"
        last = s.get("last_used")
        rows.append({"id": int(s.get("id", 0)), "held": held, "namespace": s.get("namespace") or "", "name": name,
                     "busy": bool(s.get("busy")), "tokens": tokens, "saved": saved,
                     "parent": s["parent"] if s.get("parent") else "–",
                     "idle": fmt.duration(clock - last) + " ago" if clock is not None and last else "–"})
    return Markup(_SLOTS.render(slots=slots, rows=rows, queue=snap.get("queue_length")))

def _x_labels(n: int, bucket_s: float) -> list[str]:
    every = max(1, -(-n // 7))
    return [("+" + fmt.duration(i * bucket_s)) if i % every == 0 else "" for i in range(n)]


_SAVINGS = template(
    '<section id="savings"><h2>Savings</h2><p class="note">What the store spared llama-server, {{ span }}.</p>'
    '<div class="cards"><div class="card"><b>{{ req|num }}</b><span>requests since start</span></div>'
    '<div class="card"><b>{{ prompt|num }}</b><span>prompt tokens</span></div>'
    '<div class="card"><b>{{ evaluated|num }}</b><span>tokens evaluated</span></div>'
    '<div class="card"><b>{{ restored|num }}</b><span>tokens restored from the store</span></div>'
    '<div class="card"><b>{{ (prompt - evaluated)|pct(prompt) }}</b><span>of prompt tokens not evaluated'
    '</span></div></div>'
    '{% if charts %}<div class="grid2"><div><h3>Prompt tokens</h3>{{ charts[0] }}</div>'
    '<div><h3>Requests by cache kind</h3>{{ charts[1] }}</div></div>'
    '{% else %}<p class="empty">No requests yet.</p>{% endif %}'
    '<h3>By cache kind</h3><table><thead><tr><th>Kind</th><th>Meaning</th>'
    '<th class="n">Requests</th><th class="n">Prompt</th><th class="n">Evaluated</th><th class="n">Restored</th>'
    '<th class="n">Not evaluated</th></tr></thead><tbody>'
    '{% for k, t in kinds %}<tr><td><i class="sw k-{{ k }}"></i>{{ k }}</td><td class="mute">{{ help[k] }}</td>'
    '<td class="n">{{ t.requests|num }}</td><td class="n">{{ t.prompt|num }}</td>'
    '<td class="n">{{ t.evaluated|num }}</td><td class="n">{{ t.restored|num }}</td>'
    '<td class="n">{{ (t.prompt - t.evaluated)|pct(t.prompt) }}</td></tr>{% endfor %}</tbody></table>'
    '<h3>Latency</h3><table class="narrow"><thead><tr><th>Operation</th><th class="n">Count</th>'
    '<th class="n">p50</th><th class="n">p90</th><th class="n">p99</th><th class="n">Max</th></tr></thead><tbody>'
    '{% for op, v in latency %}<tr><td>{{ op }}</td><td class="n">{{ v.count|num }}</td>'
    '<td class="n">{{ v.p50|ms }}</td><td class="n">{{ v.p90|ms }}</td><td class="n">{{ v.p99|ms }}</td>'
    '<td class="n">{{ v.max|ms }}</td></tr>{% endfor %}</tbody>'
    '</table><p class="note">Save: llama-server writes the slot, the store ingests it. Restore: the store '
    'writes the file, llama-server loads it. Percentiles of the last samples.</p></section>')


def savings_section(snap: dict[str, Any]) -> Union[Markup, str]:
    h = snap.get("history")
    if h is None:
        return ""
    tot = h["totals"]
    req = sum(t["requests"] for t in tot.values())
    buckets, w = h["buckets"], float(h["bucket_s"])
    charts: tuple[Markup, ...] = ()
    if req:
        cols, tips, kcols = [], [], []
        for i, b in enumerate(buckets):
            # A restored state longer than what the prompt shares counts only up to the prompt: columns are
            # whole prompts, split into evaluated, restored from the store and reused in place.
            rest = min(b["restored"], max(0, b["prompt"] - b["evaluated"]))
            reused = max(0, b["prompt"] - b["evaluated"] - rest)
            cols.append((b["evaluated"], rest, reused))
            kcols.append(tuple(b["requests"][k] for k in KINDS))
            tips.append(f"+{fmt.duration(i * w)}: {b['prompt']:,} prompt tokens, {b['evaluated']:,} evaluated, "
                        f"{b['restored']:,} restored, {reused:,} reused in the slot; "
                        + ", ".join(f"{b['requests'][k]} {k}" for k in KINDS if b["requests"][k]))
        labels = _x_labels(len(buckets), w)
        charts = (stacked_columns(cols, [("c-eval", "evaluated"), ("c-rest", "restored from the store"),
                                         ("c-reuse", "reused in the slot")], labels, fmt.num, tips=tips,
                                  title="Prompt tokens per interval: evaluated, restored, reused", width=520),
                  stacked_columns(kcols, [(f"k-{k}", k) for k in KINDS], labels, fmt.num, tips=tips,
                                  title="Requests per interval by cache kind", width=520))
        span = f"{fmt.duration(w)} per column, since {fmt.utc(h['start'])}"
    else:
        span = f"since {fmt.utc(h['start'])}"
    return Markup(_SAVINGS.render(
        span=span, charts=charts, req=req, prompt=sum(t["prompt"] for t in tot.values()),
        evaluated=sum(t["evaluated"] for t in tot.values()), restored=sum(t["restored"] for t in tot.values()),
        kinds=[(k, tot[k]) for k in KINDS], help=KIND_HELP, latency=list(h["latency"].items())))


EVICTION_HELP = {"cap": "over --max-size", "ttl": "expired", "quota": "over a tenant's quota"}

_EVICTIONS = template(
    '<div id="evictions-over-time"><h3>Evictions over time</h3><p class="note">Names evicted since start: '
    '{% for r, n in totals %}<span data-reason="{{ r }}">{{ r }} <b>{{ n|num }}</b></span>'
    '{% if not loop.last %} · {% endif %}{% endfor %}{% if chart %} ({{ span }}){% endif %}.</p>'
    '{% if chart %}{{ chart }}{% else %}<p class="empty">No names evicted yet.</p>{% endif %}</div>')


def evictions_figure(snap: dict[str, Any]) -> Union[Markup, str]:
    h, bound = snap.get("history"), snap.get("bound")
    if h is None or not bound or not bound.get("enabled"):
        return ""
    buckets, w = h["buckets"], float(h["bucket_s"])
    totals = [(r, (h.get("evicted") or {}).get(r, 0)) for r in EVICTION_REASONS]
    chart = None
    if any(n for _, n in totals):
        cols = [tuple(b["evicted"][r] for r in EVICTION_REASONS) for b in buckets]
        tips = [f"+{fmt.duration(i * w)}: " + (", ".join(f"{b['evicted'][r]} {r}" for r in EVICTION_REASONS
                                                        if b["evicted"][r]) or "none evicted")
                for i, b in enumerate(buckets)]
        chart = stacked_columns(cols, [(f"e-{r}", f"{r} ({EVICTION_HELP[r]})") for r in EVICTION_REASONS],
                                _x_labels(len(buckets), w), fmt.num, tips=tips, height=170,
                                title="Names evicted per interval by reason")
    return Markup(_EVICTIONS.render(totals=totals, chart=chart, span=f"{fmt.duration(w)} per column"))


_SERVER = template(
    '<section id="server"><h2>Server</h2><dl class="kv">{% for k, v in items %}<dt>{{ k }}</dt><dd>{{ v }}</dd>'
    '{% endfor %}</dl><h3>Fingerprint</h3>'
    '<p class="note">A state is restored only into a server whose fingerprint matches the one it was saved '
    'with.</p><dl class="kv" id="fingerprint">{% for k, v in fingerprint %}<dt>{{ k }}</dt><dd class="mono">{{ v }}'
    '</dd>{% else %}<dt>–</dt><dd>none yet</dd>{% endfor %}</dl></section>')


def server_section(snap: dict[str, Any]) -> Union[Markup, str]:
    fp = snap.get("fingerprint")
    if fp is None and snap.get("upstream") is None:
        return ""
    items = [("llama-server", snap.get("upstream") or "–"), ("slots", fmt.num(snap.get("n_slots")))]
    return Markup(_SERVER.render(items=items, fingerprint=sorted((fp or {}).items())))
