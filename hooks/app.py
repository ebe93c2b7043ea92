"""The hooks application: named requests routed to slots, states saved and restored through the store.

Wire protocol: docs/hooks.md. Flow per completion request (docs/architecture.md, "A named request"):
pick a slot (SlotTable; saves what it displaces), restore the name / its parent / the longest stored prefix
into it, forward with `id_slot` and `cache_prompt: true`, stream the reply back, mark the slot dirty.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import aiohttp
from aiohttp import web

from kvstore.config import sync_dir
from kvstore.fingerprint import server_fingerprint

from . import naming as nm
from . import prefix as pf
from .metrics import Metrics, timings_from_sse_tail
from .slots import Lease, QueueFull, Slot, SlotTable
from .syncdir import SyncDir
from .upstream import Upstream, UpstreamError, UpstreamReply

log = logging.getLogger("kvstore.hooks")

COMPLETION_PATHS = ("/completion", "/completions", "/v1/completions")
CHAT_PATHS = ("/chat/completions", "/v1/chat/completions")
SLOT_ONLY_PATHS = ("/infill",)  # evaluate in a slot, but never named
TAIL_BYTES = 64 * 1024
BODY_KEEP = 4 * 1024 * 1024


@dataclass
class HooksConfig:
    upstream: str  # llama-server URL
    store: Path  # store directory; llama-server's --slot-save-path must be <store>/sync
    name_from_user: bool = False
    idle_save: float = 30.0  # seconds; <= 0 disables
    max_queue: int = 64
    fingerprint_extra: dict = field(default_factory=dict)  # added to the server fingerprint (e.g. swa_full)
    ready_timeout: float = 300.0
    # SWA models: the server's SWA cache cells per slot (hooks/prefix.py swa_cells), so a cut keeps a fresh
    # evaluation's cell layout; 0 when unknown (an external llama-server): the cut carries the window alone.
    swa_cells: int = 0


def error(status: int, message: str, kind: str = "invalid_request_error", headers: Optional[dict] = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status, headers=headers)


HANDLED = (QueueFull, UpstreamError, UpstreamReply)


def failure(e: Exception) -> web.Response:
    """The reply for a request that failed with one of HANDLED."""
    if isinstance(e, QueueFull):
        return error(503, str(e), "unavailable_error", headers={"Retry-After": "1"})
    if isinstance(e, UpstreamReply):  # e.g. /tokenize refused the prompt: pass llama-server's answer on
        return web.Response(status=e.status, body=e.body, content_type="application/json")
    return error(502, str(e), "upstream_error")


def not_found(ns: str, name: str) -> web.Response:
    return error(404, f"no state named {name!r} in namespace {ns!r}", "not_found_error")


def state_key(request: web.Request) -> tuple[str, str]:
    """(namespace, name) of a /kvstore/states/{name} request; raises nm.BadName."""
    return nm.namespace_of(request.headers), nm.validate(request.match_info["name"], "name")


class NotStored(Exception):
    pass


class RestoreFailed(Exception):
    pass


class Hooks:
    """Everything one running hooks server shares: upstream, store, slot table, counters."""

    def __init__(self, cfg: HooksConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.session: Optional[aiohttp.ClientSession] = None
        self.up: Optional[Upstream] = None
        self.store: Any = None
        self.sync = SyncDir(sync_dir(cfg.store))
        self.table: Optional[SlotTable] = None
        self.fingerprint: dict[str, str] = {}
        # The server's cache layout (types, flash attention, rotation), learned from its first non-empty save:
        # /props does not tell it, and a state of another layout must be refused before llama-server sees it.
        self.layout: Optional[str] = None
        self.n_slots = 0
        self.block_size = 64
        self._idle_task: Optional[asyncio.Task] = None

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    async def context(self, app: web.Application):
        """aiohttp cleanup context: one ClientSession, the store, the slot table; save everything on the way out."""
        # llama-server (cpp-httplib) drops idle keep-alive connections after 5 s; keep ours for less, so a pooled
        # connection is rarely stale (Upstream also retries once when one is).
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                                             connector=aiohttp.TCPConnector(keepalive_timeout=2.0),
                                             auto_decompress=False)
        try:
            self.up = Upstream(self.cfg.upstream, self.session)
            props = await self.up.wait_ready(self.cfg.ready_timeout)
            try:
                models = await self.up.call("GET", "/v1/models")
            except (UpstreamError, UpstreamReply):
                models = None
            self.n_slots = int(props.get("total_slots") or 1)
            fp = await asyncio.to_thread(server_fingerprint, props, models)
            fp.update({k: str(v) for k, v in self.cfg.fingerprint_extra.items()})
            self.fingerprint = fp
            from kvstore._core import Store

            self.store = await asyncio.to_thread(Store, str(self.cfg.store))
            self.block_size = int(getattr(self.store, "block_size", 64))
            self.sync.clean_stale()
            self.table = SlotTable(self.n_slots, save=self._save_slot, max_queue=self.cfg.max_queue)
            if self.cfg.idle_save > 0:
                self._idle_task = asyncio.create_task(self._idle_loop())
            log.info("hooks: upstream %s, %d slots, store %s, fingerprint %s", self.up.url, self.n_slots,
                     self.cfg.store, fp)
            yield
        finally:
            if self._idle_task is not None:
                self._idle_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._idle_task
            if self.table is not None:
                try:
                    n = await self.table.save_all()
                    log.info("hooks: saved %d dirty slot(s) on shutdown", n)
                except Exception as e:  # noqa: BLE001 - report, still close
                    log.error("hooks: saving slots on shutdown failed: %s", e)
            await self.session.close()
            self.store = None

    async def _idle_loop(self) -> None:
        period = max(0.2, min(self.cfg.idle_save / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            try:
                await self.table.save_idle(self.cfg.idle_save)
            except Exception as e:  # noqa: BLE001 - keep the loop alive
                log.error("hooks: idle save failed: %s", e)

    # ---- store <-> slot ------------------------------------------------------------------------------------------
    def expect(self) -> dict[str, str]:
        """What a state must match to go into this server: the fingerprint, plus the layout once it is known.
        (The core keeps `layout` out of the fingerprint id, so prefix lookups are unaffected.)"""
        return {**self.fingerprint, "layout": self.layout} if self.layout else self.fingerprint

    async def _save_slot(self, slot: Slot, name: Optional[str] = None, namespace: Optional[str] = None
                         ) -> Optional[dict]:
        """Save a slot into the sync dir and ingest it (under its own name, or `name`). Caller holds the slot."""
        name = name if name is not None else slot.name
        namespace = namespace if namespace is not None else slot.namespace
        if name is None:
            return None
        t0 = time.perf_counter()
        try:
            with self.sync.temp() as (fn, path):
                r = await self.up.slot_action(slot.id, "save", fn)
                if not r.get("n_saved"):
                    log.warning("slot %d: nothing to save for %r (empty slot); store unchanged", slot.id, name)
                    return {"n_saved": 0, "save": r}
                parent = slot.parent if slot.parent != name else None
                try:
                    info = await asyncio.to_thread(self.store.ingest, name, str(path), namespace=namespace,
                                                   fingerprint=self.expect(), parent=parent, remove_file=True)
                except KeyError:  # NameNotFound: the parent is gone; keep the state anyway
                    info = await asyncio.to_thread(self.store.ingest, name, str(path), namespace=namespace,
                                                   fingerprint=self.expect(), remove_file=True)
                if self.layout is None:
                    stored = await asyncio.to_thread(self.store.get, name, namespace=namespace)
                    if stored and "kv[-]" not in stored["layout"]:  # an empty slot carries no layers
                        self.layout = stored["layout"]
                        log.info("hooks: llama-server's cache layout is %s", self.layout)
        except Exception:
            self.metrics.inc("save_failures")
            raise
        self.metrics.inc("save_seconds", time.perf_counter() - t0)
        self.metrics.inc("save_count")
        self.metrics.inc("bytes_ingested", int(info.get("new_stored_bytes") or 0))
        self.metrics.inc("bytes_saved", int(info.get("file_bytes") or 0))
        info["save"] = r
        log.info("slot %d: saved %s/%s: %s tokens, %s new bytes", slot.id, namespace, name,
                 info.get("n_tokens"), info.get("new_stored_bytes"))
        return info

    async def _restore(self, lease: Lease, namespace: str, *, name: Optional[str] = None,
                       manifest_id: Optional[str] = None) -> dict:
        """Materialize a stored state and restore it into the leased slot. Raises NotStored / RestoreFailed;
        UpstreamError (unreachable) propagates. A failed restore leaves the slot empty (llama-server wipes it)."""
        return await lease.shielded(self._restore_inner(lease.slot, namespace, name, manifest_id))

    async def _restore_inner(self, slot: Slot, namespace: str, name: Optional[str], manifest_id: Optional[str]
                             ) -> dict:
        from kvstore._core import KvStoreError, NameNotFound

        t0 = time.perf_counter()
        with self.sync.temp() as (fn, path):
            try:
                if name is not None:
                    info = await asyncio.to_thread(self.store.materialize, name, str(path), namespace=namespace,
                                                   expect=self.expect(), n_stream=self.n_slots)
                else:
                    info = await asyncio.to_thread(self.store.materialize_manifest, manifest_id, str(path),
                                                   expect=self.expect(), n_stream=self.n_slots)
            except NameNotFound:
                raise NotStored(name) from None
            except (KvStoreError, OSError) as e:
                self._restore_failed(slot, f"materialize {name or manifest_id}: {e}")
                raise RestoreFailed(str(e)) from e
            self.metrics.inc("bytes_materialized", int(info.get("file_bytes") or 0))
            try:
                r = await self.up.slot_action(slot.id, "restore", fn)
            except UpstreamReply as e:
                self._restore_failed(slot, f"llama-server refused {name or manifest_id}: {e}")
                raise RestoreFailed(e.body.decode(errors="replace")) from e
            except UpstreamError:
                slot.clear()
                raise
        n = int(r.get("n_restored") or 0)
        self.metrics.inc("restore_seconds", time.perf_counter() - t0)
        self.metrics.inc("restore_count")
        self.metrics.inc("tokens_restored", n)
        r["kvstore"] = info
        return r

    async def _restore_cut(self, lease: Lease, naming: nm.Naming, tokens_fn, hint: Optional[dict]
                           ) -> Optional[tuple[str, int]]:
        """SWA models: restore the stored state (own name, parent, or longest stored prefix) that shares the most
        tokens with the prompt, cut there (hooks/prefix.py). None when nothing applies or the cut cannot be emitted
        (counted as prefix_unavailable): the caller then goes on as for any other model."""
        if int(self.fingerprint.get("n_swa") or 0) <= 0:
            return None
        from kvstore._core import KvStoreError, NameNotFound

        tokens = await tokens_fn()
        if not tokens:
            return None
        ns = naming.namespace
        cands: list[pf.Candidate] = []
        for kind, name in (("restored", naming.name), ("parent", naming.parent)):
            if not name:
                continue
            try:
                st = await asyncio.to_thread(self.store.tokens, name, namespace=ns)
            except NameNotFound:
                continue
            cands.append(pf.Candidate(kind, name, None, len(st), pf.common_prefix(st, tokens)))
        if hint is None:
            hint = await self._lookup(ns, tokens)
        if hint is not None:
            cands.append(pf.Candidate("prefix", hint.get("name") or None, hint["manifest_id"],
                                      int(hint["n_tokens"]), int(hint["n_common"])))
        c = pf.best(cands, self.block_size)
        if c is None or c.n_common <= lease.lcp:
            return None
        p = pf.cut_point(c)
        slot = lease.slot

        async def run() -> Optional[dict]:
            t0 = time.perf_counter()
            with self.sync.temp() as (fn, path):
                try:
                    if c.kind == "prefix":
                        info = await asyncio.to_thread(
                            self.store.materialize_prefix, None, p, str(path), namespace=ns,
                            manifest_id=c.manifest_id, expect=self.expect(), n_stream=self.n_slots,
                            fill_masked=self.cfg.swa_cells)
                    else:
                        info = await asyncio.to_thread(
                            self.store.materialize_prefix, c.name, p, str(path), namespace=ns, expect=self.expect(),
                            n_stream=self.n_slots, fill_masked=self.cfg.swa_cells)
                except (KvStoreError, OSError) as e:
                    log.error("slot %d: cut of %s at %d failed: %s", slot.id, c.name or c.manifest_id, p, e)
                    self.metrics.inc("prefix_unavailable")
                    return None
                if "missing" in info:
                    log.info("slot %d: no cut of %s at %d: %s %s", slot.id, c.name or c.manifest_id, p,
                             info.get("reason"), info.get("missing"))
                    self.metrics.inc("prefix_unavailable")
                    return None
                self.metrics.inc("bytes_materialized", int(info.get("file_bytes") or 0))
                try:
                    r = await self.up.slot_action(slot.id, "restore", fn)
                except UpstreamReply as e:
                    self._restore_failed(slot, f"llama-server refused the cut of {c.name or c.manifest_id}: {e}")
                    raise RestoreFailed(e.body.decode(errors="replace")) from e
                except UpstreamError:
                    slot.clear()
                    raise
            self.metrics.inc("restore_seconds", time.perf_counter() - t0)
            self.metrics.inc("restore_count")
            self.metrics.inc("tokens_restored", int(r.get("n_restored") or 0))
            return r

        r = await lease.shielded(run())
        if r is None:
            return None
        if c.kind == "parent":
            slot.parent = naming.parent if naming.name else None
        elif c.kind == "prefix" and naming.name and c.name and c.name != naming.name:
            slot.parent = c.name
        return c.kind, int(r.get("n_restored") or 0)

    def _restore_failed(self, slot: Slot, why: str) -> None:
        log.error("slot %d: restore failed, continuing with a full evaluation: %s", slot.id, why)
        self.metrics.inc("restore_failures")
        slot.clear()

    async def _lookup(self, namespace: str, tokens: Optional[list[int]]) -> Optional[dict]:
        if not tokens or len(tokens) < self.block_size:
            return None
        try:
            hit = await asyncio.to_thread(self.store.lookup, tokens, namespace=namespace, fingerprint=self.fingerprint)
        except Exception as e:  # noqa: BLE001 - a failed lookup is a miss
            log.error("prefix lookup failed: %s", e)
            return None
        if hit and int(hit.get("n_common") or 0) >= self.block_size:
            return hit
        return None

    async def _stored(self, namespace: str, name: str) -> bool:
        try:
            return await asyncio.to_thread(self.store.get, name, namespace=namespace) is not None
        except Exception as e:  # noqa: BLE001 - unknown: let the restore decide
            log.error("store lookup of %r failed: %s", name, e)
            return True

    async def _plan(self, naming: nm.Naming, tokens_fn) -> tuple[Optional[list[int]], Optional[dict], int, bool]:
        """What to ask the slot table for, before taking a slot: (tokens, stored-prefix hit, better_than, looked_up).

        A request with nothing of its own to restore (unnamed without a parent; named, with its name neither
        resident nor stored and no parent resident or stored) may reuse an idle slot's content in place, as
        llama-server's slot similarity does: its prompt is tokenized and the longest stored prefix looked up, and
        a slot wins if it shares more than that (a named request: at least one store block too).
        """
        ns = naming.namespace
        if naming.name is None:
            if naming.parent is not None:
                return None, None, 0, False
        elif (self.table.resident(naming.key) is not None or await self._stored(ns, naming.name)
              or (naming.parent is not None and (self.table.resident(naming.parent_key) is not None
                                                 or await self._stored(ns, naming.parent)))):
            return None, None, 0, False
        tokens = await tokens_fn()
        hint = await self._lookup(ns, tokens)
        stored = int(hint["n_common"]) if hint else 0
        better = stored if naming.name is None else max(stored + 1, self.block_size)
        return tokens, hint, better, True

    async def _prepare(self, lease: Lease, naming: nm.Naming, tokens_fn, hint: Optional[dict],
                       looked_up: bool = False) -> tuple[str, int]:
        """Bring the best stored state into the leased slot. Returns (X-KV-Cache kind, tokens restored)."""
        slot = lease.slot
        if lease.resident:
            return "slot", 0
        if lease.parent_resident:
            return "parent", 0
        ns = naming.namespace
        try:
            cut = await self._restore_cut(lease, naming, tokens_fn, hint)
            if cut is not None:
                return cut
            if naming.name:
                try:
                    r = await self._restore(lease, ns, name=naming.name)
                    return "restored", int(r.get("n_restored") or 0)
                except NotStored:
                    pass
            if naming.parent:
                try:
                    r = await self._restore(lease, ns, name=naming.parent)
                    slot.parent = naming.parent if naming.name else None
                    return "parent", int(r.get("n_restored") or 0)
                except NotStored:
                    pass
            if not looked_up and naming.name:
                hint = await self._lookup(ns, await tokens_fn())
            if hint is not None and int(hint["n_common"]) > lease.lcp:
                try:
                    r = await self._restore(lease, ns, manifest_id=hint["manifest_id"])
                    if naming.name and hint.get("name") and hint["name"] != naming.name:
                        slot.parent = hint["name"]
                    return "prefix", int(r.get("n_restored") or 0)
                except NotStored:
                    pass
        except RestoreFailed:
            return "miss", 0
        return ("slot", 0) if lease.lcp > 0 else ("miss", 0)

    @contextlib.asynccontextmanager
    async def _hold(self, naming: nm.Naming, tokens_fn, *, plan: bool = True):
        """Hold a slot for a request and bring the best state into it: yields (lease, X-KV-Cache kind, restored).

        plan: consider in-place reuse of an idle slot's content (see _plan); False for never-named requests.
        """
        tokens, hint, better, looked_up = await self._plan(naming, tokens_fn) if plan else (None, None, 0, False)
        # A stored state of the request's own name beats its parent resident in a slot: it holds more tokens.
        parent = naming.parent_key
        if parent is not None and naming.name is not None and await self._stored(naming.namespace, naming.name):
            parent = None
        async with self.table.acquire(key=naming.key, parent=parent, tokens=tokens, namespace=naming.namespace,
                                      better_than=better) as lease:
            kind, n_restored = await self._prepare(lease, naming, tokens_fn, hint, looked_up)
            self.metrics.kind(kind)
            yield lease, kind, n_restored

    # ---- handlers --------------------------------------------------------------------------------------------------
    async def completion(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return error(400, "request body must be a JSON object")
        chat = path in CHAT_PATHS
        nameable = path not in SLOT_ONLY_PATHS
        try:
            naming = nm.naming_of(request.headers, body if nameable else {}, name_from_user=self.cfg.name_from_user)
        except nm.BadName as e:
            return error(400, str(e))
        nm.strip_fields(body)

        tokens_fn = _Once(lambda: self._prompt_tokens(body, chat))
        try:
            async with self._hold(naming, tokens_fn, plan=nameable) as (lease, kind, n_restored):
                slot = lease.slot
                body["id_slot"] = slot.id
                body["cache_prompt"] = True
                headers = {"X-KV-Cache": kind, "X-KV-Restored-Tokens": str(n_restored), "X-KV-Slot": str(slot.id)}
                if naming.name:
                    headers["X-KV-Name"] = naming.name
                stream = bool(body.get("stream"))
                seen = _Tee(stream)
                try:
                    resp = await self.up.forward(request, path, body=json.dumps(body).encode(),
                                                 extra_headers=headers, tee=seen)
                finally:
                    if seen.started:
                        self.table.touch(slot)
                        slot.tokens = list(tokens_fn.value or [])
                        if slot.name is not None:
                            slot.dirty = True
                timings = seen.timings()
                if timings and isinstance(timings.get("prompt_n"), (int, float)):
                    self.metrics.inc("prompt_tokens_evaluated", int(timings["prompt_n"]))
                return resp
        except HANDLED as e:
            return failure(e)

    async def _prompt_tokens(self, body: dict, chat: bool) -> Optional[list[int]]:
        """The prompt's tokens as llama-server will see them (best effort; None if unknown)."""
        try:
            if chat:
                if not isinstance(body.get("messages"), list):
                    return None
                return await self.up.tokenize(await self.up.apply_template(body))
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                return await self.up.tokenize(prompt)
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                return list(prompt)
        except UpstreamReply as e:
            log.warning("could not tokenize the prompt: %s", e)
        return None

    async def prime(self, request: web.Request) -> web.Response:
        """POST /kvstore/states/{name}: evaluate a prompt (n_predict 0) into a slot and store it under the name."""
        try:
            body = await request.json()
        except ValueError:
            return error(400, "request body is not valid JSON")
        if not isinstance(body, dict) or ("prompt" not in body and "messages" not in body):
            return error(400, "give `prompt` (string or token ids) or `messages`")
        name = request.match_info["name"]
        parent = body.get("parent", body.get(nm.PARENT_FIELD, request.headers.get(nm.PARENT_HEADER)))
        try:
            ns = nm.namespace_of(request.headers)
            nm.validate(name, "name")
            if parent is not None:
                nm.validate(parent, "parent")
        except nm.BadName as e:
            return error(400, str(e))
        naming = nm.Naming(ns, name, parent or None)
        try:
            if "messages" in body:
                prompt: Any = await self.up.apply_template(
                    body, add_generation_prompt=bool(body.get("add_generation_prompt", False)))
            else:
                prompt = body["prompt"]
            tokens_fn = _Once(lambda: self._prompt_tokens({"prompt": prompt}, False))
            async with self._hold(naming, tokens_fn) as (lease, kind, n_restored):
                slot = lease.slot
                req = {"prompt": prompt, "n_predict": 0, "id_slot": slot.id, "cache_prompt": True,
                       "temperature": 0}
                try:
                    r = await self.up.call("POST", "/completion", req)
                finally:
                    self.table.touch(slot)
                    slot.dirty = True
                slot.tokens = await tokens_fn() or []
                timings = r.get("timings") or {}
                self.metrics.inc("prompt_tokens_evaluated", int(timings.get("prompt_n") or 0))
                info = await lease.shielded(self._save_slot(slot))
                slot.dirty = False
        except HANDLED as e:
            return failure(e)
        return web.json_response({
            "name": name, "namespace": ns, "n_tokens": int((info or {}).get("n_tokens") or r.get("tokens_cached") or 0),
            "id_slot": slot.id, "cache": kind, "n_restored": n_restored, "timings": timings,
            "stored": _jsonable(info)}, headers={"X-KV-Cache": kind, "X-KV-Slot": str(slot.id),
                                                 "X-KV-Restored-Tokens": str(n_restored)})

    async def state_info(self, request: web.Request) -> web.Response:
        try:
            ns, name = state_key(request)
        except nm.BadName as e:
            return error(400, str(e))
        info = await asyncio.to_thread(self.store.get, name, namespace=ns)
        if info is None:
            return not_found(ns, name)
        s = self.table.resident((ns, name))
        info = dict(info)
        info["resident_slot"] = s.id if s is not None else None
        info["dirty"] = bool(s is not None and s.dirty)
        return web.json_response(_jsonable(info))

    async def state_delete(self, request: web.Request) -> web.Response:
        try:
            ns, name = state_key(request)
        except nm.BadName as e:
            return error(400, str(e))
        s = self.table.resident((ns, name))
        if s is not None:  # forget the label: the slot's content is no longer saved under that name
            s.hold(None)
        removed = await asyncio.to_thread(self.store.remove, name, namespace=ns)
        if not removed and s is None:
            return not_found(ns, name)
        return web.json_response({"name": name, "namespace": ns, "removed": True})

    async def state_list(self, request: web.Request) -> web.Response:
        try:
            ns = nm.namespace_of(request.headers)
        except nm.BadName as e:
            return error(400, str(e))
        items = await asyncio.to_thread(self.store.list, namespace=ns)
        return web.json_response({"namespace": ns, "states": _jsonable(items)})

    async def stats(self, request: web.Request) -> web.Response:
        store = await asyncio.to_thread(self.store.stats)
        return web.json_response(_jsonable({
            "upstream": self.up.url, "n_slots": self.n_slots, "fingerprint": self.expect(),
            "queue_length": self.table.queue_length, "slots": self.table.as_list(),
            "counters": self.metrics.snapshot(), "store": store}))

    async def prometheus(self, request: web.Request) -> web.Response:
        try:
            store = await asyncio.to_thread(self.store.stats)
        except Exception:  # noqa: BLE001
            store = None
        text = self.metrics.prometheus(queue_length=self.table.queue_length, store=store)
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-KV-Note": "kvstore metrics; llama-server's own are at its /metrics"})

    async def slot_action(self, request: web.Request) -> web.StreamResponse:
        """Raw slot API: save ingests into the store, restore materializes first, erase marks the slot empty."""
        action = request.query.get("action")
        if action not in ("save", "restore", "erase"):
            return await self.passthrough(request)
        try:
            slot_id = int(request.match_info["id"])
        except ValueError:
            return error(400, f"slot id {request.match_info['id']!r} is not an integer")
        if not 0 <= slot_id < self.n_slots:
            return error(400, f"slot id {slot_id} out of range: this server has {self.n_slots} slot(s), 0..{self.n_slots - 1}")
        try:
            raw = await request.read()
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return error(400, "request body is not valid JSON")
        try:
            ns = nm.namespace_of(request.headers)
            filename = None
            if action != "erase":
                filename = body.get("filename") if isinstance(body, dict) else None
                if filename is None:
                    return error(400, "body needs a `filename`: the name to save or restore")
                nm.validate(filename, "name")
        except nm.BadName as e:
            return error(400, str(e))
        try:
            if action == "save":
                return await self._raw_save(slot_id, ns, filename)
            if action == "restore":
                return await self._raw_restore(slot_id, ns, filename)
            async with self.table.acquire(slot_id=slot_id, relabel=False) as lease:
                r = await self.up.slot_action(slot_id, "erase")
                lease.slot.hold(None)
                lease.slot.clear()
                return web.json_response(r)
        except HANDLED as e:
            return failure(e)

    async def _raw_save(self, slot_id: int, ns: str, name: str) -> web.Response:
        async with self.table.acquire(slot_id=slot_id, relabel=False) as lease:
            slot = lease.slot
            t0 = time.perf_counter()
            info = await lease.shielded(self._save_slot(slot, name=name, namespace=ns))
            if slot.key == (ns, name):
                slot.dirty = False
        save = (info or {}).get("save") or {}
        return web.json_response({
            "id_slot": slot_id, "filename": name, "n_saved": save.get("n_saved", 0),
            "n_written": save.get("n_written", 0),
            "timings": {"save_ms": round((time.perf_counter() - t0) * 1000, 3)},
            "kvstore": _jsonable({k: v for k, v in (info or {}).items() if k != "save"})})

    async def _raw_restore(self, slot_id: int, ns: str, name: str) -> web.Response:
        key = (ns, name)
        other = self.table.resident(key)
        if other is not None and other.id != slot_id:
            # The name is resident elsewhere: save its newest content, then let only the target hold the label.
            async with self.table.acquire(slot_id=other.id, relabel=False) as lease:
                if other.key == key:
                    if other.dirty:
                        await self.table.evict(lease)
                    other.hold(None)
        async with self.table.acquire(slot_id=slot_id, key=key) as lease:
            slot = lease.slot
            if lease.resident and slot.dirty:
                await self.table.evict(lease)
            t0 = time.perf_counter()
            try:
                r = await self._restore(lease, ns, name=name)
            except NotStored:
                return not_found(ns, name)
            except RestoreFailed as e:
                return error(400, f"restore of {name!r} failed: {e}")
            slot.tokens = []
            self.table.touch(slot)
        info = r.get("kvstore") or {}
        return web.json_response({
            "id_slot": slot_id, "filename": name, "n_restored": r.get("n_restored", 0),
            "n_read": r.get("n_read", info.get("file_bytes", 0)),
            "timings": {"restore_ms": round((time.perf_counter() - t0) * 1000, 3)},
            "kvstore": _jsonable(info)})

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self.up.forward(request, request.path)
        except UpstreamError as e:
            return error(502, str(e), "upstream_error")


