"""Who is calling: API keys -> namespaces (`Tenancy`), and the `Caller` a request is served as. No aiohttp.web.

Contract: without keys the server is single-tenant: every client is trusted, `X-KV-Namespace` (else a hash of the
client's key) only labels states. With keys (`--api-key`, `--api-key-file`, `--admin-api-key`) a request needs
`Authorization: Bearer KEY`, or `X-Api-Key: KEY` as Anthropic's clients send it (`llama.api_key_of`, as llama-server
reads them; 401 otherwise); its namespace is the key's, `X-KV-Namespace` naming another one is 403 unless the key
may set it (`--allow-namespace-header`, or `namespace-header` in the key file); an admin key sees and may touch
every namespace. Key file format (docs/hooks.md): one key per line, `KEY [NAMESPACE|-] [FLAG,...]`, flags
`admin`, `namespace-header` and `quota=SIZE` (the namespace's share of the store, hooks/bound.py); `#` starts a
comment.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional

from kvstore import llama
from kvstore.config import LocationError, parse_size

from .errors import BadRequest, Forbidden, Unauthorized
from .naming import NAMESPACE_HEADER, validate

FLAGS = ("admin", "namespace-header", "quota=SIZE")


def key_namespace(key: str) -> str:
    """A key's default namespace: `key-<16 hex>` (the key itself is never shown)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class Caller:
    namespace: str
    admin: bool = False
    may_set_namespace: bool = False

    @property
    def viewer(self) -> Optional[str]:
        """Whose slots and states this caller sees: None (everything) for an admin, else its namespace."""
        return None if self.admin else self.namespace

    def may_touch(self, namespace: Optional[str]) -> bool:
        """May this caller see or change content of `namespace` (None: nobody's)?"""
        return self.admin or namespace is None or namespace == self.namespace


@dataclass(frozen=True)
class KeyEntry:
    namespace: str
    admin: bool = False
    namespace_header: bool = False
    quota: Optional[int] = None  # bytes the namespace may keep in the store


class Tenancy:
    """The keys a server accepts; `caller(headers)` decides who a request is."""

    def __init__(self, entries: Optional[Mapping[str, KeyEntry]] = None, *, allow_namespace_header: bool = False):
        self._by_digest = {_digest(k): e for k, e in (entries or {}).items()}
        self.allow_namespace_header = allow_namespace_header

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    def quotas(self) -> dict[str, int]:
        """namespace -> bytes, from the keys' `quota=SIZE` (two keys of one namespace: the smaller)."""
        out: dict[str, int] = {}
        for e in self._by_digest.values():
            if e.quota is not None:
                out[e.namespace] = min(e.quota, out.get(e.namespace, e.quota))
        return out

    def describe(self) -> dict:
        if not self.enabled:
            return {"mode": "single-tenant", "note": "no API keys: every client is trusted and may use any namespace"}
        return {"mode": "keys", "n_keys": len(self._by_digest),
                "namespace_header": "allowed" if self.allow_namespace_header else "per key"}

    def caller(self, headers: Mapping[str, str]) -> Caller:
        key = llama.api_key_of(headers)
        header_ns = headers.get(NAMESPACE_HEADER)
        if not self.enabled:  # single-tenant: the namespace is only a label
            if header_ns:
                return Caller(validate(header_ns, "namespace"), admin=True, may_set_namespace=True)
            return Caller(key_namespace(key) if key else "", admin=True, may_set_namespace=True)
        entry = self._by_digest.get(_digest(key)) if key else None
        if entry is None:
            raise Unauthorized("invalid or missing API key: send `Authorization: Bearer KEY` (or `X-Api-Key: KEY`)")
        may_set = entry.admin or entry.namespace_header or self.allow_namespace_header
        ns = entry.namespace
        if header_ns:
            validate(header_ns, "namespace")
            if header_ns != ns and not may_set:
                raise Forbidden(f"this key may not use {NAMESPACE_HEADER}: {header_ns!r}")
            ns = header_ns
        return Caller(ns, admin=entry.admin, may_set_namespace=may_set)


def parse_key_file(text: str, source: str = "key file") -> dict[str, KeyEntry]:
    """`KEY [NAMESPACE|-] [FLAG,...]` per line; raises ValueError naming the line."""
    out: dict[str, KeyEntry] = {}
    for i, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 3:
            raise ValueError(f"{source}:{i}: expected `KEY [NAMESPACE|-] [FLAG,...]`, got {len(parts)} fields")
        key = parts[0]
        ns = parts[1] if len(parts) > 1 and parts[1] != "-" else key_namespace(key)
        flags = [f for f in (parts[2].split(",") if len(parts) > 2 else []) if f]
        quota = None
        for f in [f for f in flags if f.startswith("quota=")]:
            try:
                quota = parse_size(f[len("quota="):], "quota")
            except LocationError as e:
                raise ValueError(f"{source}:{i}: {e}") from None
            flags.remove(f)
        bad = [f for f in flags if f not in FLAGS]
        if bad:
            raise ValueError(f"{source}:{i}: unknown flag(s) {bad}; known: {', '.join(FLAGS)}")
        try:
            validate(ns, "namespace")
        except BadRequest as e:
            raise ValueError(f"{source}:{i}: {e}") from None
        if key in out:
            raise ValueError(f"{source}:{i}: key given twice")
        out[key] = KeyEntry(ns, admin="admin" in flags, namespace_header="namespace-header" in flags, quota=quota)
    return out


def tenancy_from(api_keys: Iterable[str] = (), api_key_files: Iterable[str] = (), admin_keys: Iterable[str] = (),
                 *, allow_namespace_header: bool = False) -> Tenancy:
    """The `kvstore serve` flags as a Tenancy; raises ValueError for a bad key file."""
    entries: dict[str, KeyEntry] = {}
    for f in api_key_files:
        entries.update(parse_key_file(Path(f).read_text(), str(f)))
    for k in api_keys:
        entries.setdefault(k, KeyEntry(key_namespace(k)))
    for k in admin_keys:
        entries[k] = KeyEntry(entries[k].namespace if k in entries else key_namespace(k), admin=True)
    if any(not k or any(c.isspace() for c in k) for k in entries):
        raise ValueError("an API key must be non-empty and without whitespace")
    return Tenancy(entries, allow_namespace_header=allow_namespace_header)
