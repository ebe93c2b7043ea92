"""`kvstore`: the command line.

    kvstore [--store DIR|s3://BUCKET/PREFIX] [--cache DIR] [--cache-size BYTES] [--json] COMMAND ...

Exit status: 0 ok, 1 a problem was found (`verify`), 2 an error (one line on stderr: `kvstore: error: ...`).
`--json` prints one JSON document on stdout; progress goes to stderr only when it is a terminal.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from kvstore import config
from kvstore.errors import KvStoreError, NameNotFound, error_message
from kvstore.progress import progress

PROG = "kvstore"
MIB = float(1 << 20)


class CliError(Exception):
    """An error found by the CLI itself (bad argument value): printed as one line, exit 2."""


# ---------------------------------------------------------------------------------------------------------------
# formatting

def mib(n: Optional[float]) -> str:
    if n is None:
        return "-"
    return f"{n / MIB:.2f} MiB"


def ratio(x: Optional[float]) -> str:
    if x is None:
        return "-"
    try:
        return f"{float(x):.2f}"
    except (TypeError, ValueError):
        return str(x)


def when(t: Optional[float]) -> str:
    if not t:
        return "-"
    return datetime.datetime.fromtimestamp(float(t)).strftime("%Y-%m-%d %H:%M:%S")


def table(rows: list[list[str]], header: list[str], right: Sequence[int] = ()) -> str:
    cols = [header] + rows
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]

    def fmt(r):
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    return "\n".join([fmt(header)] + [fmt(r) for r in rows])


def pairs(items: list[tuple[str, Any]]) -> str:
    w = max(len(k) for k, _ in items)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in items)


def emit(args, doc: Any, text: Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print(text())


def parse_kv(items: Optional[list[str]], what: str) -> Optional[dict[str, str]]:
    if not items:
        return None
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what} {item!r}: expected key=value")
        out[key] = value
    return out


def valid_server_filename(filename: str) -> bool:
    """llama-server's `fs_validate_filename` (no subdirectories), so that `action=restore` accepts the file."""
    if not filename or len(filename.encode("utf-8", "surrogatepass")) > 255:
        return False
    for ch in filename:
        c = ord(ch)
        if (c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or c in (0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF)
                or 0xD800 <= c <= 0xDFFF or ch in ':*?"<>|/\\'):
            return False
    if filename[0] == " " or filename[-1] in " .":
        return False
    return ".." not in filename and filename != "."


# ---------------------------------------------------------------------------------------------------------------
# commands

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
    items = _store(args).list(namespace=args.namespace)
    items = sorted(items, key=lambda e: (e.get("namespace", ""), e.get("name", "")))

    def text():
        if not items:
            return "(no states stored)"
        rows = [[e.get("namespace") or "-", e.get("name", ""), str(e.get("n_tokens", "")), mib(e.get("file_bytes")),
                 (e.get("parent") or "-")[:12], when(e.get("last_used"))] for e in items]
        return table(rows, ["NAMESPACE", "NAME", "TOKENS", "SIZE", "PARENT", "LAST USED"], right=(2, 3))

    emit(args, items, text)
    return 0


def cmd_rm(args) -> int:
    removed = _store(args).remove(args.name, namespace=args.namespace)
    if not removed:
        raise NameNotFound(f"no state named {args.name!r}" + (f" in namespace {args.namespace!r}" if args.namespace
                                                                else "") + "; see `kvstore ls`")
    emit(args, {"removed": args.name, "namespace": args.namespace},
         lambda: f"removed {args.name!r}; run `kvstore gc` to free its unshared objects")
    return 0


def cmd_gc(args) -> int:
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


def cmd_ingest(args) -> int:
    fp = parse_kv(args.fingerprint, "--fingerprint")
    r = _store(args).ingest(args.name, args.file, namespace=args.namespace, fingerprint=fp, parent=args.parent,
                            remove_file=args.remove)
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


def _server_and_store(args):
    """The server, and the store to use with it: none for a `kvstore serve` (it uses its own)."""
    from kvstore.server import LlamaServer

    srv = LlamaServer(args.server)
    return srv, (None if srv.is_kvstore() else _store(args))


def cmd_save(args) -> int:
    from kvstore.api import save

    srv, store = _server_and_store(args)
    r = save(args.name, args.slot, server=srv, store=store, namespace=args.namespace)
    emit(args, r, lambda: f"saved slot {args.slot} as {args.name!r}: {r.get('n_tokens', r.get('n_saved'))} tokens"
                          + (f", {mib(r.get('new_stored_bytes'))} new" if "new_stored_bytes" in r else ""))
    return 0


