"""The HTTP handlers: parse a request, call the broker (or the store, or llama-server), shape the reply.

Contract: thin by design: what to restore or save is `broker.py`'s, slot fields are `SlotTable`'s, and errors are
raised (`errors.BadRequest`, `NotFound`, ...) for `middleware.py` to turn into replies. Routes: `routes.ROUTES`.
"""
from __future__ import annotations

import json
from typing import Optional, Protocol, Union

from aiohttp import web

from kvstore import anthropic_api, llama, page, responses_api

from kvstore.errors import StoreFull

from . import bound as bd
from . import naming as nm
from . import several
from .broker import Once
from .errors import BadRequest, NotSupported, remote_unavailable
from .metrics import Metrics, timings_from_sse_tail
from .auth import Caller
from .routes import CHAT_PATHS, COMPLETION_PATHS, MESSAGES_PATHS, RESPONSES_PATHS, SLOT_ONLY_PATHS, caller
from .upstream import CUT
from .wiring import HooksConfig, Wired

TAIL_BYTES = 64 * 1024
BODY_KEEP = 4 * 1024 * 1024

# What a JSON document holds, as far as these handlers look into one.
Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]


class Server(Protocol):
    """What the handlers use of the running server (`app.Hooks`)."""

    cfg: HooksConfig
    metrics: Metrics

    @property
    def wired(self) -> Wired: ...

    def check_upstream_soon(self) -> None: ...


