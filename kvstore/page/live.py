"""The live sections of the page (only a running `kvstore serve` has them): slots, savings, server.

Contract: `slots_section(snap)`, `savings_section(snap)`, `server_section(snap)` each return one escaped
`<section>` (or "" when the snapshot lacks its data); snapshot keys as in kvstore/page/__init__.py.
"""
from __future__ import annotations

from typing import Any

from kvstore.page import fmt
from kvstore.page.fmt import esc
from kvstore.page.history import KINDS
from kvstore.page.svg import stacked_columns

KIND_HELP = {
    "slot": "already in a slot",
    "restored": "its own name restored from the store",
    "parent": "started from its parent's state",
    "prefix": "longest stored prefix restored",
    "miss": "evaluated from scratch",
}


def slots_section(snap: dict[str, Any]) -> str:
    slots = snap.get("slots")
    if slots is None:
        return ""
    clock = snap.get("slot_clock")
    rows = []
    for s in slots:
        name = s.get("name")
        if s.get("other"):
            held = '<span class="empty">another namespace</span>'
        elif name is None:
            held = '<span class="empty">unnamed</span>' if s.get("n_tokens") else '<span class="empty">empty</span>'
        else:
            held = fmt.qualified(s.get("namespace") or "", name)
        act = '<span class="badge busy">busy</span>' if s.get("busy") else '<span class="badge">idle</span>'
        if name is None or s.get("other"):
            saved = '<span class="badge">not named</span>'
        elif s.get("dirty"):
            saved = '<span class="badge dirty">unsaved changes</span>'
        else:
            saved = '<span class="badge ok">saved</span>'
        # a slot's tokens are known only when the hooks tokenized its last prompt: 0 for a named slot is unknown
        tokens = fmt.num(s.get("n_tokens")) if s.get("n_tokens") or name is None else "–"
        last = s.get("last_used")
        idle = fmt.esc(fmt.duration(clock - last) + " ago") if clock is not None and last else "–"
        parent = fmt.esc(s["parent"]) if s.get("parent") else "–"
        rows.append(f'<tr data-slot="{int(s.get("id", 0))}"><td class="n">{int(s.get("id", 0))}</td><td>{held}</td>'
                    f'<td>{act}</td><td class="n">{tokens}</td><td>{saved}</td>'
                    f'<td>{parent}</td><td>{idle}</td></tr>')
    body = "".join(rows) or '<tr><td colspan="7" class="empty">no slots</td></tr>'
    q = snap.get("queue_length")
    queue = f" · {fmt.num(q)} waiting for a slot" if q else ""
    return (f'<section id="slots"><h2>Slots</h2><p class="note">{fmt.num(len(slots))} llama-server slots{queue}. '
            'A saved slot can be evicted without losing anything; unsaved changes are saved before eviction.</p>'
            '<table><thead><tr><th class="n">Slot</th><th>Holds</th><th>Activity</th><th class="n">Tokens</th>'
            f'<th>Store</th><th>Parent</th><th>Last used</th></tr></thead><tbody>{body}</tbody></table></section>')


