"""`python -m bench [smoke|quick|full] [--models ..] [--workloads ..] [--targets ..]`

Starts every target fresh in the same run, sends each the same seeded requests, prints a table and writes
JSON to bench/results/<preset>.json. Token counts are the stable figures; times are only compared as ratios
between targets of the same run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path

from kvstore.models import model_path

from . import balancer, batch, handoff, slotwait, storage, workloads
from .targets import TARGETS, Target, cleanup, workdir

PRESETS = {
    "smoke": {
        "models": ["smollm2"], "targets": ["plain", "kvstore"],
        "workloads": ["W1", "W1chat", "W2", "storage", "slotwait"],
        "parallel": 2, "ctx_size": 4096,
        "w1": {"seed": 1, "users": 3, "turns": 2, "system_words": 40, "msg_words": 25, "n_predict": 8, "inflight": 2},
        "w2": {"seed": 2, "articles": 2, "questions": 2, "article_words": [150, 200], "n_predict": 4},
        "storage": {"article_words": 200, "children": 3},
        "batch": {"seed": 4, "articles": 3, "questions": 3, "article_words": [150, 200], "n_predict": 4},
    },
    "quick": {
        "models": ["smollm2", "gemma3"], "targets": ["plain", "ram", "ram512", "kvstore", "kvcap"],
        "workloads": ["W1", "W1x1", "W1chat", "W2", "W3", "storage", "slotwait"], "parallel": 2, "ctx_size": 8192,
        "w1": {"seed": 1, "users": 6, "turns": 4, "system_words": 60, "msg_words": 40, "n_predict": 16, "inflight": 2},
        "w2": {"seed": 2, "articles": 3, "questions": 3, "article_words": [300, 500], "n_predict": 8},
        # The polite client, then as users send it: the state named after the article, slots and 2 x slots in flight.
        "w2_variants": [("question", 1), ("article", 1), ("article", 2), ("question", 4), ("article", 4)],
        "storage": {"article_words": 400, "children": 10, "long_words": 2000},
        "batch": {"seed": 4, "articles": 20, "questions": 5, "article_words": [300, 500], "n_predict": 8},
    },
    "full": {
        "models": ["smollm2", "gemma3"], "targets": ["plain", "ram", "ram512", "kvstore", "kvcap"],
        "workloads": ["W1", "W1chat", "W2", "W3", "W1long", "storage"], "parallel": 2, "ctx_size": 8192,
        "w1": {"seed": 1, "users": 10, "turns": 5, "system_words": 100, "msg_words": 50, "n_predict": 24,
               "inflight": 3},
        "w2": {"seed": 2, "articles": 4, "questions": 4, "article_words": [300, 600], "n_predict": 8},
        "w2_variants": [("question", 1), ("article", 1), ("question", 2), ("article", 2), ("question", 4),
                        ("article", 4)],
        # Returning users with ~2,000 tokens of their own history: time to first token vs re-evaluation.
        "w1long": {"seed": 3, "users": 4, "turns": 3, "system_words": 20, "first_words": 1400, "msg_words": 30,
                   "n_predict": 16, "inflight": 2},
        "storage": {"article_words": 600, "children": 10, "long_words": 2000},
        # The seed's job: 100 articles x 10 questions, shuffled, through `kvstore batch` (bench/batch.py).
        "batch": {"seed": 4, "articles": 100, "questions": 10, "article_words": [300, 500], "n_predict": 8},
    },
}
# Only the seed's batch job (bench/batch.py), at the full preset's size.
PRESETS["batch"] = {**PRESETS["full"], "workloads": ["batch"]}
# Several servers on one S3 store (a SeaweedFS the run starts): W1 and W3 with each user's turns alternating
# between two `kvstore serve`, next to one server with a local store and plain llama-server; the handoff figures.
# Sized to finish in minutes on a shared 2-core machine.
PRESETS["s3"] = {**PRESETS["quick"], "models": ["smollm2"], "targets": ["plain", "kvstore", "s3x2"],
                 "workloads": ["W1", "W3", "handoff", "s3core"],
                 "w1": {"seed": 1, "users": 5, "turns": 4, "system_words": 40, "msg_words": 30, "n_predict": 12,
                        "inflight": 2},
                 "handoff": {"history_words": 700}}
# Two servers behind a real HAProxy (kvstore balancer-config): round-robin vs by name, next to one server, all on
# one S3 store; its own table (bench/balancer.py): restores from the bucket, times as ratios to the one server.
PRESETS["balancer"] = {**PRESETS["quick"], "models": ["smollm2"], "targets": ["s3x1", "lb-rr", "lb-name"],
                       "workloads": ["W1"], "ctx_size": 4096,
                       "w1": {"seed": 1, "users": 10, "turns": 4, "system_words": 40, "msg_words": 25,
                              "n_predict": 8, "inflight": 3}}
MULTI_SERVER_WORKLOADS = ("W1", "W3", "W1long")  # W2 has no users to move between servers
# What the uncapped kvstore target stored per (model, workload row), the size a capped target's cap is a fraction of.
UNCAPPED_BYTES: dict = {}


def w2_label(order: str, parents: bool, naming: str, inflight: int) -> str:
    """W2's row label; the polite client (a name per question, one request at a time) keeps the old label."""
    extra = "" if (naming, inflight) == ("question", 1) else f" name={naming} x{inflight}"
    return f"W2 {order}{extra}{' +parents' if parents else ''}"