class Handlers:
    """Bound to the running server (`app.Hooks`); `wired` is there once the ready middleware lets a request in."""

    def __init__(self, server: Server):
        self.h = server

    async def completion(self, request: web.Request) -> web.StreamResponse:
        h, w, path = self.h, self.h.wired, request.path
        body = await _json_body(request, allow_empty=True)
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        _refuse_unservable(body)
        _require_prompt(path, body)
        chat = path in CHAT_PATHS
        nameable = path not in SLOT_ONLY_PATHS
        named_by = nm.with_messages_user(body) if path in MESSAGES_PATHS else body
        naming = nm.naming_of(request.headers, named_by if nameable else {}, namespace=caller(request).namespace,
                              name_from_user=h.cfg.name_from_user)
        asked = bd.ask_of(request.headers, body if nameable else {})
        if (path in COMPLETION_PATHS and naming.name is None and naming.parent is None and not body.get("stream")
                and (each := several.prompts(body)) is not None):
            return await several.serve(request, path, body, each, w.up.session, in_flight=len(w.table))
        nm.strip_fields(body)
        bd.strip_fields(body)
        translate = None
        if path in MESSAGES_PATHS:  # sent as the chat request llama-server makes of it, so that id_slot holds
            stream = bool(body.get("stream"))
            try:
                body = {**anthropic_api.chat_request(body), **anthropic_api.reply_fields(stream)}
            except anthropic_api.NotConvertible as e:
                raise BadRequest(str(e)) from None
            path, chat, translate = CHAT_PATHS[-1], True, anthropic_api.Translation(stream)
        pin_state = await w.bound.ask(naming.key, asked)
        if path in RESPONSES_PATHS:  # tokenized as the chat request llama-server makes of it; forwarded as it is
            tokens_fn = Once(lambda: w.broker.prompt_tokens(responses_api.chat_body(body), True))
        else:
            tokens_fn = Once(lambda: w.broker.prompt_tokens(body, chat))
        async with w.bound.in_use(naming.key, naming.parent_key), \
                w.broker.hold(naming, tokens_fn, plan=nameable) as (lease, kind, n_restored):
            slot = lease.slot
            body["id_slot"] = slot.id
            body["cache_prompt"] = True
            headers = {"X-KV-Cache": kind, "X-KV-Restored-Tokens": str(n_restored), "X-KV-Slot": str(slot.id)}
            if naming.name:
                headers["X-KV-Name"] = naming.name
            if pin_state is not None:
                headers[bd.PIN_HEADER] = pin_state
            if lease.decision is not None:
                headers["X-KV-Decision"] = lease.decision.header()
            if lease.fork_evaluated:
                headers["X-KV-Fork-Evaluated"] = str(lease.fork_evaluated)
            seen = _Tee(bool(body.get("stream")))
            status = None
            try:
                resp = await w.up.forward(request, path, body=json.dumps(body).encode(), extra_headers=headers,
                                          tee=seen, translate=translate)
                status = resp.status
                if request.get(CUT) is not None:
                    raise ReplyCut()  # the reply is already on its way: only the slot needs marking
            except ReplyCut:
                w.table.lost(slot)
                return resp
            finally:
                # A request llama-server refused (an error status: a prompt over the context, a bad field) evaluated
                # nothing: the slot keeps what it held, unmarked. Marked, a slot given to this name with another
                # name's content in it (saved, reused in place) would be saved under this name. The slot also gets
                # back its label when nothing was loaded into it: a bad request displaces no one.
                if status is not None and status >= 400 or _evaluated_nothing(tokens_fn.value, seen):
                    w.table.unchanged(lease)
                elif seen.started:
                    w.table.evaluated(slot, tokens_fn.value or [])
                    # Let the restart watch see this task's id soon: a restart right after it is then noticed.
                    h.check_upstream_soon()
                    # Counted even when the client hung up after the last chunk (write_eof then fails).
                    timings = seen.timings()
                    h.metrics.evaluated(kind, timings, n_restored)
                    w.transfer.cost.prefilled(timings)
            return resp

    async def prime(self, request: web.Request) -> web.Response:
        """POST /kvstore/states/{name}: evaluate a prompt (n_predict 0) into a slot and store it under the name."""
        body = await _json_body(request)
        if not isinstance(body, dict) or ("prompt" not in body and "messages" not in body):
            raise BadRequest("give `prompt` (string or token ids) or `messages`")
        name = request.match_info["name"]
        given = body.get("parent", body.get(nm.PARENT_FIELD, request.headers.get(nm.PARENT_HEADER)))
        ns = caller(request).namespace
        nm.validate(name, "name")
        parent = nm.validate(given, "parent") if given is not None else None
        if "messages" in body:
            prompt: Json = await self.h.wired.up.apply_template(
                body, add_generation_prompt=bool(body.get("add_generation_prompt", False)))
        else:
            prompt = body["prompt"]
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]  # a list of one prompt is that prompt, to llama-server as well
            if several.prompts(body) is not None:
                raise BadRequest("a state holds one prompt: `prompt` here is a list of prompts; prime each under a "
                                 "name of its own")
        asked = bd.ask_of(request.headers, body)
        bound = self.h.wired.bound
        await bound.ask((ns, name), asked)
        async with bound.in_use((ns, name), (ns, parent) if parent else None):
            r = await self.h.wired.broker.prime(nm.Naming(ns, name, parent or None), prompt)
        refused = bound.refused.pop((ns, name), None)
        if refused is not None:
            raise StoreFull(f"stored {name!r}, but not pinned: {refused}")
        kind, n_restored = r["cache"], r["n_restored"]
        headers = {"X-KV-Cache": kind, "X-KV-Slot": str(r["id_slot"]), "X-KV-Restored-Tokens": str(n_restored)}
        if r["fork_evaluated"]:
            headers["X-KV-Fork-Evaluated"] = str(r["fork_evaluated"])
        return web.json_response(jsonable({"name": name, "namespace": ns, **r}), headers=headers)

    async def state_info(self, request: web.Request) -> web.Response:
        ns, name = _state_key(request)
        return web.json_response(jsonable(await self.h.wired.slot_api.info(ns, name)))

    async def state_delete(self, request: web.Request) -> web.Response:
        ns, name = _state_key(request)
        await self.h.wired.slot_api.delete(ns, name)
        return web.json_response({"name": name, "namespace": ns, "removed": True})

    async def state_list(self, request: web.Request) -> web.Response:
        """The caller's namespace; an admin key without `X-KV-Namespace` lists every namespace (`namespace` null)."""
        c = caller(request)
        ns = None if self.h.cfg.tenancy.enabled and c.admin and nm.NAMESPACE_HEADER not in request.headers \
            else c.namespace
        try:
            await self.h.wired.store.sync(ns)  # an S3 store: other servers' names too
        except Exception as e:  # the bucket unreachable: what this machine knows
            if not remote_unavailable(e):
                raise
        items = await self.h.wired.store.list(namespace=ns)
        return web.json_response({"namespace": ns, "states": jsonable(items)})

    async def stats(self, request: web.Request) -> web.Response:
        """Store figures and counters; a slot of another namespace shows only its id and whether busy. With keys a
        tenant's `store` figures are its own namespace's (`store_scope`): store-wide sizes would tell what others
        store. An admin, or anyone without keys, gets the whole store's."""
        h, w, c = self.h, self.h.wired, caller(request)
        sizes_of = self._sizes_of(c)
        store = await w.store.stats_or_unavailable(sizes_of)  # the bucket unreachable: slots, counters still matter
        slots = w.table.as_list(c.viewer)
        return web.json_response(jsonable({
            "upstream": w.up.url if c.admin else None,  # a tenant needs not know where llama-server listens
            "n_slots": w.n_slots, "fingerprint": w.transfer.expect(), "tenancy": h.cfg.tenancy.describe(),
            "namespace": c.namespace, "store_scope": "store" if sizes_of is None else "namespace",
            "queue_length": w.table.queue_length, "slots": slots,
            "counters": h.metrics.snapshot(), "store": store,
            # The bound's figures are the whole store's: an admin's; a tenant sees its own quota.
            "bound": w.bound.describe() if c.admin else {"quota": w.bound.quota_of(c.namespace)},
            # Restore or recompute (hooks/cost.py): rates measured on this server, all tenants' restores included.
            "cost": w.transfer.cost.describe() if c.admin else None}))

    async def status_page(self, request: web.Request) -> web.Response:
        """GET /kvstore/: the status page (`?fragment=1`: its main part, for the page's own refresh)."""
        h, w, c = self.h, self.h.wired, caller(request)
        # With keys, an admin key sees every namespace; without keys (single-tenant, every caller is trusted), the
        # operator on loopback with no key and no namespace header does; anyone else sees only their namespace.
        if h.cfg.tenancy.enabled:
            ns = c.viewer
        else:
            ns = None if page.operator_view(request.remote, request.headers) else c.namespace
        snap = {"upstream": w.up.url if ns is None else None, "n_slots": w.n_slots, "fingerprint": w.transfer.expect(),
                "queue_length": w.table.queue_length, "slots": w.table.as_list(ns),
                "slot_clock": w.table.clock(), "history": h.metrics.history.snapshot(),
                "store": await w.store.snapshot(ns, stats_namespace=self._sizes_of(c)),
                "bound": w.bound.describe() if ns is None else None}
        html = page.render_fragment(snap) if request.query.get("fragment") else page.render_page(snap, live=True)
        return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store"})

    def _sizes_of(self, c: Caller) -> Optional[str]:
        """Whose sizes a caller sees: None (the whole store) for an admin key or without keys; with keys, a
        tenant sees its namespace's only, since the store's would grow with what other tenants save."""
        return c.namespace if self.h.cfg.tenancy.enabled and not c.admin else None

    async def prometheus(self, request: web.Request) -> web.Response:
        try:
            store = await self.h.wired.store.stats(self._sizes_of(caller(request)))
        except Exception:  # noqa: BLE001 - the counters are still worth showing
            store = None
        text = self.h.metrics.prometheus(queue_length=self.h.wired.table.queue_length, store=store,
                                         bucket_requests=self.h.wired.store.bucket_requests())
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-KV-Note": "kvstore metrics; llama-server's own are at its /metrics"})

    async def slot_action(self, request: web.Request) -> web.StreamResponse:
        """Raw slot API: save ingests into the store, restore materializes first, erase marks the slot empty."""
        action = request.query.get("action")
        if action not in ("save", "restore", "erase"):
            raise BadRequest("`action` must be one of save, restore, erase")
        try:
            slot_id = int(request.match_info["id"])
        except ValueError:
            raise BadRequest(f"slot id {request.match_info['id']!r} is not an integer") from None
        w = self.h.wired
        n = w.n_slots
        if not 0 <= slot_id < n:
            raise BadRequest(f"slot id {slot_id} out of range: this server has {n} slot(s), 0..{n - 1}")
        body = await _json_body(request, allow_empty=True)
        c = caller(request)
        if action == "erase":
            return web.json_response(await w.slot_api.erase(slot_id, c))
        given = body.get("filename") if isinstance(body, dict) else None
        if given is None:
            raise BadRequest("body needs a `filename`: the name to save or restore")
        name = nm.validate(given, "name")
        if action == "save":
            r = await w.slot_api.save_raw(slot_id, c, name)
            info, save = r["info"], r["info"].get("save") or {}
            return web.json_response({
                "id_slot": slot_id, "filename": name, "n_saved": save.get("n_saved", 0),
                "n_written": save.get("n_written", 0), "timings": {"save_ms": _ms(r["seconds"])},
                "kvstore": jsonable({**{k: v for k, v in info.items() if k != "save"}, "namespace": c.namespace})})
        r = await w.slot_api.restore_raw(slot_id, c, name)
        reply = r["reply"]
        info = reply.get("kvstore") or {}
        return web.json_response({
            "id_slot": slot_id, "filename": name, "n_restored": reply.get("n_restored", 0),
            "n_read": reply.get("n_read", info.get("file_bytes", 0)), "timings": {"restore_ms": _ms(r["seconds"])},
            "kvstore": jsonable({**info, "namespace": c.namespace})})

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        return await self.h.wired.up.forward(request, request.path)

    async def lora_scales(self, request: web.Request) -> web.StreamResponse:
        raise NotSupported(f"POST {request.path} is not served through kvstore: changing the adapters' scales at run "
                           "time would change what every kept state was evaluated with, unseen by the states' "
                           "fingerprint; restart llama-server with the adapters (--lora) at the scales it should apply")

    async def slot_clobbering(self, request: web.Request) -> web.StreamResponse:
        raise NotSupported(f"POST {request.path} is not served through kvstore: llama-server computes embeddings and "
                           "rerankings in a slot it picks itself, discarding the state kept there; send them to a "
                           "llama-server of their own (started with --embeddings or --reranking)")


