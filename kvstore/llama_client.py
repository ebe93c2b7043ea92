"""The synchronous llama-server client (httpx, as the proxy's async one): a transport over `kvstore.llama`.

Contract: used by `kvstore.save`/`kvstore.restore` and the CLI. It talks to a plain `llama-server` or to a `kvstore serve`
proxy in front of one (`is_kvstore()` tells them apart). Request shapes, tokenize semantics and error bodies are
`kvstore.llama`'s; this module sends them and raises `ServerError`. Every slot id is checked against the server's
slot count first (llama-server silently wraps a wrong one).
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional

import httpx

from kvstore import llama
from kvstore import config
from kvstore.config import server_url
from kvstore.errors import ServerError
from kvstore.fingerprint import server_fingerprint

DEFAULT_TIMEOUT = 600.0  # seconds: a save/restore of a large slot or a long prompt evaluation can take minutes
PROBE_TIMEOUT = 5.0



class LlamaServer:
    """`LlamaServer(url=None, timeout=600, api_key=None)`; url: argument, else `$KVSTORE_SERVER`, else
    http://127.0.0.1:8080. api_key: argument, else `$KVSTORE_API_KEY`: sent as `Authorization: Bearer` (a
    `kvstore serve` tenant key, or a plain llama-server's own --api-key)."""

    def __init__(self, url: Optional[str] = None, *, timeout: float = DEFAULT_TIMEOUT,
                 headers: Optional[Mapping[str, str]] = None, api_key: Optional[str] = None):
        self.url = server_url(url)
        self.timeout = timeout
        self.headers = dict(headers or {})
        key = config.api_key(api_key)
        if key and "Authorization" not in self.headers:
            self.headers["Authorization"] = f"Bearer {key}"
        self._props: Optional[dict] = None

    def __repr__(self) -> str:
        return f"LlamaServer({self.url!r})"

    # -- transport ---------------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, *, timeout: Optional[float] = None,
                headers: Optional[Mapping[str, str]] = None) -> Any:
        """Send one request; return the decoded JSON reply (None for an empty body). Raises ServerError."""
        url = self.url + path
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Accept": "application/json", **self.headers, **(headers or {})}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        try:
            # One connection per call (as before); `timeout` bounds connecting and each read and write.
            r = httpx.request(method, url, content=data, headers=hdrs, follow_redirects=True,
                              timeout=self.timeout if timeout is None else timeout)
        except (httpx.HTTPError, OSError) as e:
            reason = str(e) or type(e).__name__
            raise ServerError(f"{method} {url}: server unreachable ({reason}); is llama-server running there?",
                              url=url, detail=reason) from None
        raw = r.content
        if r.status_code >= 400:
            detail = llama.error_text(raw) if raw else r.reason_phrase
            raise ServerError(f"{method} {url}: HTTP {r.status_code}: {detail}", url=url, status=r.status_code,
                              detail=str(detail)) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ServerError(f"{method} {url}: reply is not JSON: {raw[:200]!r}", url=url, status=200,
                              detail="not JSON") from None

    def get(self, path: str, **kw) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw) -> Any:
        return self.request("POST", path, {} if body is None else body, **kw)

    # -- server facts ------------------------------------------------------------------------------------------
    def props(self, *, refresh: bool = False) -> dict:
        """GET /props (cached: slot count, context size and model do not change while a server runs)."""
        if self._props is None or refresh:
            self._props = self.get(llama.PROPS) or {}
        return self._props

    def models(self) -> dict:
        """GET /v1/models ({} when the server does not offer it)."""
        try:
            return self.get(llama.MODELS) or {}
        except ServerError as e:
            if e.status is not None and e.status in (404, 501):
                return {}
            raise

    def lora_adapters(self) -> list:
        """GET /lora-adapters ([] when the server does not offer it: an older build, or a kvstore proxy)."""
        try:
            reply = self.get(llama.LORA_ADAPTERS)
        except ServerError as e:
            if e.status is not None and e.status in (403, 404, 501):
                return []
            raise
        return reply if isinstance(reply, list) else []

    def slots(self) -> list:
        """GET /slots (needs llama-server's slots endpoint, on by default)."""
        return self.get(llama.SLOTS) or []

    def n_slots(self) -> int:
        """The number of slots (`--parallel`)."""
        props = self.props()
        n = llama.n_slots(props)
        if not n:
            n = len(self.slots())
        if not n:
            raise ServerError(f"GET {self.url}/props: the server reports no slots", url=self.url)
        return int(n)

    def n_ctx_slot(self) -> int:
        """The context size of one slot (`-c` / `--parallel`)."""
        n = llama.n_ctx_slot(self.props())
        if not n:
            slots = self.slots()
            n = slots[0].get("n_ctx") if slots else None
        if not n:
            raise ServerError(f"GET {self.url}/props: the server reports no slot context size", url=self.url)
        return int(n)

    def fingerprint(self) -> dict[str, str]:
        """What this server's states are bound to (kvstore.fingerprint.server_fingerprint)."""
        return server_fingerprint(self.props(), self.models(), adapters=self.lora_adapters())

    def is_kvstore(self) -> bool:
        """True when this URL is a `kvstore serve` proxy (GET /kvstore/stats answers 200 with JSON)."""
        try:
            doc = self.get("/kvstore/stats", timeout=PROBE_TIMEOUT)
        except ServerError:
            return False
        return isinstance(doc, dict)

    # -- slots -------------------------------------------------------------------------------------------------
    def check_slot(self, slot: int) -> int:
        """Return `slot` if it is a valid slot id of this server, else raise ValueError (never rely on the wrap)."""
        if isinstance(slot, str) and slot.strip().isdigit():
            slot = int(slot)
        if isinstance(slot, bool) or not isinstance(slot, int):
            raise ValueError(f"slot id must be an integer, got {slot!r}")
        n = self.n_slots()
        if not 0 <= slot < n:
            raise ValueError(f"slot {slot} does not exist: {self.url} has {n} slot(s), ids 0..{n - 1}")
        return slot

    def slot_action(self, slot: int, action: str, filename: Optional[str] = None, *, headers=None) -> dict:
        """POST /slots/{slot}?action=...; replies as in `kvstore.llama.slot_body`."""
        slot = self.check_slot(slot)
        return self.post(llama.slot_path(slot, action), llama.slot_body(filename), headers=headers) or {}

    def save_slot(self, slot: int, filename: str, *, headers=None) -> dict:
        return self.slot_action(slot, "save", filename, headers=headers)

    def restore_slot(self, slot: int, filename: str, *, headers=None) -> dict:
        """A failed restore leaves the slot empty (llama-server clears it)."""
        return self.slot_action(slot, "restore", filename, headers=headers)

    def erase_slot(self, slot: int) -> dict:
        return self.slot_action(slot, "erase")

    # -- text --------------------------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """`text`'s tokens as llama-server evaluates it as a prompt; add_special=False for a continuation."""
        return llama.tokens_of(self.post(llama.TOKENIZE, llama.tokenize_request(text, add_special=add_special)))

    def completion(self, prompt: Any, **params) -> dict:
        """POST /completion (non-streaming) with the given parameters."""
        return self.post(llama.COMPLETION, llama.completion_request(prompt, **params)) or {}


__all__ = ["LlamaServer", "ServerError", "DEFAULT_TIMEOUT"]