def cmd_restore(args) -> int:
    from kvstore.api import restore

    srv, store = _server_and_store(args)
    r = restore(args.name, args.slot, server=srv, store=store, namespace=args.namespace)
    emit(args, r, lambda: f"restored {args.name!r} into slot {args.slot}: "
                          f"{r.get('n_tokens', r.get('n_restored'))} tokens")
    return 0


def _same_content(entry: dict, path: Path) -> bool:
    """Is the file byte-identical to the stored state `entry` (from Store.get)?"""
    from kvstore.api import hash_file

    if int(entry["file_bytes"]) != path.stat().st_size:
        return False
    return entry["file_hash"] == hash_file(str(path))


def cmd_sync(args) -> int:
    from kvstore.api import validate_name
    from kvstore.server import LlamaServer

    d = Path(args.dir)
    if not d.is_dir():
        raise CliError(f"{d} is not a directory (pass llama-server's --slot-save-path)")
    st = _store(args)
    ns = args.namespace
    fp, n_stream = None, args.n_stream
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
                r = st.ingest(f.stem, str(f), namespace=ns, fingerprint=fp, remove_file=args.remove)
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


def cmd_serve(args) -> int:
    from kvstore.hooks.serve import run  # lazily: aiohttp and xllamacpp are only needed here

    return run(args)