def _x_labels(n: int, bucket_s: float) -> list[str]:
    every = max(1, -(-n // 7))
    return [("+" + fmt.duration(i * bucket_s)) if i % every == 0 else "" for i in range(n)]


def savings_section(snap: dict[str, Any]) -> str:
    h = snap.get("history")
    if h is None:
        return ""
    tot = h["totals"]
    req = sum(t["requests"] for t in tot.values())
    prompt = sum(t["prompt"] for t in tot.values())
    evaluated = sum(t["evaluated"] for t in tot.values())
    restored = sum(t["restored"] for t in tot.values())
    cards = (f'<div class="cards"><div class="card"><b>{fmt.num(req)}</b><span>requests since start</span></div>'
             f'<div class="card"><b>{fmt.num(prompt)}</b><span>prompt tokens</span></div>'
             f'<div class="card"><b>{fmt.num(evaluated)}</b><span>tokens evaluated</span></div>'
             f'<div class="card"><b>{fmt.num(restored)}</b><span>tokens restored from the store</span></div>'
             f'<div class="card"><b>{fmt.pct(prompt - evaluated, prompt)}</b><span>of prompt tokens not evaluated'
             '</span></div></div>')
    buckets, w = h["buckets"], float(h["bucket_s"])
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
        charts = ('<div class="grid2"><div><h3>Prompt tokens</h3>'
                  + stacked_columns(cols, [("c-eval", "evaluated"), ("c-rest", "restored from the store"),
                                           ("c-reuse", "reused in the slot")], labels, fmt.num, tips=tips,
                                    title="Prompt tokens per interval: evaluated, restored, reused",
                                    width=520)
                  + '</div><div><h3>Requests by cache kind</h3>'
                  + stacked_columns(kcols, [(f"k-{k}", k) for k in KINDS], labels, fmt.num, tips=tips,
                                    title="Requests per interval by cache kind", width=520)
                  + "</div></div>")
        span = f"{fmt.duration(w)} per column, since {fmt.esc(fmt.utc(h['start']))}"
    else:
        charts, span = '<p class="empty">No requests yet.</p>', f"since {fmt.esc(fmt.utc(h['start']))}"
    krows = "".join(
        f'<tr><td><i class="sw k-{k}"></i>{k}</td><td class="mute">{esc(KIND_HELP[k])}</td>'
        f'<td class="n">{fmt.num(tot[k]["requests"])}</td><td class="n">{fmt.num(tot[k]["prompt"])}</td>'
        f'<td class="n">{fmt.num(tot[k]["evaluated"])}</td><td class="n">{fmt.num(tot[k]["restored"])}</td>'
        f'<td class="n">{fmt.pct(tot[k]["prompt"] - tot[k]["evaluated"], tot[k]["prompt"])}</td></tr>' for k in KINDS)
    lrows = "".join(
        f'<tr><td>{op}</td><td class="n">{fmt.num(v["count"])}</td><td class="n">{fmt.ms(v["p50"])}</td>'
        f'<td class="n">{fmt.ms(v["p90"])}</td><td class="n">{fmt.ms(v["p99"])}</td><td class="n">{fmt.ms(v["max"])}</td>'
        '</tr>' for op, v in h["latency"].items())
    return (f'<section id="savings"><h2>Savings</h2><p class="note">What the store spared llama-server, {span}.</p>'
            f'{cards}{charts}<h3>By cache kind</h3><table><thead><tr><th>Kind</th><th>Meaning</th>'
            '<th class="n">Requests</th><th class="n">Prompt</th><th class="n">Evaluated</th><th class="n">Restored</th>'
            f'<th class="n">Not evaluated</th></tr></thead><tbody>{krows}</tbody></table>'
            '<h3>Latency</h3><table class="narrow"><thead><tr><th>Operation</th><th class="n">Count</th><th class="n">p50</th>'
            f'<th class="n">p90</th><th class="n">p99</th><th class="n">Max</th></tr></thead><tbody>{lrows}</tbody>'
            '</table><p class="note">Save: llama-server writes the slot, the store ingests it. Restore: the store '
            'writes the file, llama-server loads it. Percentiles of the last samples.</p></section>')


def server_section(snap: dict[str, Any]) -> str:
    fp = snap.get("fingerprint")
    if fp is None and snap.get("upstream") is None:
        return ""
    items = [("llama-server", snap.get("upstream") or "–"), ("slots", fmt.num(snap.get("n_slots")))]
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items)
    fprows = "".join(f'<dt>{esc(k)}</dt><dd class="mono">{esc(v)}</dd>' for k, v in sorted((fp or {}).items()))
    return (f'<section id="server"><h2>Server</h2><dl class="kv">{rows}</dl><h3>Fingerprint</h3>'
            '<p class="note">A state is restored only into a server whose fingerprint matches the one it was saved '
            f'with.</p><dl class="kv" id="fingerprint">{fprows or "<dt>–</dt><dd>none yet</dd>"}</dl></section>')