def w2_variant(label: str) -> tuple:
    """Inverse of `w2_label`: ((order, naming, in flight), parents)."""
    words = label.split()
    naming = next((w[5:] for w in words if w.startswith("name=")), "question")
    inflight = next((int(w[1:]) for w in words if w[:1] == "x" and w[1:].isdigit()), 1)
    return (words[1], naming, inflight), "+parents" in words


def w2_matrix(rows: list) -> list:
    """W2's variants side by side, prompt tokens evaluated / ideal: a row per (order, naming, requests in flight),
    a column per target (and +parents), every cell from this run (the README's W2 table)."""
    w2 = [r for r in rows if r["workload"].startswith("W2 ")]
    cells, columns = {}, []
    for r in w2:
        key, parents = w2_variant(r["workload"])
        column = r["target"] + (" +parents" if parents else "")
        if column not in columns:
            columns.append(column)
        cells[key, column] = r["ratio_to_ideal"]
    keys = sorted({k for k, _ in cells}, key=lambda k: (k[2], k[1] != "question", k[0] != "article-major"))
    if len(keys) < 2:
        return []
    ideals = sorted({r["ideal"] for r in w2})
    lines = [f"\nW2, prompt tokens evaluated / ideal, every row of the same run (`ideal` "
             f"{' / '.join(map(str, ideals))} tokens):\n",
             "| W2 row (order, what the state is named after, requests in flight) | " + " | ".join(columns) + " |",
             "|---|" + "---|" * len(columns)]
    for order, naming, inflight in keys:
        got = [cells.get(((order, naming, inflight), c)) for c in columns]
        lines.append(f"| {order}, name = {naming}, {inflight} in flight | "
                     + " | ".join("-" if v is None else f"{v:.3f}" for v in got) + " |")
    return lines


