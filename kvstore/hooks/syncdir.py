"""The sync directory (llama-server's --slot-save-path): files named by us, removed after use; nothing else stays.

Contract: file names come from `kvstore.config.temp_state_name` (the one home of the `.kv-` naming), never from a state name.
A state file whose ingest runs behind a request (hooks/behind.py) has a record beside it, `<file>.pending.json`
(`keep_pending`): its name, namespace, parent and fingerprint, so that a start-up after a crash can still ingest
it (`pending_saves`, `transfer.recover_pending`) instead of sweeping it away.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from kvstore.config import SYNC_TEMP_PREFIX, temp_state_name

log = logging.getLogger("kvstore.hooks")

PENDING_SUFFIX = ".pending.json"
PENDING_VERSION = 1


class SyncDir:
    """Holds only the hooks' own temporary files: `sweep` removes anything else (llama-server's raw saves, files of
    killed processes)."""

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._active: set[str] = set()  # file names handed out by temp() and not yet removed

    def sweep(self, older_than: float = 0.0) -> int:
        """Remove every file not in use by `temp()` and at least `older_than` seconds old (0 at start-up: all).
        Their origin is unknown (no name, no namespace), so they are removed, not ingested. Returns how many."""
        n, now = 0, time.time()
        for p in list(self.path.iterdir()):
            if p.name in self._active:
                continue
            try:
                if older_than and now - p.lstat().st_mtime < older_than:
                    continue
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("sync dir: cannot remove %s: %s", p, e)
                continue
            n += 1
            if not p.name.startswith(SYNC_TEMP_PREFIX):
                log.warning("sync dir: removed %s (not written through the hooks)", p.name)
        if n:
            log.info("sync dir: removed %d stale file(s) from %s", n, self.path)
        return n

    @contextlib.contextmanager
    def temp(self) -> Iterator[tuple[str, Path]]:
        """(filename for llama-server, full path for the store); the file is removed on exit."""
        filename = temp_state_name()
        path = self.path / filename
        self._active.add(filename)
        try:
            yield filename, path
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._active.discard(filename)

    def keep_pending(self, filename: str, record: dict[str, Any]) -> Callable[[], None]:
        """Write `<filename>.pending.json` (temp file, then rename: whole or absent) holding `record`; returns what
        removes it. The sweep leaves it alone until then."""
        side = filename + PENDING_SUFFIX
        tmp = self.path / (side + ".tmp")
        self._active.update((side, tmp.name))
        try:
            tmp.write_text(json.dumps({"version": PENDING_VERSION, **record}))
            tmp.replace(self.path / side)
        finally:
            self._active.discard(tmp.name)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                (self.path / side).unlink()
            self._active.discard(side)
        return remove

    def pending_saves(self) -> list[tuple[dict[str, Any], Path, Path]]:
        """(record, state file, record file) of every state left pending by an earlier process, oldest save first.
        A record that cannot be read, or whose state file is gone, is removed here (logged)."""
        out = []
        for side in self.path.glob(f"{SYNC_TEMP_PREFIX}*{PENDING_SUFFIX}"):
            state = side.with_name(side.name[:-len(PENDING_SUFFIX)])
            rec = _pending_record(side)
            if rec is None or not state.is_file():
                log.warning("sync dir: dropped %s (%s)", side.name,
                            "unreadable record" if rec is None else "its state file is gone")
                with contextlib.suppress(FileNotFoundError):
                    side.unlink()
                continue
            out.append((rec, state, side))
        return sorted(out, key=lambda t: t[0]["saved_at"])


def _pending_record(side: Path) -> Optional[dict[str, Any]]:
    """The record if it is one this version wrote: str namespace and name, optional str parent, a str -> str
    fingerprint and a numeric `saved_at`."""
    try:
        rec = json.loads(side.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(rec, dict) and rec.get("version") == PENDING_VERSION
          and isinstance(rec.get("namespace"), str) and isinstance(rec.get("name"), str) and rec["name"]
          and (rec.get("parent") is None or isinstance(rec.get("parent"), str))
          and isinstance(rec.get("fingerprint"), dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in rec["fingerprint"].items())
          and isinstance(rec.get("saved_at"), (int, float)) and not isinstance(rec.get("saved_at"), bool))
    return rec if ok else None
