"""The store as the proxy sees it: every call to the compiled core runs in a worker thread (`asyncio.to_thread`).

Contract: the same calls as `kvstore.Store`, awaitable. The core releases the GIL while it works, so the event loop keeps serving other requests during an ingest or a
materialize. This is the proxy's only way to the store; it adds no logic of its own but counting the calls that
failed because an S3 store's bucket was unreachable (`on_remote_failure`, for /metrics), and ordering reads after
the write-behind saves (`behind`, hooks/behind.py): a call about a name waits for that name's pending ingest (and
its parent's), a listing or a total for every pending ingest. A prefix lookup, an eviction and gc do not wait (a
pending state is not yet stored: it is nobody's prefix and nothing to evict).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any, Callable, Mapping, Optional, Sequence

from kvstore.errors import error_message

from .behind import WriteBehind
from .errors import remote_unavailable


class AsyncStore:
    """`await AsyncStore.open(path)`; the same methods as `kvstore.Store`, awaitable."""

    def __init__(self, store: Any, on_remote_failure: Optional[Callable[[], None]] = None):
        self.core = store
        self.on_remote_failure = on_remote_failure
        self.behind: Optional[WriteBehind] = None  # set by the hooks when saves are written behind
        # Saves and removals of each name this process started, those under way, and evictions: `changes`.
        self._changed: dict[tuple[str, str], int] = {}
        self._changing_now: collections.Counter = collections.Counter()
        self._evictions = 0

    def changes(self, namespace: str, name: str) -> Optional[tuple[int, int]]:
        """A mark that moves whenever this process saves or removes the name, or evicts anything; None while such
        a change is under way. A state read between two equal marks is the name's current one as far as this
        process wrote it."""
        if self._changing_now[(namespace, name)] or self._changing_now[None]:
            return None
        return self._changed.get((namespace, name), 0), self._evictions

    @contextlib.contextmanager
    def _changing(self, key: Optional[tuple[str, str]]):
        """A change of one name (or, None, of any) by this process, counted from its start to its end."""
        self._changing_now[key] += 1
        try:
            yield
        finally:
            self._changing_now[key] -= 1
            if key is None:
                self._evictions += 1
            else:
                self._changed[key] = self._changed.get(key, 0) + 1

    async def settled(self, namespace: str, *names: Optional[str]) -> None:
        """Until no write-behind save of these names is pending."""
        if self.behind is not None:
            for name in names:
                if name is not None:
                    await self.behind.settled((namespace, name))

    async def settled_namespace(self, namespace: str) -> None:
        """Until no write-behind save of the namespace is pending (before a prefix lookup that must see them)."""
        if self.behind is not None:
            await self.behind.settled_namespace(namespace)

    async def drained(self) -> None:
        """Until no write-behind save is pending."""
        if self.behind is not None:
            await self.behind.drain()

    async def _call(self, fn: Callable, *args: Any, **kw: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kw)
        except Exception as e:
            if self.on_remote_failure is not None and remote_unavailable(e):
                self.on_remote_failure()
            raise

    @classmethod
    async def open(cls, location: Any) -> "AsyncStore":
        """`location`: a `kvstore.config.Location` (a directory or an S3 bucket with its cache)."""
        return cls(await asyncio.to_thread(location.open))

    @property
    def block_size(self) -> int:
        return int(self.core.block_size)

    async def ingest(self, name: str, path: str, *, namespace: str, fingerprint: Mapping[str, str],
                     parent: Optional[str] = None) -> dict:
        """Store the file (removed once stored) under (namespace, name). It is the server's own save, so a
        layout unlike the namespace's earlier states (the server restarted with another cache type) is stored:
        `force` skips only that comparison, never the completeness check against the model's layer count."""
        await self.settled(namespace, name, parent)
        with self._changing((namespace, name)):
            return await self._call(self.core.ingest, name, path, namespace=namespace, fingerprint=fingerprint,
                                    parent=parent, remove_file=True, force=True)

    async def materialize(self, name: str, path: str, *, namespace: str, expect: Mapping[str, str],
                          n_stream: int) -> dict:
        await self.settled(namespace, name)
        return await self._call(self.core.materialize, name, path, namespace=namespace, expect=expect,
                                       n_stream=n_stream)

    async def materialize_manifest(self, manifest_id: str, path: str, *, expect: Mapping[str, str],
                                   n_stream: int) -> dict:
        return await self._call(self.core.materialize_manifest, manifest_id, path, expect=expect,
                                       n_stream=n_stream)

    async def materialize_prefix(self, name: Optional[str], n_tokens: int, path: str, *, namespace: str,
                                 manifest_id: Optional[str], expect: Mapping[str, str], n_stream: int,
                                 fill_masked: int) -> dict:
        await self.settled(namespace, name)
        return await asyncio.to_thread(self.core.materialize_prefix, name, n_tokens, path, namespace=namespace,
                                       manifest_id=manifest_id, expect=expect, n_stream=n_stream,
                                       fill_masked=fill_masked)

    async def tokens(self, name: str, *, namespace: str) -> list[int]:
        await self.settled(namespace, name)
        return await asyncio.to_thread(self.core.tokens, name, namespace=namespace)

    async def lookup(self, tokens: Sequence[int], *, namespace: str, fingerprint: Mapping[str, str],
                     whole: bool = False) -> Optional[dict]:
        return await self._call(self.core.lookup, tokens, namespace=namespace, fingerprint=fingerprint, whole=whole)

    async def get(self, name: str, *, namespace: str) -> Optional[dict]:
        await self.settled(namespace, name)
        return await self._call(self.core.get, name, namespace=namespace)

    async def held(self, name: str, *, namespace: str) -> bool:
        """Whether this machine's index names the state (no request to a bucket; see `_core.Store.held`)."""
        await self.settled(namespace, name)
        return await self._call(self.core.held, name, namespace=namespace)

    @property
    def remote(self) -> Optional[str]:
        """`s3://bucket/prefix` of an S3 store, else None."""
        return getattr(self.core, "remote", None)

    async def sync(self, namespace: Optional[str] = None) -> Optional[dict]:
        """An S3 store: bring the local index up to date with the names in the bucket (other servers' saves)."""
        if not self.remote:
            return None
        return await self._call(self.core.sync, namespace)

    async def list(self, *, namespace: Optional[str]) -> list:
        await self.drained()
        return await self._call(self.core.list, namespace=namespace)

    async def remove(self, name: str, *, namespace: str) -> bool:
        await self.settled(namespace, name)
        with self._changing((namespace, name)):
            return await self._call(self.core.remove, name, namespace=namespace)

    def bucket_requests(self) -> Optional[dict]:
        """Requests sent to an S3 store's bucket so far, by kind (None: a local store); sends none, so not queued."""
        return self.core.bucket_requests()

    async def stats(self, namespace: Optional[str] = None) -> dict:
        """The store's figures, or (`namespace`) that namespace's only: what a tenant may see of the store."""
        await self.drained()
        if namespace is None:
            return await self._call(self.core.stats)
        return await self._call(self.core.stats, namespace=namespace)

    async def evict(self, *, max_bytes: Optional[int], low_water: float, quotas: Mapping[str, int],
                    protect: Sequence[tuple[str, str]], dry_run: bool = False,
                    ceiling_bytes: Optional[int] = None) -> dict:
        with self._changing(None):
            return await self._call(self.core.evict, max_bytes=max_bytes, low_water=low_water, quotas=dict(quotas),
                                    protect=list(protect), dry_run=dry_run, ceiling_bytes=ceiling_bytes)

    async def set_retention(self, name: str, *, namespace: str, ttl_seconds: Optional[float], pinned: bool,
                            max_bytes: Optional[int] = None) -> None:
        await self.settled(namespace, name)
        await self._call(self.core.set_retention, name, namespace, ttl_seconds=ttl_seconds, pinned=pinned,
                         max_bytes=max_bytes)

    async def stats_or_unavailable(self, namespace: Optional[str] = None) -> dict:
        """`stats()` plus `"unavailable": message` while an S3 store's bucket is unreachable: what /kvstore/stats
        and the status page show, so both degrade the same way. The core's stats degrade by themselves (the
        index's sizes, `bucket_objects` None when the bucket could not be listed); only then is the bucket asked
        once more, by a sync, for the error that says why (bounded by the core's timeout, as every call is)."""
        try:
            stats = dict(await self.stats(namespace))
        except Exception as e:
            if not remote_unavailable(e):
                raise
            return {"unavailable": error_message(e)}
        if self.remote and namespace is None and stats.get("bucket_objects") is None:
            try:
                await self.sync(None)
            except Exception as e:
                if not remote_unavailable(e):
                    raise
                stats["unavailable"] = error_message(e)
        return stats

    async def snapshot(self, namespace: Optional[str], *, stats_namespace: Optional[str] = None) -> dict:
        """The status page's store part (`kvstore.page.store_snapshot`), one namespace or (None) all, with the
        sizes of the whole store or (`stats_namespace`) of that namespace only; with the bucket unreachable, the
        names the local index holds and `stats` {"unavailable": message}."""
        from kvstore.page import store_snapshot

        stats = await self.stats_or_unavailable(stats_namespace)
        await self.drained()
        return await self._call(store_snapshot, self.core, namespace, stats=stats, stats_namespace=stats_namespace)
