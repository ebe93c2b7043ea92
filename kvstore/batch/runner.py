"""Running a batch against a `kvstore serve` (or a plain llama-server): tokenize, plan, prime, send, record.

Contract: `run(cfg)` answers every request of `cfg.input` not already answered in `cfg.output` (resume), with
`cfg.concurrency` requests in flight, and returns a `Summary`. Against a `kvstore serve` each shared prefix of the
plan (`kvstore.batch.plan`) is primed once as a named state (`POST /kvstore/states/{name}`, its own parent the
enclosing prefix) just before the first request that extends it, and every request that extends it is sent with
`cache_prompt_parent` (unless its body names a parent of its own); the prefixes are removed at the end unless
`keep_parents`. Against a plain llama-server requests are sent as they are, in the plan's order; with
`keep_order` in the input's order and without priming (what a plain client does: the benchmark's baseline).
A request the server refuses is answered with its reply (status and body); one that could not be sent
(connection refused, 503 after every retry) with an `error`. Prompts are tokenized as llama-server tokenizes them: text with BOS and
special tokens, chat (and a Responses request, as the chat request llama-server makes of it) through the server's
own template.
"""
from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import logging
import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import aiohttp

from kvstore import anthropic_api, llama, responses_api

from . import requests as rq
from .output import Output, record
from .plan import Plan, Planner, Prefix

log = logging.getLogger("kvstore.batch")

RETRIES = 6  # a 503 (queue full, server starting, bucket away) or a refused connection is retried this often
TOKENIZE_IN_FLIGHT = 8


@dataclass
class BatchConfig:
    input: Path
    output: Path
    server: str
    api_key: Optional[str] = None
    concurrency: Optional[int] = None  # None: the server's slot count
    keep_parents: bool = False
    quiet: bool = False
    min_saving: int = 128
    timeout: float = 3600.0
    dry_run: bool = False  # plan only: tokenize and group, send nothing
    keep_order: bool = False  # send in the input's order (no priming): what a plain client does


@dataclass
class Summary:
    requests: int = 0  # lines in the input that are requests (valid or not)
    answered: int = 0  # answered with status 200 in this run
    skipped: int = 0  # already answered in the output (resume)
    errors: int = 0  # lines answered with an error or a status other than 200
    prompt_tokens: int = 0  # prompt tokens of the requests sent in this run
    evaluated: int = 0  # prompt tokens llama-server evaluated for this run (priming included)
    ideal: Optional[int] = None  # distinct token prefixes of those prompts (None: too many to sort)
    primed: int = 0
    prefixes: int = 0
    concurrency: int = 0
    kvstore: bool = False
    wall_s: float = 0.0
    kv_cache: dict = field(default_factory=dict)
    peak_rss_mib: float = 0.0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["requests_per_s"] = round(self.answered / self.wall_s, 3) if self.wall_s else None
        d["x_ideal"] = round(self.evaluated / self.ideal, 4) if self.ideal else None
        d["wall_s"] = round(self.wall_s, 3)
        return d


def retry_after_s(value: Optional[str], fallback: float, at_most: float = 10.0) -> float:
    """Seconds to wait before sending again, from a 503's `Retry-After`: delay-seconds (what kvstore serve and
    llama-server send) or an HTTP-date (what a proxy in front may send, RFC 9110); anything else, or none, waits
    `fallback`. Never more than `at_most`, so a proxy's long date cannot stall a batch."""
    wait = fallback
    if value:
        try:
            wait = float(value)
        except ValueError:
            try:
                wait = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError):
                pass
        if not math.isfinite(wait):
            wait = fallback
    return min(max(wait, 0.0), at_most)


