"""The sync directory (llama-server's --slot-save-path): files named by us, removed after use."""
from __future__ import annotations

import contextlib
import logging
import os
import uuid
from pathlib import Path
from typing import Iterator

log = logging.getLogger("kvstore.hooks")
PREFIX = ".kv-"


class SyncDir:
    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def clean_stale(self) -> int:
        """Remove files left by an earlier run (a crash between save and ingest). Returns how many."""
        n = 0
        for p in self.path.glob(PREFIX + "*"):
            with contextlib.suppress(OSError):
                p.unlink()
                n += 1
        if n:
            log.info("removed %d stale file(s) from %s", n, self.path)
        return n

    @contextlib.contextmanager
    def temp(self) -> Iterator[tuple[str, Path]]:
        """(filename for llama-server, full path for the store); the file is removed on exit."""
        filename = f"{PREFIX}{uuid.uuid4().hex}.bin"
        path = self.path / filename
        try:
            yield filename, path
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