def _evaluated_nothing(tokens: Optional[list[int]], seen: "_Tee") -> bool:
    """An empty prompt: llama-server answers it with nothing evaluated and nothing generated, and leaves the slot's
    cells as they were (marked evaluated, a named request's slot would be saved under its name with what another
    request left there: measured, another name's 64 tokens)."""
    if tokens != [] or not seen.started:
        return False
    timings = seen.timings() or {}
    return not timings.get("prompt_n") and not timings.get("predicted_n")


def _require_prompt(path: str, body: dict) -> None:
    """What llama-server refuses at once, before a slot is taken for it: no prompt (a completion), no list of
    messages (a chat). Such a request would otherwise wait in the queue for a slot, only to be refused there."""
    if path in COMPLETION_PATHS and "prompt" not in body:
        raise BadRequest("`prompt` is required: a string, a list of token ids, or a list of those")
    if path in CHAT_PATHS and not isinstance(body.get("messages"), list):
        raise BadRequest("`messages` is required: a list of {role, content} messages")


def _refuse_unservable(body: dict) -> None:
    """Refuse `n`/`n_cmpl` above 1: llama-server runs the extra completions of a prompt in other slots it picks itself
    (any it is not decoding in), copying this request's state over what they hold, then clears them: a state the
    hooks keep there (another user's unsaved turn, a slot leased to another request) would be lost. Refuse a
    per-request `lora`: the KV it evaluates depends on the adapters' scales, which no state records (the server's
    own adapters are part of the fingerprint); llama-server itself reuses cells across scales (measured)."""
    if body.get("lora"):
        raise BadRequest("`lora`: per-request LoRA adapters are not served through kvstore (a state evaluated with "
                         "them would be stored and restored as the server's); start llama-server with the adapters "
                         "it should apply (--lora): they are part of the states' fingerprint")
    for field in ("n", "n_cmpl"):
        value = body.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1:
            raise BadRequest(f"`{field}`: {value}: several completions per request are not served through kvstore "
                             "(llama-server would run them in other slots, over the states kept there); send the "
                             "request that many times (e.g. with different `seed`s)")


async def _json_body(request: web.Request, *, allow_empty: bool = False) -> Json:
    raw = await request.read()
    if allow_empty and not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        raise BadRequest("request body is not valid JSON") from None
    except RecursionError:  # the one place where a client's nesting depth meets Python's stack
        raise BadRequest("request body is nested too deeply") from None


def _state_key(request: web.Request) -> tuple[str, str]:
    """(namespace, name) of a /kvstore/states/{name} request; raises BadName."""
    return caller(request).namespace, nm.validate(request.match_info["name"], "name")


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class ReplyCut(Exception):
    """llama-server failed after the reply's headers were sent (`upstream.CUT`)."""


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
            return llama.timings_of(json.loads(bytes(self.buf)))
        except ValueError:
            return None


def jsonable(x: object) -> Json:
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, bytes):
        return x.hex()
    return str(x)