def add_serve_args(sp) -> None:
    from kvstore.engine import add_engine_args

    sp.add_argument("--upstream", metavar="URL",
                    help="an external llama-server (started with --slot-save-path <store>/sync); "
                         "default: start an embedded one")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    sp.add_argument("--name-from-user", action="store_true", help="use the OpenAI `user` field as the state name")
    sp.add_argument("--idle-save", type=float, default=30.0, metavar="SECONDS",
                    help="save a dirty slot after this long idle (0: only on eviction and shutdown)")
    sp.add_argument("--max-queue", type=int, default=64, metavar="N", help="requests that may wait for a slot")
    sp.add_argument("--upstream-timeout", type=float, default=600.0, metavar="SECONDS",
                    help="504 when llama-server sends no reply byte this long (a non-streamed reply's first byte "
                         "comes when it is complete; default 600)")
    sp.add_argument("--upstream-idle-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="cut a reply when llama-server sends no chunk this long (default 120)")
    t = sp.add_argument_group("tenants (docs/hooks.md; without keys the server is single-tenant)")
    t.add_argument("--api-key", action="append", metavar="KEY",
                   help="a key clients must send (Authorization: Bearer KEY); its namespace is key-<hash> (repeatable)")
    t.add_argument("--api-key-file", action="append", metavar="FILE",
                   help="keys, one per line: KEY [NAMESPACE|-] [admin,namespace-header] (repeatable)")
    t.add_argument("--admin-api-key", action="append", metavar="KEY",
                   help="a key that sees every namespace in stats and lists and may use any slot (repeatable)")
    t.add_argument("--allow-namespace-header", action="store_true",
                   help="let every key choose its namespace with X-KV-Namespace (a trusted front proxy)")
    t.add_argument("--upstream-api-key", metavar="KEY",
                   help="the external llama-server's own --api-key (the embedded one gets a random key)")
    add_engine_args(sp.add_argument_group("embedded llama-server (ignored with --upstream)"))
    sp.add_argument("-v", "--verbose", action="store_true")


# ---------------------------------------------------------------------------------------------------------------
# parser

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", metavar="DIR|s3://BUCKET/PREFIX", default=argparse.SUPPRESS,
                        help="store directory or S3 bucket (endpoint and credentials: AWS_ENDPOINT_URL, "
                             "AWS_ACCESS_KEY_ID, ...) (default: $KVSTORE_DIR, else ~/.local/share/kvstore)")
    common.add_argument("--cache", metavar="DIR", default=argparse.SUPPRESS,
                        help="an S3 store's local cache: its index and the objects it has seen "
                             "(default: $XDG_CACHE_HOME or ~/.cache, then kvstore/<hash of endpoint and URL>)")
    common.add_argument("--cache-size", metavar="BYTES", default=argparse.SUPPRESS,
                        help="bound an S3 store's cache (least recently used objects go first; suffixes K, M, G, T: "
                             "powers of 1024, e.g. 10G; default: unbounded)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print one JSON document instead of text")
    p = argparse.ArgumentParser(prog=PROG, parents=[common],
                                description="Named, persistent, deduplicated KV-cache states for llama-server.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name, help_, fn):
        sp = sub.add_parser(name, help=help_, parents=[common], description=help_)
        sp.set_defaults(func=fn)
        return sp

    def ns(sp):
        sp.add_argument("--namespace", default="", help="namespace (tenant); default: the empty namespace")

    sp = add("serve", "run the kvstore proxy in front of llama-server (see `kvstore serve --help`)", cmd_serve)
    add_serve_args(sp)
    sp = add("stats", "sizes and dedup/compression ratios", cmd_stats)
    sp.add_argument("--html", metavar="FILE", help="write the store part of the status page (one self-contained "
                    "HTML file: names, sizes, ratios, lineage) to FILE")
    sp.add_argument("--namespace", default=None, help="with --html: only this namespace (default: all)")
    sp = add("ls", "list stored states", cmd_ls)
    sp.add_argument("--namespace", default=None, help="only this namespace (default: all)")
    sp = add("rm", "remove a name (its objects go at the next gc)", cmd_rm)
    sp.add_argument("name")
    ns(sp)
    sp = add("gc", "delete objects no name refers to", cmd_gc)
    sp.add_argument("--dry-run", action="store_true", help="only report what would be deleted")
    sp.add_argument("--grace", type=float, default=3600.0, metavar="SECONDS",
                    help="keep unreferenced objects younger than this (default 3600)")
    sp = add("verify", "re-hash every object; exit 1 if any is corrupt or missing", cmd_verify)
    sp.add_argument("--where", choices=("bucket", "cache", "both"), default="both",
                    help="an S3 store: check the objects in the bucket, in the local cache, or both (default)")
    add("reindex", "an S3 store: rebuild the local cache's index from the bucket", cmd_reindex)
    sp = add("ingest", "store a llama-server slot file under a name", cmd_ingest)
    sp.add_argument("file")
    sp.add_argument("--name", required=True)
    ns(sp)
    sp.add_argument("--parent", help="name of the state this one extends (recorded in the manifest)")
    sp.add_argument("--fingerprint", nargs="+", action="extend", metavar="KEY=VALUE",
                    help="what the state is bound to (e.g. model=...); checked at restore")
    sp.add_argument("--remove", action="store_true", help="delete FILE once it is stored")
    sp = add("materialize", "write a stored state as a llama-server slot file", cmd_materialize)
    sp.add_argument("name")
    sp.add_argument("out")
    ns(sp)
    sp.add_argument("--n-stream", type=int, metavar="K",
                    help="re-emit for a server with K slots (--parallel K; 1 with --kv-unified)")
    sp = add("info", "inspect a slot file", cmd_info)
    sp.add_argument("file")
    for name, help_, fn in (("save", "save a llama-server slot into the store", cmd_save),
                            ("restore", "restore a stored state into a llama-server slot", cmd_restore)):
        sp = add(name, help_, fn)
        sp.add_argument("name")
        sp.add_argument("--slot", type=int, required=True)
        sp.add_argument("--server", metavar="URL", help="llama-server or kvstore serve URL "
                                                       "(default: $KVSTORE_SERVER, else http://127.0.0.1:8080)")
        ns(sp)
    sp = add("sync", "ingest the *.bin files llama-server wrote into its --slot-save-path DIR", cmd_sync)
    sp.add_argument("dir")
    ns(sp)
    sp.add_argument("--remove", action="store_true", help="delete files once they are stored")
    sp.add_argument("--materialize", nargs="+", action="extend", metavar="NAME",
                    help="also write these stored states into DIR as NAME.bin (for action=restore)")
    sp.add_argument("--server", metavar="URL", help="bind ingested states to this server's fingerprint "
                                                   "(and check materialized ones against it)")
    sp.add_argument("--n-stream", type=int, metavar="K", help="slot count of the server that will restore "
                                                             "(default: the --server's, else as saved)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.store = getattr(args, "store", None)
    args.cache = getattr(args, "cache", None)
    args.cache_size = getattr(args, "cache_size", None)
    args.json = getattr(args, "json", False)
    try:
        return args.func(args)
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (KvStoreError, CliError, OSError, ValueError, ImportError) as e:
        print(f"{PROG}: error: {error_message(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
