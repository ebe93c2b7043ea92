"""The seed's job: a shuffled OpenAI Batch file of articles x questions through `kvstore batch`.

The same file goes, with the same concurrency, to `kvstore serve` (the batch command finds the articles itself:
no names, no parents in the file) and to plain llama-server in the file's order (`--keep-order`: what a plain
client does), and to plain llama-server in the best order a client could choose (article-major: the plan's
order, so its own prompt cache reuses each article while it is in a slot). Token counts come from the replies'
`timings.prompt_n` (plus priming); `ideal` counts each distinct token prefix once.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from . import text
from .targets import ROOT, TARGETS, Target


def write_file(path: Path, p: dict) -> int:
    rng = random.Random(p["seed"])
    articles = [text.paragraph(rng, rng.randint(*p["article_words"])) for _ in range(p["articles"])]
    lines = []
    for a, art in enumerate(articles):
        for q in range(p["questions"]):
            prompt = art + "\n\nQuestion: " + text.question(rng) + "\nAnswer:"
            lines.append({"custom_id": f"a{a}-q{q}", "method": "POST", "url": "/completion",
                          "body": {"prompt": prompt, "n_predict": p["n_predict"], "temperature": 0}})
    random.Random(p["seed"] + 1).shuffle(lines)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return len(lines)


def _batch(url: str, inp: Path, out: Path, concurrency: int, *extra: str) -> dict:
    summary = out.with_suffix(".summary.json")
    cmd = [sys.executable, "-m", "kvstore.cli", "batch", str(inp), "-o", str(out), "--server", url,
           "--concurrency", str(concurrency), "--summary", str(summary), "-q", *extra]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"kvstore batch failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(summary.read_text())


def run(model: str, workdir: Path, parallel: int, ctx_size: int, p: dict, always: bool = False) -> list[dict]:
    """`always`: one more row, `kvstore serve --restore-policy always` (the token path without the cost model,
    which on a tiny model recomputes what it could restore)."""
    inp = workdir / "batch.jsonl"
    n = write_file(inp, p)
    concurrency = p.get("concurrency") or parallel
    rows = []
    runs = [("kvstore batch (shuffled file)", "kvstore", ()),
            ("llama-server, file order", "plain", ("--keep-order",)),
            ("llama-server, article-major", "plain", ())]
    if always:
        runs.insert(1, ("kvstore batch, --restore-policy always", "kvalways", ()))
    for label, target, extra in runs:
        wd = workdir / label.split()[0].replace(",", "") / str(len(rows))
        wd.mkdir(parents=True)
        t = Target(TARGETS[target], model, parallel, ctx_size, wd)
        try:
            s = _batch(t.url, inp, wd / "out.jsonl", concurrency, *extra)
        finally:
            t.close()
        s.update({"label": label, "lines": n})
        rows.append(s)
        print(f"  batch {label:32s} evaluated {s['evaluated']:7d}  ideal {s['ideal']}  wall {s['wall_s']}s  "
              f"errors {s['errors']}", file=sys.stderr, flush=True)
    base = next(r for r in rows if r["label"] == "llama-server, file order")
    for r in rows:
        r["wall_vs_plain_same_order"] = round(r["wall_s"] / base["wall_s"], 3) if base["wall_s"] else None
    return rows


def table(rows: list[dict]) -> list[str]:
    out = ["\n| batch (articles x questions, shuffled) | lines | in flight | prompt tokens evaluated | ideal | x ideal "
           "| wall | wall x plain same order | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['label']} | {r['lines']} | {r['concurrency']} | {r['evaluated']} | {r['ideal']} | "
                   f"{r['x_ideal']} | {r['wall_s']} s | {r['wall_vs_plain_same_order']} | {r['errors']} |")
    return out