class _Once:
    """An awaitable computed at most once, and only if asked for (the prompt's tokens); `.value` once it is."""

    def __init__(self, fn):
        self._fn = fn
        self._done = False
        self.value: Any = None

    async def __call__(self) -> Any:
        if not self._done:
            self.value = await self._fn()
            self._done = True
        return self.value


class _Tee:
    """Sees reply chunks: keeps a non-stream body (bounded) or the tail of a stream, for `timings`."""

    def __init__(self, stream: bool):
        self.stream = stream
        self.started = False
        self.buf = bytearray()
        self.overflow = False

    def __call__(self, chunk: bytes) -> None:
        self.started = True
        self.buf += chunk
        if self.stream:
            if len(self.buf) > 2 * TAIL_BYTES:
                del self.buf[:-TAIL_BYTES]
        elif len(self.buf) > BODY_KEEP:
            self.overflow = True
            self.buf.clear()

    def timings(self) -> Optional[dict]:
        if self.stream:
            return timings_from_sse_tail(bytes(self.buf))
        if self.overflow:
            return None
        try:
            obj = json.loads(bytes(self.buf))
        except ValueError:
            return None
        return obj.get("timings") if isinstance(obj, dict) else None


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, bytes):
        return x.hex()
    return str(x)


HOOKS = web.AppKey("hooks", Hooks)


def build_app(cfg: HooksConfig) -> web.Application:
    hooks = Hooks(cfg)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[HOOKS] = hooks
    app.cleanup_ctx.append(hooks.context)
    r = app.router
    for p in COMPLETION_PATHS + CHAT_PATHS + SLOT_ONLY_PATHS:
        r.add_post(p, hooks.completion)
    r.add_post("/slots/{id}", hooks.slot_action)
    r.add_get("/kvstore/states", hooks.state_list)
    r.add_post("/kvstore/states/{name}", hooks.prime)
    r.add_get("/kvstore/states/{name}", hooks.state_info)
    r.add_delete("/kvstore/states/{name}", hooks.state_delete)
    r.add_get("/kvstore/stats", hooks.stats)
    r.add_get("/metrics", hooks.prometheus)
    r.add_route("*", "/{tail:.*}", hooks.passthrough)
    return app
