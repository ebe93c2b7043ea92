"""Write-behind: a displaced slot's state is ingested after its slot has been handed to the next request.

Why: once llama-server has written a slot's state to a sync-dir file, the state is safe in that file, and the slot
can take another state at once. The ingest (hashing, compression, fsyncs, the index's commit) then runs beside the
next request instead of before it. No aiohttp.

Contract: `start(key, after, job)` runs `job()` once every earlier pending job of `key` and of the keys in `after`
(the state's parent) has ended, whatever its outcome, so the saves of one name commit in the order they were made.
At most `limit` jobs are pending: a further `start` first waits for room, which bounds the sync-dir files waiting
to be ingested. A job reports its own failure (logged here as well, never raised to anyone else).
`settled(key)` returns once `key` has no pending job, `settled_namespace(ns)` once no job of that namespace is,
and `drain()` once no job is pending. Both return at once
inside a job, whose order was fixed when it started (a wait there could be a cycle: two names each the other's
parent). Readers of a name call `settled` first, so nobody reads an older state of a name than the newest saved,
and a name removed while its ingest ran does not come back.

A pending state lives in its sync-dir file and the record beside it (`SyncDir.keep_pending`): a crash before its
ingest commits leaves both, and the next start-up ingests it (`transfer.recover_pending`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable

log = logging.getLogger("kvstore.hooks")

Key = tuple[str, str]


class WriteBehind:
    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self._newest: dict[Key, asyncio.Task] = {}  # the newest pending job of each key
        self._jobs: set[asyncio.Task] = set()

    @property
    def pending(self) -> int:
        return sum(not t.done() for t in self._jobs)

    def _in_job(self) -> bool:
        return asyncio.current_task() in self._jobs

    async def start(self, key: Key, after: Iterable[Key], job: Callable[[], Awaitable[object]]) -> asyncio.Task:
        """Schedule `job` behind the pending jobs of `key` and `after`; returns its task."""
        while self.pending >= self.limit:
            await asyncio.wait({t for t in self._jobs if not t.done()}, return_when=asyncio.FIRST_COMPLETED)
        before = [t for k in (key, *after) if (t := self._newest.get(k)) is not None]
        task = asyncio.ensure_future(self._run(before, job))
        self._newest[key] = task
        self._jobs.add(task)
        task.add_done_callback(lambda t: self._ended(key, t))
        return task

    @staticmethod
    async def _run(before: list[asyncio.Task], job: Callable[[], Awaitable[object]]) -> object:
        if before:
            await asyncio.wait(before)
        return await job()

    def _ended(self, key: Key, task: asyncio.Task) -> None:
        self._jobs.discard(task)
        if self._newest.get(key) is task:
            del self._newest[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("write-behind save of %s/%s failed; the name keeps its previous state: %s", key[0], key[1],
                      task.exception())

    async def settled(self, key: Key) -> None:
        """Until `key` has no pending job (a job started meanwhile is waited for too)."""
        if self._in_job():
            return
        while (task := self._newest.get(key)) is not None and not task.done():
            await asyncio.wait([task])

    async def settled_namespace(self, namespace: str) -> None:
        """Until no job of the namespace is pending."""
        if self._in_job():
            return
        while waiting := [t for k, t in self._newest.items() if k[0] == namespace and not t.done()]:
            await asyncio.wait(waiting)

    async def drain(self) -> None:
        """Until no job is pending."""
        if self._in_job():
            return
        while self.pending:
            await asyncio.wait({t for t in self._jobs if not t.done()})
