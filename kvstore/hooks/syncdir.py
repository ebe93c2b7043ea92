"""The sync directory (llama-server's --slot-save-path): files named by us, removed after use; nothing else stays.

Contract: file names come from `kvstore.config.temp_state_name` (the one home of the `.kv-` naming), never from a state name.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Iterator

from kvstore.config import SYNC_TEMP_PREFIX, temp_state_name

log = logging.getLogger("kvstore.hooks")


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