def run_workload(name: str, spec, model: str, cfg: dict) -> list:
    """One fresh target per workload variant, so no run inherits another's cache."""
    rows = []
    variants = {
        "W1": [("W1", lambda t: workloads.run_w1(t, cfg["w1"]))],
        # The same users sent one request at a time: the restore path's own cost, without llama-server's waits for
        # the other slots' decode steps (bench/slotwait.py) that requests in flight add.
        "W1x1": [("W1 one at a time", lambda t: workloads.run_w1(t, {**cfg["w1"], "inflight": 1}))],
        "W3": [("W3 restart", lambda t: workloads.run_w1(t, cfg["w1"], restart_at=max(1, cfg["w1"]["turns"] // 2)))],
        "W1long": [("W1 long history", lambda t: workloads.run_w1(t, cfg["w1long"]))],
        # W1 as chat clients send it: the conversation's messages, the model's chat template, the reply as text.
        "W1chat": [(f"W1 {label}", (lambda api=api: lambda t: workloads.run_w1(t, cfg["w1"], api=api))())
                   for api, label in (("chat", "chat completions"), ("messages", "Messages API"))],
        "W2": [(w2_label(o, par, nm, k), (lambda o=o, par=par, nm=nm, k=k:
                                           lambda t: workloads.run_w2(t, cfg["w2"], o, par, nm, k))())
               for nm, k in cfg.get("w2_variants", [("question", 1)])
               for o in ("article-major", "question-major")
               for par in ((False, True) if spec.kind == "kvstore" else (False,))],
    }[name]
    if spec.servers > 1 and not spec.balance and name not in MULTI_SERVER_WORKLOADS:
        return rows
    for label, fn in variants:
        max_size = None
        if spec.cap_of_uncapped:
            uncapped = UNCAPPED_BYTES.get((model, label))
            if not uncapped:
                print(f"  {label}: {spec.name} skipped: the uncapped kvstore target did not run first",
                      file=sys.stderr, flush=True)
                continue
            max_size = int(spec.cap_of_uncapped * uncapped)
        wd = workdir()
        target = Target(spec, model, cfg["parallel"], cfg["ctx_size"], wd, max_size=max_size)
        try:
            res = fn(target)
            res["rss_bytes"] = target.rss_bytes()
            if spec.kind == "kvstore":
                res["store_bytes"] = target.store_bytes()
                m = target.metrics()
                res["saved_file_bytes"] = int(m.get("kvstore_bytes_saved_total", 0))
                # What the cap counts (the objects' stored bytes), and what it evicted.
                res["stored_bytes"] = int(m.get("kvstore_store_bytes", 0))
                res["evicted_cap"] = int(m.get('kvstore_evictions_total{reason="cap"}', 0))
                if max_size is not None:
                    res["max_size"] = max_size
                elif spec.servers == 1 and not spec.bucket and not spec.serve_args:
                    UNCAPPED_BYTES[(model, label)] = res["stored_bytes"]
        finally:
            target.close()
            cleanup(wd)
        res.update({"workload": label, "target": spec.name})
        rows.append(res)
        print(f"  {label:34s} {spec.name:30s} prompt_n {res['prompt_n']:6d}  ideal {res['ideal']:6d}  "
              f"ratio {res['ratio_to_ideal']}  wall {res['wall_s']}s", file=sys.stderr, flush=True)
    return rows


def s3core(model: str, wd: Path) -> dict:
    """The restore path's speed against a bucket (bench/remote_core.py) for one real slot file, in this run's
    SeaweedFS: local and bucket restores (cold and warm cache) next to a page-cache copy of the file and one GET of
    as many bytes as the state stores."""
    import uuid

    from . import remote_core
    from .targets import BUCKET, bucket_env, seaweed

    files = storage.make_family(model, wd / "files", 600, 1)
    aws = seaweed().env({})  # only the variables pointing at this run's SeaweedFS
    with bucket_env(aws, drop=("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE")):
        return remote_core.measure(f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}", str(files[-1]), n=9,
                                   server_pid=seaweed().proc.pid)


def add_alone_ratios(rows: list) -> None:
    """W1 with requests in flight: each target's TTFT over its tokens' evaluation alone, at the rate of its own
    one-at-a-time run in this run (`workloads.alone_ratio`)."""
    alone = {r["target"]: r for r in rows if r["workload"] == "W1 one at a time"}
    for r in rows:
        if r["workload"] == "W1" and r["target"] in alone:
            r["ttft_returning_over_alone_eval_p50"] = workloads.alone_ratio(r, alone[r["target"]])


def table(results: dict) -> str:
    lines = []
    for model, block in results["models"].items():
        lines.append(f"\n### {model}\n")
        lines.append("| workload | target | requests | prompt tokens evaluated | ideal | x ideal | cached | "
                     "TTFT p50 returning (x plain; x its own evaluation; x its tokens evaluated alone) | wall (x plain) | disk |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        rows = block.get("workloads", [])
        base = {r["workload"].split(" +")[0]: r for r in rows if r["target"] == "llama-server"}
        for r in rows:
            b = base.get(r["workload"].split(" +")[0])
            ttft = r.get("ttft_returning_p50_s")
            rel = lambda k: f" ({r[k] / b[k]:.2f}x)" if b and b.get(k) and r.get(k) is not None else ""
            own = r.get("ttft_returning_over_own_eval_p50")
            own_s = f"; {own}x eval" if own is not None else ""
            alone = r.get("ttft_returning_over_alone_eval_p50")
            own_s += f"; {alone}x alone" if alone is not None else ""
            disk = (f"{r['store_bytes'] / 2**20:.1f} MiB (one file per save: {r['saved_file_bytes'] / 2**20:.1f} MiB)"
                    if "store_bytes" in r else f"RSS {r['rss_bytes'] / 2**20:.0f} MiB")
            if r.get("max_size"):
                disk += (f"; cap {r['max_size'] / 2**20:.1f} MiB, objects {r['stored_bytes'] / 2**20:.1f} MiB, "
                         f"{r['evicted_cap']} names evicted")
            lines.append(f"| {r['workload']} | {r['target']} | {r['requests']} | {r['prompt_n']} | {r['ideal']} | "
                         f"{r['ratio_to_ideal']} | {r['cache_n']} | "
                         f"{'-' if ttft is None else f'{ttft * 1000:.0f} ms'}{rel('ttft_returning_p50_s')}{own_s} | "
                         f"{r['wall_s']} s{rel('wall_s')} | {disk} |")
        lines.extend(w2_matrix(rows))
        if block.get("slotwait"):
            lines.append(slotwait.line(block["slotwait"]))
        h = block.get("handoff")
        if h:
            lines.append(f"\nA returning user's turn on the other server ({h['prompt_tokens']} prompt tokens): time to "
                         f"first token {h['ttft_cold_s'] * 1000:.0f} ms with that server's cache cold (state from "
                         f"the bucket), {h['ttft_warm_s'] * 1000:.0f} ms warm, {h['ttft_full_eval_s'] * 1000:.0f} ms "
                         f"evaluating the prompt in full. Restore of the state ({h['state_file_bytes'] / 2**20:.1f} "
                         f"MiB, {h['bucket_bytes_read'] / 2**20:.1f} MiB read from the bucket in "
                         f"{h['objects_read']} objects): {h['restore_cold_mb_s']} MB/s of bucket bytes from a cold "
                         f"cache vs {h['get_mb_s']} MB/s for one plain GET of as many bytes; from a warm cache "
                         f"{h['restore_warm_file_mb_s']} MB/s of state file.")
        if block.get("batch"):
            lines.extend(batch.table(block["batch"]))
        rc = block.get("s3core")
        if rc:
            r = rc["mb_per_s"]
            lines.append(f"\nRestore path, one real slot file of {rc['file_mb']} MB ({rc['objects']} objects, "
                         f"{rc['stored_mb']} MB stored), MB/s of file bytes: local {r['local_restore']} vs page-cache "
                         f"copy {r['copy']} (**{rc['local_restore_vs_copy']}x**); bucket cold cache "
                         f"{r['bucket_cold_restore']} vs one GET of the stored bytes {r['one_get_of_stored_bytes']} "
                         f"(**{rc['cold_restore_vs_one_get']}x**; "
                         f"{rc.get('cold_restore_vs_one_get_to_file', '-')}x of one GET written to a file; "
                         f"{rc.get('cold_restore_vs_one_get_of_file_bytes', '-')}x of one GET of as many bytes as "
                         f"the file; "
                         f"with the cache fill it leaves behind "
                         f"{rc['s']['cache_fill_behind'] * 1e3:.0f} ms, {rc['cold_restore_and_fill_vs_one_get']}x); "
                         f"bucket warm cache {r['bucket_warm_restore']} "
                         f"(**{rc['warm_restore_vs_local']}x** local). What the bucket adds to a restore (cold minus "
                         f"warm): {(rc['s']['cold_restore'] - rc['s']['warm_restore']) * 1e3:.0f} ms, one GET of the "
                         f"stored bytes {rc['s']['one_get'] * 1e3:.0f} ms.")
            ap = rc.get("server_apart")
            if ap:
                lines.append(f"With SeaweedFS on a core of its own and the restore on another (as a bucket on another "
                             f"machine would leave this one's cores): a cold restore written as its objects arrive "
                             f"{ap['streamed'] * 1e3:.0f} ms (**{ap['streamed_vs_one_get']}x** one GET of the stored "
                             f"bytes, {ap['one_get'] * 1e3:.0f} ms), once all arrived {ap['not_streamed'] * 1e3:.0f} ms "
                             f"({ap['not_streamed_vs_one_get']}x); `KVSTORE_S3_STREAM=auto` streams unless the "
                             f"endpoint is loopback.")
            req = rc.get("bucket_requests")
            if req:
                per = lambda d: ", ".join(f"{n} {k}" for k, n in sorted(d.items())) or "none"  # noqa: E731
                lines.append(f"Requests to the bucket: a cold restore {per(req['cold_restore'])}; a warm one "
                             f"{per(req['warm_restore'])}.")
        st = block.get("storage")
        if st:
            mb = st["mb_per_s"]
            lines.append(f"\nStorage ({st['files']} real slot files: a parent of {st['parent_bytes'] / 2**20:.1f} MiB and "
                         f"children that add a question): raw {st['raw_bytes'] / 2**20:.1f} MiB, stored "
                         f"{st['stored_bytes'] / 2**20:.1f} MiB (**{st['raw_over_stored']}x** smaller). "
                         f"Ingest {mb['ingest']} MB/s vs copy+fsync {mb['copy_fsync']} MB/s "
                         f"(**{st['ingest_vs_copy_fsync']}x**); materialize {mb['materialize']} MB/s vs copy "
                         f"{mb['copy']} MB/s (**{st['materialize_vs_copy']}x**).")
            lg = st.get("long")
            if lg:
                lines.append(f"A long state ({lg['bytes'] / 2**20:.1f} MiB, restored {lg['repeats']} times from one "
                             f"store): materialize {lg['mb_per_s']['materialize']} MB/s ({lg['ms']['materialize']} ms) "
                             f"vs copy {lg['mb_per_s']['copy']} MB/s ({lg['ms']['copy']} ms) "
                             f"(**{lg['materialize_vs_copy']}x**).")
    return "\n".join(lines)


def main(argv=None) -> int:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the atexit hooks (the S3 targets' SeaweedFS)
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset", nargs="?", default="quick", choices=sorted(PRESETS))
    p.add_argument("--models", nargs="+")
    p.add_argument("--workloads", nargs="+")
    p.add_argument("--targets", nargs="+", choices=sorted(TARGETS))
    p.add_argument("--out", default=None, help="JSON path (default bench/results/<preset>.json)")
    args = p.parse_args(argv)
    cfg = PRESETS[args.preset]
    models = args.models or cfg["models"]
    wls = args.workloads or cfg["workloads"]
    targets = args.targets or cfg["targets"]
    results = {"preset": args.preset, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "machine": f"{platform.machine()} {platform.processor() or ''} cpus={__import__('os').cpu_count()}",
               # what ran: the preset with the command line's selections in place of its own
               "config": {**cfg, "models": models, "workloads": wls, "targets": targets}, "models": {}}
    for model in models:
        path = str(model_path(model))
        block = results["models"].setdefault(model, {"workloads": []})
        print(f"{model}:", file=sys.stderr, flush=True)
        for wl in wls:
            if wl == "handoff":
                wd = workdir()
                try:
                    block["handoff"] = handoff.run(path, wd, cfg["parallel"], cfg["ctx_size"], **cfg["handoff"])
                finally:
                    cleanup(wd)
                print(f"  handoff {block['handoff']}", file=sys.stderr, flush=True)
                continue
            if wl == "batch":
                wd = workdir()
                try:
                    block["batch"] = batch.run(path, wd, cfg["parallel"], cfg["ctx_size"], cfg["batch"],
                                               always="kvalways" in (args.targets or ()))
                finally:
                    cleanup(wd)
                continue
            if wl == "s3core":
                wd = workdir()
                try:
                    block["s3core"] = s3core(path, wd)
                finally:
                    cleanup(wd)
                print(f"  s3core {block['s3core']}", file=sys.stderr, flush=True)
                continue
            if wl == "slotwait":
                wd = workdir()
                try:
                    block["slotwait"] = slotwait.run(path, wd, cfg["ctx_size"])
                finally:
                    cleanup(wd)
                print(f"  slotwait {block['slotwait']}", file=sys.stderr, flush=True)
                continue
            if wl == "storage":
                wd = workdir()
                try:
                    block["storage"] = storage.run(path, wd, **cfg["storage"])
                finally:
                    cleanup(wd)
                print(f"  storage {block['storage']}", file=sys.stderr, flush=True)
                continue
            for t in targets:
                block["workloads"].extend(run_workload(wl, TARGETS[t], path, cfg))
        add_alone_ratios(block["workloads"])
    out = Path(args.out or Path(__file__).parent / "results" / f"{args.preset}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(balancer.table(results) if args.preset == "balancer" else table(results))
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
