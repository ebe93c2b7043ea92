"""Where the store lives and which server to talk to: arguments, then environment, then defaults."""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Optional

DEFAULT_SERVER = "http://127.0.0.1:8080"
# State files in the sync directory are named `.kv-<uuid>.bin` by us, never after a user-supplied name; files with
# this prefix left by a crash are removed by the proxy at startup.
SYNC_TEMP_PREFIX = ".kv-"


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


def temp_state_name() -> str:
    """A fresh file name for a state file in the sync directory (valid for llama-server's filename check)."""
    return f"{SYNC_TEMP_PREFIX}{uuid.uuid4().hex}.bin"


def server_url(arg: Optional[str] = None) -> str:
    """`arg`, else `$KVSTORE_SERVER`, else llama-server's default address."""
    return (arg or os.environ.get("KVSTORE_SERVER") or DEFAULT_SERVER).rstrip("/")