class Client:
    """The HTTP side: JSON requests with retries for what a busy or starting server answers (503, refused)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, headers: dict):
        self.session, self.base, self.headers = session, base.rstrip("/"), headers

    async def send(self, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
        """(status, decoded body, headers); raises ConnectionError when the server could not be reached."""
        delay = 0.5
        for attempt in range(RETRIES):
            try:
                async with self.session.request(method, self.base + path, json=body, headers=self.headers) as r:
                    raw = await r.read()
                    if r.status == 503 and attempt + 1 < RETRIES:
                        await asyncio.sleep(retry_after_s(r.headers.get("Retry-After"), delay))
                        delay *= 2
                        continue
                    try:
                        doc = json.loads(raw) if raw else None
                    except ValueError:
                        doc = raw.decode("utf-8", "replace")
                    return r.status, doc, r.headers
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
                if attempt + 1 == RETRIES:
                    raise ConnectionError(f"{self.base}{path}: {e or type(e).__name__}") from e
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, doc, _ = await self.send(method, path, body)
        if status != 200:
            raise RuntimeError(f"{method} {path}: {status} {doc if not isinstance(doc, bytes) else ''}")
        return doc

    async def tokens(self, line: rq.Line, body: dict) -> list[int]:
        if line.url == rq.RESPONSES:
            as_chat = responses_api.chat_body(body)
            if as_chat is None:  # outside the text subset (an image, a reasoning item): no shared prefix planned
                return []
            body = as_chat
        elif line.url == rq.MESSAGES:
            try:
                body = anthropic_api.chat_request(body)
            except anthropic_api.NotConvertible:  # sent as it is: the server's 400 says why
                return []
        if line.chat or line.url in (rq.RESPONSES, rq.MESSAGES):
            prompt = llama.prompt_of(await self.ok("POST", llama.APPLY_TEMPLATE, llama.template_request(body)))
        elif isinstance(body["prompt"], list):
            return list(body["prompt"])
        else:
            prompt = body["prompt"]
        return llama.tokens_of(await self.ok("POST", llama.TOKENIZE, llama.tokenize_request(prompt)))


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM). Not getrusage's ru_maxrss: Linux keeps that across execve,
    so a command started from a big process (a test runner) would report its parent's peak."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def prefix_name(prefix: Prefix) -> str:
    """A stable name for a shared prefix (a rerun primes the same one again): its tokens' hash."""
    return "batch-" + hashlib.blake2b(prefix.tokens.tobytes(), digest_size=10).hexdigest()


