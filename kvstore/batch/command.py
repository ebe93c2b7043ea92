"""The `kvstore batch` verb: arguments, an embedded `kvstore serve` when no `--server` is given, exit status.

Exit status: 0 every request answered with 200; 1 some line failed (its `error` or reply is in the output);
2 nothing could run (the server or the input could not be reached: one line on stderr).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from pathlib import Path

from kvstore.cliutil import CliError


def add_batch_args(sp) -> None:
    sp.add_argument("input", metavar="INPUT", help="OpenAI Batch file: one {custom_id, method, url, body} per line "
                                                  "(or Anthropic Message Batches: {custom_id, params})")
    sp.add_argument("-o", "--output", required=True, metavar="OUTPUT",
                    help="answers, one line per request; an existing OUTPUT is resumed (answered ids are skipped)")
    sp.add_argument("--server", metavar="URL", help="a running kvstore serve (or plain llama-server; --api-key: the "
                                                   "key to send it); default: start an embedded kvstore serve "
                                                   "with the serve flags below")
    sp.add_argument("--concurrency", type=int, metavar="N", help="requests in flight (default: the server's slots)")
    sp.add_argument("--summary", metavar="FILE", help="write a JSON summary (tokens sent, evaluated, ideal, wall)")
    sp.add_argument("--keep-parents", action="store_true", help="keep the shared prefixes it stored as states")
    sp.add_argument("--min-saving", type=int, default=128, metavar="TOKENS",
                    help="prime a shared prefix only if it saves this many evaluated tokens (default 128)")
    sp.add_argument("--keep-order", action="store_true", help="send in the input's order and prime nothing (as a "
                    "plain client would; for comparisons)")
    sp.add_argument("--dry-run", action="store_true", help="plan only: tokenize, find the shared prefixes, write the "
                    "summary; send no request (prompts given as token ids need no server calls)")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def cmd_batch(args) -> int:
    from .runner import BatchConfig, run

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.concurrency is not None and args.concurrency < 1:
        raise CliError("--concurrency must be at least 1")
    inp = Path(args.input)
    if not inp.is_file():
        raise CliError(f"{inp}: no such file")
    with contextlib.ExitStack() as stack:
        server = args.server
        if server is None:
            server = stack.enter_context(_embedded(args))
        cfg = BatchConfig(input=inp, output=Path(args.output), server=server, api_key=(args.api_key or [None])[0],
                          concurrency=args.concurrency, keep_parents=args.keep_parents, quiet=args.quiet,
                          min_saving=args.min_saving, dry_run=args.dry_run,
                          keep_order=args.keep_order)
        try:
            summary = asyncio.run(run(cfg))
        except (ConnectionError, RuntimeError) as e:
            raise CliError(f"nothing could run: {e}") from e
    doc = summary.as_dict()
    if args.summary:
        Path(args.summary).write_text(json.dumps(doc, indent=2) + "\n")
    if not args.quiet:
        print(f"kvstore batch: {summary.answered} answered, {summary.skipped} already answered, {summary.errors} "
              f"failed; prompt tokens evaluated {summary.evaluated} of {summary.prompt_tokens} sent (ideal "
              f"{summary.ideal}), {doc['wall_s']} s", file=sys.stderr)
    return 1 if summary.errors else 0


@contextlib.contextmanager
def _embedded(args):
    """A `kvstore serve` (and its llama-server) on a free loopback port for the length of the batch."""
    from kvstore.hooks.serve import Running, configure

    cfg, engine = configure(args)
    try:
        with Running(cfg, "127.0.0.1", 0) as hooks:
            yield hooks.url
    finally:
        if engine is not None:
            engine.close()
