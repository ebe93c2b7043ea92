"""WriteBehind (hooks/behind.py): the order of ingests run behind, the bound on pending ones, and readers waiting.

Pure asyncio: the jobs here are coroutines that record what ran when. The real server's path (a displaced state
saved behind the request that displaced it, then read back) is in test_hooks_users.py."""
from __future__ import annotations

import asyncio
import logging

import pytest

from kvstore.hooks.behind import WriteBehind


def run(coro):
    return asyncio.run(coro)


def test_jobs_of_one_name_and_its_parent_run_in_the_order_they_were_started():
    async def main():
        wb, log = WriteBehind(limit=8), []
        gate = asyncio.Event()

        def job(tag, wait=False):
            async def go():
                if wait:
                    await gate.wait()
                log.append(tag)
            return go

        await wb.start(("ns", "a"), [], job("a1", wait=True))
        await wb.start(("ns", "a"), [], job("a2"))
        await wb.start(("ns", "b"), [("ns", "a")], job("b-child-of-a"))
        await wb.start(("ns", "c"), [], job("c"))
        await asyncio.sleep(0.01)
        assert log == ["c"]  # independent of a; a2 and b wait behind a1
        gate.set()
        await wb.drain()
        assert log == ["c", "a1", "a2", "b-child-of-a"]
        assert wb.pending == 0

    run(main())


def test_a_reader_of_a_name_waits_for_its_pending_job_and_not_for_others():
    async def main():
        wb = WriteBehind(limit=8)
        gate_a, gate_b = asyncio.Event(), asyncio.Event()
        done = []

        async def a():
            await gate_a.wait()
            done.append("a")

        async def b():
            await gate_b.wait()
            done.append("b")

        await wb.start(("ns", "a"), [], a)
        await wb.start(("other", "b"), [], b)
        reader = asyncio.ensure_future(wb.settled(("ns", "a")))
        await asyncio.sleep(0.01)
        assert not reader.done()
        gate_a.set()
        await asyncio.wait_for(reader, 1)
        assert done == ["a"]  # b still pending: the reader of a did not wait for it
        await asyncio.wait_for(wb.settled(("ns", "nothing-pending")), 1)
        ns_reader = asyncio.ensure_future(wb.settled_namespace("other"))
        await asyncio.sleep(0.01)
        assert not ns_reader.done()
        gate_b.set()
        await asyncio.wait_for(ns_reader, 1)
        assert done == ["a", "b"]

    run(main())


def test_start_waits_for_room_beyond_the_limit():
    async def main():
        wb = WriteBehind(limit=2)
        gates = [asyncio.Event() for _ in range(3)]

        def job(i):
            async def go():
                await gates[i].wait()
            return go

        await wb.start(("ns", "x0"), [], job(0))
        await wb.start(("ns", "x1"), [], job(1))
        third = asyncio.ensure_future(wb.start(("ns", "x2"), [], job(2)))
        await asyncio.sleep(0.01)
        assert not third.done() and wb.pending == 2
        gates[1].set()
        await asyncio.wait_for(third, 1)
        assert wb.pending == 2
        for g in gates:
            g.set()
        await wb.drain()
        assert wb.pending == 0

    run(main())


def test_inside_a_job_reads_do_not_wait_so_two_names_each_the_others_parent_do_not_deadlock():
    async def main():
        wb = WriteBehind(limit=8)
        gate = asyncio.Event()
        seen = []

        async def a():
            await gate.wait()
            await wb.settled(("ns", "b"))  # b is started after a and waits for a: waiting here would be a cycle
            await wb.drain()
            seen.append("a")

        async def b():
            await wb.settled(("ns", "a"))
            seen.append("b")

        await wb.start(("ns", "a"), [("ns", "b")], a)
        await wb.start(("ns", "b"), [("ns", "a")], b)
        gate.set()
        await asyncio.wait_for(wb.drain(), 2)
        assert seen == ["a", "b"]

    run(main())


def test_a_failed_job_is_logged_and_readers_go_on(caplog):
    async def main():
        wb = WriteBehind(limit=8)

        async def bad():
            raise OSError("disk full")

        ran = []

        async def after():
            ran.append(True)

        await wb.start(("ns", "a"), [], bad)
        await wb.start(("ns", "a"), [], after)  # the next save of the name still runs
        await asyncio.wait_for(wb.settled(("ns", "a")), 1)
        assert ran == [True]

    with caplog.at_level(logging.ERROR, logger="kvstore.hooks"):
        run(main())
    assert any("ns/a failed" in r.getMessage() and "disk full" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("limit", [0, -3])
def test_a_limit_below_one_still_lets_one_job_run(limit):
    async def main():
        wb = WriteBehind(limit=limit)
        ran = []

        async def job():
            ran.append(1)

        await wb.start(("ns", "a"), [], job)
        await wb.drain()
        assert ran == [1]

    run(main())


def test_states_a_crash_left_pending_are_stored_at_start_up(tmp_path, state_files):
    """What a save behind a request leaves until its ingest commits (the state file llama-server wrote and its
    `.pending.json` record) is ingested by the next start-up, each name's newest, on a real store with real slot files;
    a name the store already holds in a state made after the pending save keeps it; a record that cannot be read
    is dropped; nothing is left in the sync dir."""
    import shutil
    import time

    from kvstore import Store
    from kvstore.config import temp_state_name
    from kvstore.hooks.store import AsyncStore
    from kvstore.hooks.syncdir import PENDING_SUFFIX, SyncDir
    from kvstore.hooks.transfer import recover_pending

    core = Store(str(tmp_path / "store"))
    sync = SyncDir(tmp_path / "sync")
    parent, child = state_files["smollm2_parent"], state_files["smollm2_child"]

    def leave(src, name, saved_at, parent_name=None):
        fn = temp_state_name()
        shutil.copyfile(src, sync.path / fn)
        sync.keep_pending(fn, {"namespace": "ns", "name": name, "parent": parent_name, "fingerprint": {},
                               "saved_at": saved_at})

    now = time.time()
    leave(parent, "alice", now - 5)
    leave(child, "alice", now - 4)  # alice's newer save: the one stored
    leave(parent, "kept", now - 60)
    core.ingest("kept", str(child), namespace="ns")  # made after that pending save: it stays
    leave(child, "orphan", now - 3, parent_name="gone")  # its parent is not stored: stored without it
    (sync.path / (temp_state_name() + PENDING_SUFFIX)).write_text("{not json")
    bad = temp_state_name()
    shutil.copyfile(parent, sync.path / bad)
    (sync.path / (bad + PENDING_SUFFIX)).write_text('{"version": 1, "name": 7}')

    stored = run(recover_pending(sync, AsyncStore(core)))
    assert stored == 2  # alice (its newest save) and orphan; kept keeps its later state
    assert core.get("alice", namespace="ns")["file_bytes"] == child.stat().st_size
    assert core.get("kept", namespace="ns")["file_bytes"] == child.stat().st_size
    assert core.get("orphan", namespace="ns")["parent"] is None
    assert sorted(s["name"] for s in core.list(namespace="ns")) == ["alice", "kept", "orphan"]
    sync.sweep()  # the start-up's sweep: the bad record's state file (no longer claimed) goes too
    assert list(sync.path.iterdir()) == []