class Batch:
    def __init__(self, cfg: BatchConfig, client: Client, out: Output, summary: Summary):
        self.cfg, self.client, self.out, self.s = cfg, client, out, summary
        self.lines: list[rq.Line] = []  # the requests to send, by plan index
        self._primes: dict[int, asyncio.Future] = {}
        self.progress: Any = None

    # ---- pass 1: read, refuse, tokenize ----------------------------------------------------------------------
    async def read(self, planner: Planner) -> None:
        pending: list[rq.Line] = []
        for line in rq.read(self.cfg.input):
            self.s.requests += 1
            if line.error is not None:
                self.fail(line, "invalid_request", line.error)
            elif line.custom_id in self.out.done:
                self.s.skipped += 1
            else:
                pending.append(line)
                if len(pending) >= 256:
                    await self._tokenize(planner, pending)
                    pending = []
        await self._tokenize(planner, pending)

    async def _tokenize(self, planner: Planner, lines: list[rq.Line]) -> None:
        gate = asyncio.Semaphore(TOKENIZE_IN_FLIGHT)

        async def one(line: rq.Line) -> Optional[list[int]]:
            async with gate:
                try:
                    return await self.client.tokens(line, rq.body_of(self.cfg.input, line))
                except RuntimeError as e:  # the server refused this prompt (a template error, say)
                    self.fail(line, "tokenize_failed", str(e))
                    return None

        for line, tokens in zip(lines, await asyncio.gather(*(one(x) for x in lines))):
            if tokens is not None:
                planner.add(tokens)
                self.lines.append(line)

    def fail(self, line: rq.Line, code: str, message: str) -> None:
        self.s.errors += 1
        self.out.write(record(line.custom_id, error=(code, message), anthropic=line.anthropic))

    # ---- priming ---------------------------------------------------------------------------------------------
    async def primed(self, prefix: Prefix) -> Optional[str]:
        """The stored name of `prefix`, priming it (after its own parent) once; None if it could not be primed."""
        fut = self._primes.get(prefix.ordinal)
        if fut is None:
            fut = self._primes[prefix.ordinal] = asyncio.ensure_future(self._prime(prefix))
        return await asyncio.shield(fut)

    async def _prime(self, prefix: Prefix) -> Optional[str]:
        parent = await self.primed(prefix.parent) if prefix.parent is not None else None
        name = prefix_name(prefix)
        body: dict[str, Any] = {"prompt": list(prefix.tokens)}
        if parent:
            body["parent"] = parent
        try:
            status, doc, _ = await self.client.send("POST", f"/kvstore/states/{name}", body)
        except ConnectionError as e:
            log.warning("priming a shared prefix of %d tokens failed: %s", len(prefix.tokens), e)
            return None
        if status != 200:
            log.warning("priming a shared prefix of %d tokens failed: %s %s", len(prefix.tokens), status, doc)
            return None
        self.s.primed += 1
        self.s.evaluated += int(((doc or {}).get("timings") or {}).get("prompt_n") or 0)
        self.s.evaluated += int((doc or {}).get("fork_evaluated") or 0)  # a state stored at a fork on the way
        return name

    # ---- pass 2: send ----------------------------------------------------------------------------------------
    async def send(self, plan: Plan) -> None:
        queue = iter(range(len(self.lines)) if self.cfg.keep_order else plan.order)

        async def worker() -> None:
            for index in queue:
                await self._one(plan, index)

        await asyncio.gather(*(worker() for _ in range(self.s.concurrency)))

    async def _one(self, plan: Plan, index: int) -> None:
        line = self.lines[index]
        body = rq.body_of(self.cfg.input, line)
        body["stream"] = False
        prefix = plan.of[index]
        if self.s.kvstore and not self.cfg.keep_order and prefix is not None and "cache_prompt_parent" not in body:
            name = await self.primed(prefix)
            if name:
                body["cache_prompt_parent"] = name
        try:
            status, doc, headers = await self.client.send("POST", line.url, body)
        except ConnectionError as e:
            self.fail(line, "connection_error", str(e))
        else:
            self.out.write(record(line.custom_id, status=status, body=doc, anthropic=line.anthropic))
            if status == 200:
                self.s.answered += 1
                timings = llama.timings_of(doc) or {}  # a Responses or Messages reply: from its usage
                # With what kvstore evaluated first to store a state at a fork (a model with a recurrent section).
                self.s.evaluated += int(timings.get("prompt_n") or 0) + int(headers.get("X-KV-Fork-Evaluated") or 0)
                kind = headers.get("X-KV-Cache")
                if kind:
                    self.s.kv_cache[kind] = self.s.kv_cache.get(kind, 0) + 1
            else:
                self.s.errors += 1
        if self.progress is not None:
            self.progress.update(1)
            self.progress.set_postfix(evaluated=self.s.evaluated, sent=self.s.prompt_tokens, refresh=False)

    async def remove_prefixes(self) -> None:
        for fut in self._primes.values():
            name = fut.result() if fut.done() and not fut.exception() else None
            if name:
                try:
                    await self.client.send("DELETE", f"/kvstore/states/{name}")
                except ConnectionError as e:
                    log.warning("could not remove the shared prefix %s: %s", name, e)


async def run(cfg: BatchConfig) -> Summary:
    from tqdm import tqdm

    summary = Summary()
    t0 = time.perf_counter()
    out = Output.open(cfg.output)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=cfg.timeout)
    planner = Planner(cfg.min_saving)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            client = Client(session, cfg.server, headers)
            props = await client.ok("GET", llama.PROPS)
            status, _, _ = await client.send("GET", "/kvstore/stats")
            summary.kvstore = status == 200
            summary.concurrency = cfg.concurrency or max(1, llama.n_slots(props))
            batch = Batch(cfg, client, out, summary)
            await batch.read(planner)
            plan = planner.finish()
            summary.ideal, summary.prompt_tokens = plan.ideal, plan.prompt_tokens
            summary.prefixes = len(plan.prefixes) if (summary.kvstore and not cfg.keep_order) or cfg.dry_run else 0
            if cfg.dry_run:
                return summary
            with tqdm(total=len(plan.order), unit="req", disable=cfg.quiet, dynamic_ncols=True,
                      desc="kvstore batch") as progress:
                batch.progress = progress
                await batch.send(plan)
            if summary.kvstore and not cfg.keep_parents:
                await batch.remove_prefixes()
    finally:
        planner.close()
        out.close()
        summary.wall_s = time.perf_counter() - t0
        summary.peak_rss_mib = peak_rss_mib()
    return summary
