"""`kvstore`: the command line.

    kvstore [--store DIR|s3://BUCKET/PREFIX] [--cache DIR] [--cache-size BYTES] [--json] COMMAND ...

Exit status: 0 ok, 1 a problem was found (`verify`), 2 an error (one line on stderr: `kvstore: error: ...`).
`--json` prints one JSON document on stdout; progress goes to stderr only when it is a terminal.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from kvstore.cliutil import PROG, CliError, emit, mib, valid_server_filename  # noqa: F401 - re-exported
from kvstore.errors import KvStoreError, error_message
from kvstore.maintenance import (_store, cmd_gc, cmd_info, cmd_ingest, cmd_ls, cmd_materialize, cmd_pin,
                                 cmd_reindex, cmd_rm, cmd_stats, cmd_sync, cmd_unpin, cmd_verify)


# ---------------------------------------------------------------------------------------------------------------
# commands that talk to a server (the store commands are in kvstore/maintenance.py)

def _server_and_store(args):
    """The server, and the store to use with it: none for a `kvstore serve` (it uses its own)."""
    from kvstore.llama_client import LlamaServer

    srv = LlamaServer(args.server, api_key=args.api_key)
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


def cmd_serve(args) -> int:
    from kvstore.hooks.serve import run  # lazily: aiohttp and xllamacpp are only needed here

    return run(args)


def cmd_batch(args) -> int:
    from kvstore.batch.command import cmd_batch as run_batch  # lazily: aiohttp and tqdm are only needed here

    return run_batch(args)


def add_serve_args(sp) -> None:
    from kvstore.engine import add_engine_args

    sp.add_argument("--upstream", metavar="URL",
                    help="an external llama-server (started with --slot-save-path <store>/sync); "
                         "default: start an embedded one")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    sp.add_argument("--name-from-user", action="store_true",
                    help="use the end user's id as the state name: OpenAI's `user`, Anthropic's `metadata.user_id`")
    sp.add_argument("--idle-save", type=float, default=30.0, metavar="SECONDS",
                    help="save a dirty slot after this long idle (0: only on eviction and shutdown)")
    sp.add_argument("--save-behind", choices=("auto", "on", "off"), default="auto",
                    help="on: a state displaced for another request is ingested behind that request, once "
                         "llama-server has written its file (one a crash left pending is ingested at the next "
                         "start); off: before it; auto: on for a local store, off for an S3 store (default auto)")
    sp.add_argument("--max-queue", type=int, default=64, metavar="N", help="requests that may wait for a slot")
    sp.add_argument("--resume-at", choices=("checkpoint", "end"), default="checkpoint",
                    help="sliding-window models (Gemma 2/3): where a returning user's restored state resumes. "
                         "checkpoint: at llama-server's own newest checkpoint, as in the slot that kept it, which "
                         "evaluates the last reply again while the conversation is shorter than the window; the "
                         "reply is token for token the kept slot's. end: at the state's end (a cut with a "
                         "checkpoint there), only the new tokens evaluated; a reply may differ where that "
                         "re-evaluation would have tipped a near tie (default checkpoint). Hybrid and recurrent "
                         "models resume at the state's end either way")
    sp.add_argument("--fork-states", choices=("on", "off"), default="on",
                    help="hybrid and recurrent models: where a named request's prompt leaves every stored state it "
                         "could continue (the next question on an article), evaluate and store the prompt up to "
                         "there first (a state named fork-<hash>), so that the next prompt leaving there continues "
                         "it instead of evaluating the shared tokens again (default on)")
    sp.add_argument("--upstream-timeout", type=float, default=600.0, metavar="SECONDS",
                    help="504 when llama-server sends no reply byte this long (a non-streamed reply's first byte "
                         "comes when it is complete; default 600)")
    sp.add_argument("--upstream-idle-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="cut a reply when llama-server sends no chunk this long (default 120)")
    sp.add_argument("--upstream-stall-timeout", type=float, default=10.0, metavar="SECONDS",
                    help="llama-server answering no /health probe this long is stalled (frozen): 504 for waiting "
                         "requests, 503 for new ones until it answers (default 10; 0: no probe)")
    sp.add_argument("--assume-prefill-tps", type=float, metavar="TOKENS_PER_S",
                    help="restore or recompute (docs/hooks.md): take llama-server's prefill rate as this instead of "
                         "measuring it, e.g. a GPU's (default: measured from replies' timings)")
    sp.add_argument("--restore-policy", choices=("cost", "always"), default="cost",
                    help="cost: restore a stored state only while that is predicted faster than evaluating its "
                         "tokens; always: restore whatever the estimates say (default cost)")
    b = sp.add_argument_group("bounded store (docs/design.md \"Bounded store\")")
    b.add_argument("--max-size", metavar="SIZE",
                   help="keep the store within SIZE (suffixes K, M, G, T: powers of 1024, e.g. 20G): once a save "
                        "passes it, names are evicted down to --low-water x SIZE, least recently used owners of "
                        "their bytes first; pinned names and names in slots never (default: unbounded)")
    b.add_argument("--low-water", type=float, default=0.9, metavar="F",
                   help="evict down to F x --max-size (default 0.9)")
    b.add_argument("--evict-period", type=float, default=5.0, metavar="SECONDS",
                   help="how often expired names go and the store's size is counted again from its backend (a "
                        "bucket's listing includes other machines' saves): on a shared bucket the cap can be passed "
                        "by what the other servers save in this time (default 5)")
    b.add_argument("--default-ttl", type=float, metavar="SECONDS",
                   help="a name expires this long after its last use unless its request set cache_prompt_ttl "
                        "(or X-KV-TTL) or pinned it (default: never)")
    t = sp.add_argument_group("tenants (docs/hooks.md; without keys the server is single-tenant)")
    t.add_argument("--api-key", action="append", metavar="KEY",
                   help="a key clients must send (Authorization: Bearer KEY); its namespace is key-<hash> (repeatable)")
    t.add_argument("--api-key-file", action="append", metavar="FILE",
                   help="keys, one per line: KEY [NAMESPACE|-] [admin,namespace-header,quota=SIZE] (repeatable)")
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

    def model_and_force(sp):
        sp.add_argument("--model", metavar="GGUF", help="bind to this model file (its hash, sliding window and "
                        "layer count): a slot file missing a section of it is refused")
        sp.add_argument("--force", action="store_true", help="store a file whose layout differs from the states "
                        "already stored under the same fingerprint in the namespace (another cache type)")

    sp = add("serve", "run the kvstore proxy in front of llama-server (see `kvstore serve --help`)", cmd_serve)
    add_serve_args(sp)
    sp = add("batch", "answer an OpenAI Batch file (JSONL; or Anthropic Message Batches lines) through kvstore "
                      "serve, each shared prefix evaluated once (see `kvstore batch --help`)", cmd_batch)
    from kvstore.batch.command import add_batch_args

    add_batch_args(sp)
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
    sp.add_argument("--max-size", metavar="SIZE", help="also evict names until the store fits SIZE (suffixes K, M, "
                    "G, T: powers of 1024): expired names first, then the least recently used names that own "
                    "their bytes (see docs/design.md \"Bounded store\")")
    sp.add_argument("--low-water", type=float, default=0.9, metavar="F",
                    help="with --max-size: once over it, evict down to F x SIZE (default 0.9)")
    for verb, fn in (("pin", cmd_pin), ("unpin", cmd_unpin)):
        sp = add(verb, ("never evict or expire a name" if verb == "pin" else "let a pinned name be evicted again"),
                 fn)
        sp.add_argument("name")
        ns(sp)
        if verb == "pin":
            sp.add_argument("--max-size", metavar="SIZE", help="refuse the pin if the pinned states would pass SIZE")
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
    model_and_force(sp)
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
        sp.add_argument("--api-key", metavar="KEY", help="a kvstore serve tenant key, or llama-server's own "
                                                         "--api-key (default: $KVSTORE_API_KEY)")
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
    model_and_force(sp)
    from kvstore.hooks import balancer  # the HAProxy config generator lives with the hooks whose names it routes by

    sp = add("balancer-config", "print an HAProxy config that sends each request to the kvstore serve holding its "
             "state (several servers on one store)", balancer.run)
    balancer.add_args(sp)
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
