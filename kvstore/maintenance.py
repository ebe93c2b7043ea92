"""The store-maintenance commands of `kvstore` (stats, ls, rm, gc, pin, unpin, verify, reindex, ingest,
materialize, info, sync): each `cmd_*(args)` gets the arguments `kvstore.cli` parsed and returns the exit status. A store is named by
`--store DIR|s3://BUCKET/PREFIX` with `--cache`, `--cache-size` (`kvstore.config.locate`).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from kvstore import config
from kvstore.cliutil import PROG, CliError, emit, mib, pairs, parse_kv, ratio, table, valid_server_filename, when
from kvstore.errors import KvStoreError, NameNotFound, error_message
from kvstore.progress import progress


def _location(args) -> config.Location:
    return config.locate(args.store, cache=args.cache, cache_size=args.cache_size)


def _store(args):
    return _location(args).open()


def cmd_stats(args) -> int:
    store = _store(args)
    if args.html:  # the store part of the status page, for a store no server is running on
        from kvstore.page import render_page, store_snapshot

        page = render_page({"store": store_snapshot(store, args.namespace)}, live=False)
        Path(args.html).expanduser().write_text(page, encoding="utf-8")
        print(f"{PROG}: wrote {args.html}", file=sys.stderr)
        return 0
    s = store.stats()
    emit(args, s, lambda: pairs([
        ("store", str(_location(args))),
        ("names", s.get("names")),
        ("manifests", s.get("manifests")),
        ("objects", s.get("objects")),
        ("logical size", mib(s.get("logical_bytes"))),
        ("unique raw size", mib(s.get("unique_raw_bytes"))),
        ("stored size", mib(s.get("stored_bytes"))),
        ("dedup ratio", ratio(s.get("dedup_ratio"))),
        ("compression ratio", ratio(s.get("compression_ratio"))),
        ("total ratio", ratio(s.get("total_ratio"))),
        ("block size", f"{s.get('block_size')} tokens"),
    ]))
    return 0


def cmd_ls(args) -> int:
    store = _store(args)
    items = store.list(namespace=args.namespace)
    items = sorted(items, key=lambda e: (e.get("namespace", ""), e.get("name", "")))
    # What each name alone holds (what evicting it would free): the bounded store's view of it.
    alone = {(ns, name): n for ns, name, n in store.owned_bytes()}
    for e in items:
        e["owned_bytes"] = alone.get((e.get("namespace", ""), e.get("name", "")), 0)

    def text():
        if not items:
            return "(no states stored)"
        rows = [[e.get("namespace") or "-", e.get("name", ""), str(e.get("n_tokens", "")), mib(e.get("file_bytes")),
                 mib(e.get("owned_bytes")), (e.get("parent") or "-")[:12], when(e.get("last_used")),
                 "pinned" if e.get("pinned") else (when(e.get("expires")) if e.get("expires") else "-")]
                for e in items]
        return table(rows, ["NAMESPACE", "NAME", "TOKENS", "SIZE", "ALONE", "PARENT", "LAST USED", "EXPIRES"],
                     right=(2, 3, 4))

    emit(args, items, text)
    return 0


def cmd_rm(args) -> int:
    removed = _store(args).remove(args.name, namespace=args.namespace)
    if not removed:
        raise _not_found(args.name, args.namespace)
    emit(args, {"removed": args.name, "namespace": args.namespace},
         lambda: f"removed {args.name!r}; run `kvstore gc` to free its unshared objects")
    return 0


def cmd_gc(args) -> int:
    if args.max_size is not None:
        return _evict(args)
    r = _store(args).gc(grace_seconds=args.grace, dry_run=args.dry_run)
    verb = "would free" if r.get("dry_run") else "freed"
    emit(args, r, lambda: pairs([
        ("live objects", r.get("live_objects")),
        ("dead objects", r.get("dead_objects")),
        (verb, mib(r.get("freed_bytes"))),
        ("kept (younger than grace)", r.get("kept_young")),
        ("temp files removed", r.get("removed_temp")),
        ("dry run", "yes (nothing deleted)" if r.get("dry_run") else "no"),
    ]))
    return 0


def _max_size(args):
    """`--max-size SIZE` in bytes (None when not given); a bad SIZE is a CliError naming the flag."""
    try:
        return config.parse_size(getattr(args, "max_size", None), "--max-size")
    except config.LocationError as e:
        raise CliError(str(e)) from None


def _not_found(name: str, namespace: str) -> NameNotFound:
    return NameNotFound(f"no state named {name!r}" + (f" in namespace {namespace!r}" if namespace else "")
                        + "; see `kvstore ls`")


def _evict(args) -> int:
    """`kvstore gc --max-size SIZE`: evict to the size (planned; a dry run lists the victims), then sweep."""
    cap = _max_size(args)
    if not 0 < args.low_water <= 1:
        raise CliError(f"--low-water {args.low_water}: must be in (0, 1]")
    r = _store(args).evict(max_bytes=cap, low_water=args.low_water, dry_run=args.dry_run)
    plan = r["plan"]

    def text():
        victims = plan.get("victims") or []
        rows = [[v.get("namespace") or "-", v.get("name", ""), v.get("reason", ""), mib(v.get("frees_bytes")),
                 when(v.get("last_used"))] for v in victims]
        lines = [pairs([
            ("stored", mib(plan.get("used_bytes"))),
            ("cap", f"{mib(plan.get('max_bytes'))} (evicts down to {mib(plan.get('target_bytes'))})"),
            ("pinned", mib(plan.get("pinned_bytes"))),
            ("after", mib(plan.get("after_bytes"))),
            ("names " + ("to evict" if r.get("dry_run") else "evicted"), len(victims)),
            ("freed", "-" if r.get("dry_run") else mib(r.get("freed_bytes"))),
            ("dead, left in packs (no room below the cap)", mib(r.get("kept_packed_bytes"))),
            ("dry run", "yes (nothing deleted)" if r.get("dry_run") else "no"),
        ])]
        if plan.get("unmet"):
            lines.append("the cap cannot be met: what is left is pinned")
        if rows:
            lines.append(table(rows, ["NAMESPACE", "NAME", "REASON", "FREES", "LAST USED"], right=(3,)))
        return "\n".join(lines)

    emit(args, r, text)
    return 0


def _retention(args, pinned: bool) -> int:
    store = _store(args)
    info = store.get(args.name, namespace=args.namespace)
    if info is None:
        raise _not_found(args.name, args.namespace)
    cap = _max_size(args) if pinned else None
    store.set_retention(args.name, namespace=args.namespace, ttl_seconds=info.get("ttl_s"), pinned=pinned,
                        max_bytes=cap)
    emit(args, {"name": args.name, "namespace": args.namespace, "pinned": pinned},
         lambda: f"{'pinned' if pinned else 'unpinned'} {args.name!r}")
    return 0


def cmd_pin(args) -> int:
    return _retention(args, True)


def cmd_unpin(args) -> int:
    return _retention(args, False)


def _name_ref(ref: Any) -> str:
    if isinstance(ref, dict):
        return (f"{ref.get('namespace')}/" if ref.get("namespace") else "") + str(ref.get("name"))
    return str(ref)


def cmd_verify(args) -> int:
    store = _store(args)
    if args.where != "both" and not getattr(store, "remote", None):
        raise CliError(f"--where {args.where}: only an S3 store has a bucket and a cache (this store is local)")
    kw = {"where": args.where} if getattr(store, "remote", None) else {}
    r = store.verify(progress=progress("verify"), **kw)
    corrupt, missing = list(r.get("corrupt") or []), list(r.get("missing") or [])
    bad = bool(corrupt or missing)

    def text():
        lines = [f"checked {r.get('objects_checked')} objects: "
                 + ("ok" if not bad else f"{len(corrupt)} corrupt, {len(missing)} missing")]
        lines += [f"  corrupt  {o}" for o in corrupt] + [f"  missing  {o}" for o in missing]
        if r.get("unscoped"):  # no known manifest references them: a save not committed yet, or gc's
            lines.append(f"  {r['unscoped']} object(s) of no known namespace left unchecked (no name references them)")
        affected = r.get("names_affected") or []
        if affected:
            lines.append("names affected: " + ", ".join(_name_ref(a) for a in affected))
        return "\n".join(lines)

    emit(args, r, text)
    return 1 if bad else 0


def cmd_reindex(args) -> int:
    loc = _location(args)
    if not loc.remote:
        raise CliError("reindex rebuilds an S3 store's local cache from its bucket; a local store is its own index "
                       "(see `kvstore verify`)")
    r = loc.open().reindex()
    emit(args, r, lambda: pairs([("store", loc.target), ("cache", loc.cache)]
                                + [(k.replace("_", " "), v) for k, v in sorted(r.items())]))
    return 0


def _model_fingerprint(args) -> dict[str, str]:
    """`--model GGUF` (its hash, window and layer count) under the explicit `--fingerprint KEY=VALUE` pairs."""
    fp: dict[str, str] = {}
    if getattr(args, "model", None):
        from kvstore.fingerprint import model_fingerprint

        if not os.path.isfile(args.model):
            raise CliError(f"--model {args.model}: no such file (pass the GGUF the server that saved it ran)")
        fp = model_fingerprint(args.model)
    fp.update(parse_kv(getattr(args, "fingerprint", None), "--fingerprint") or {})
    return fp


def cmd_ingest(args) -> int:
    fp = _model_fingerprint(args)
    r = _store(args).ingest(args.name, args.file, namespace=args.namespace, fingerprint=fp, parent=args.parent,
                            remove_file=args.remove, force=args.force)
    emit(args, r, lambda: (
        f"stored {args.name!r}: {r.get('n_tokens')} tokens, {mib(r.get('file_bytes'))} file, "
        f"{r.get('new_objects')} new objects ({mib(r.get('new_stored_bytes'))} stored, "
        f"{mib(r.get('reused_bytes'))} reused) in {r.get('elapsed_s', 0):.2f} s"))
    return 0


def cmd_materialize(args) -> int:
    r = _store(args).materialize(args.name, args.out, namespace=args.namespace, n_stream=args.n_stream,
                                 durable=True)
    emit(args, r, lambda: (f"wrote {args.out}: {r.get('n_tokens')} tokens, {mib(r.get('file_bytes'))} "
                           f"in {r.get('elapsed_s', 0):.2f} s"))
    return 0


def cmd_info(args) -> int:
    from kvstore.api import inspect_state

    r = inspect_state(args.file)
    toks = r.get("tokens") or []

    def text():
        shown = " ".join(str(t) for t in toks[:16]) + (" ..." if len(toks) > 16 else "")
        return pairs([
            ("file", args.file),
            ("size", mib(r.get("file_bytes"))),
            ("tokens", r.get("n_tokens")),
            ("layout", r.get("layout")),
            ("streams", r.get("n_stream")),
            ("checkpoints", r.get("n_checkpoints")),
            ("blocks", r.get("blocks") if not isinstance(r.get("blocks"), list) else len(r["blocks"])),
            ("first tokens", shown or "-"),
        ])

    emit(args, r, text)
    return 0


def _same_content(entry: dict, path: Path) -> bool:
    """Is the file byte-identical to the stored state `entry` (from Store.get)?"""
    from kvstore.api import hash_file

    if int(entry["file_bytes"]) != path.stat().st_size:
        return False
    return entry["file_hash"] == hash_file(str(path))


def cmd_sync(args) -> int:
    from kvstore.api import validate_name
    from kvstore.llama_client import LlamaServer

    d = Path(args.dir)
    if not d.is_dir():
        raise CliError(f"{d} is not a directory (pass llama-server's --slot-save-path)")
    st = _store(args)
    ns = args.namespace
    fp, n_stream = (_model_fingerprint(args) or None), args.n_stream
    if args.server and fp:
        raise CliError("give --server or --model, not both (each names what the states are bound to)")
    if args.server:
        srv = LlamaServer(args.server)
        fp = srv.fingerprint()
        n_stream = n_stream or srv.n_slots()
    files = sorted(p for p in d.glob("*.bin") if p.is_file() and not p.name.startswith("."))
    results: list[dict] = []
    errors = 0
    tick = progress("sync")
    for i, f in enumerate(files):
        entry: dict[str, Any] = {"file": f.name, "name": f.stem}
        try:
            validate_name(f.stem)
            cur = st.get(f.stem, namespace=ns)
            if cur is not None and _same_content(cur, f):
                entry["action"] = "unchanged"
                if args.remove:
                    f.unlink()
            else:
                r = st.ingest(f.stem, str(f), namespace=ns, fingerprint=fp, remove_file=args.remove,
                              force=args.force)
                entry.update(action="ingested", n_tokens=r.get("n_tokens"), file_bytes=r.get("file_bytes"),
                             new_stored_bytes=r.get("new_stored_bytes"))
            entry["removed"] = bool(args.remove)
        except (KvStoreError, OSError) as e:
            errors += 1
            entry.update(action="error", error=error_message(e))
        results.append(entry)
        if tick:
            tick(i + 1, len(files))
    for name in args.materialize or []:
        entry = {"file": f"{name}.bin", "name": name}
        try:
            if not valid_server_filename(f"{name}.bin"):
                raise CliError(f"{name!r} cannot be a llama-server file name ({name}.bin); restore it with "
                               "`kvstore materialize` under another file name")
            r = st.materialize(name, str(d / f"{name}.bin"), namespace=ns, n_stream=n_stream, expect=fp,
                               durable=True)
            entry.update(action="materialized", n_tokens=r.get("n_tokens"), file_bytes=r.get("file_bytes"))
        except (KvStoreError, OSError, CliError) as e:
            errors += 1
            entry.update(action="error", error=error_message(e))
        results.append(entry)

    def text():
        if not results:
            return f"{d}: no *.bin files"
        rows = [[e["file"], e["name"], e["action"] + (" (removed)" if e.get("removed") and e["action"] != "error"
                                                      else ""),
                 str(e.get("n_tokens", "")), mib(e.get("file_bytes")) if "file_bytes" in e else "",
                 e.get("error", "")] for e in results]
        return table(rows, ["FILE", "NAME", "ACTION", "TOKENS", "SIZE", "ERROR"], right=(3, 4))

    emit(args, {"dir": str(d), "files": results, "errors": errors}, text)
    if errors:
        for e in results:
            if e["action"] == "error":
                print(f"{PROG}: error: {e['file']}: {e['error']}", file=sys.stderr)
        return 2
    return 0
