"""Where the store lives and which server to talk to: arguments, then environment, then defaults."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

DEFAULT_SERVER = "http://127.0.0.1:8080"


def store_dir(arg: Optional[str] = None) -> Path:
    """`arg`, else `$KVSTORE_DIR`, else `~/.local/share/kvstore`."""
    value = arg or os.environ.get("KVSTORE_DIR")
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kvstore"


def sync_dir(store: Path) -> Path:
    """llama-server's `--slot-save-path`: state files pass through here on their way in and out of the store."""
    return Path(store) / "sync"


def server_url(arg: Optional[str] = None) -> str:
    """`arg`, else `$KVSTORE_SERVER`, else llama-server's default address."""
    return (arg or os.environ.get("KVSTORE_SERVER") or DEFAULT_SERVER).rstrip("/")
