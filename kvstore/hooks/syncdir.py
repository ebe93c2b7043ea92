"""The sync directory (llama-server's --slot-save-path): files named by us, removed after use.

File names come from `kvstore.config.temp_state_name` (the one home of the `.kv-` naming), never from a state name.
"""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator

from kvstore.config import SYNC_TEMP_PREFIX, temp_state_name

log = logging.getLogger("kvstore.hooks")


class SyncDir:
    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def clean_stale(self) -> int:
        """Remove files left by an earlier run (a crash between save and ingest). Returns how many."""
        n = 0
        for p in self.path.glob(SYNC_TEMP_PREFIX + "*"):
            with contextlib.suppress(OSError):
                p.unlink()
                n += 1
        if n:
            log.info("removed %d stale file(s) from %s", n, self.path)
        return n

    @contextlib.contextmanager
    def temp(self) -> Iterator[tuple[str, Path]]:
        """(filename for llama-server, full path for the store); the file is removed on exit."""
        filename = temp_state_name()
        path = self.path / filename
        try:
            yield filename, path
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
