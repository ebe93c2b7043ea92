"""Where the store lives and which server to talk to: arguments, then environment, then defaults.

A store is a local directory or an S3 bucket (`s3://BUCKET/PREFIX`). An S3 store keeps a local cache directory
(its LMDB index, the objects it has read or written, and the sync directory): `--cache`, else
`$XDG_CACHE_HOME/kvstore/<hash>` (`~/.cache/kvstore/<hash>`), the hash of the endpoint and the URL, so two
buckets (or one bucket name at two endpoints) never share a cache. `locate()` is the one parser of these.
"""
from __future__ import annotations

import hashlib
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

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
    """llama-server's `--slot-save-path` for a local store directory (an S3 store's is `Location.sync`, under its
    cache): state files pass through here on their way in and out of the store."""
    return Path(store) / "sync"


def sync_dir_of(store: Any) -> Path:
    """The sync directory of an open `kvstore._core.Store`: under its cache for an S3 store, else under it."""
    if getattr(store, "remote", None):
        return sync_dir(Path(store.cache_dir))
    return sync_dir(Path(store.path))


S3_SCHEME = "s3://"
# S3's bucket naming rules (3-63 characters; lowercase letters, digits, dots, hyphens; alphanumeric at both ends).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# Key prefix: plain path segments (no empty, '.' or '..' segment; no control characters or backslashes).
_SEGMENT_BAD = re.compile(r"[\x00-\x1f\x7f\\]")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class LocationError(ValueError):
    """A store location or cache setting that cannot be used; the message says what is accepted."""


def parse_size(value: Union[str, int, None], what: str = "cache size") -> Optional[int]:
    """Bytes from `10G`, `512M`, `1.5g`, `2GiB`, `100000` (K/M/G/T are powers of 1024); None stays None. `what`
    names the setting in the error (a `LocationError`)."""
    if value is None or isinstance(value, int):
        if isinstance(value, int) and value <= 0:
            raise LocationError(f"{what} {value}: must be positive")
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise LocationError(f"{what} {value!r}: expected bytes, optionally with a suffix K, M, G or T "
                            "(powers of 1024), e.g. 10G")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise LocationError(f"{what} {value!r}: must be positive")
    return n


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://BUCKET[/PREFIX]`; the prefix without leading or trailing slashes ('' for none)."""
    if not url.startswith(S3_SCHEME):
        raise LocationError(f"{url!r}: an S3 store is named s3://BUCKET/PREFIX")
    bucket, _, prefix = url[len(S3_SCHEME):].partition("/")
    if not bucket:
        raise LocationError(f"{url!r}: no bucket: name the store s3://BUCKET/PREFIX")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise LocationError(f"{url!r}: {bucket!r} is not a valid bucket name (3-63 characters: lowercase letters, "
                            "digits, dots and hyphens, starting and ending with a letter or digit)")
    prefix = prefix.strip("/")
    if prefix:
        for seg in prefix.split("/"):
            if seg in ("", ".", "..") or _SEGMENT_BAD.search(seg):
                raise LocationError(f"{url!r}: invalid prefix {prefix!r} (path segments separated by single "
                                    "slashes, no '.' or '..', no control characters or backslashes)")
    return bucket, prefix


def endpoint() -> str:
    """The S3 endpoint a client in this process uses ($AWS_ENDPOINT_URL; empty: AWS itself)."""
    return os.environ.get("AWS_ENDPOINT_URL", "").rstrip("/")


def default_cache_dir(url: str) -> Path:
    """`$XDG_CACHE_HOME/kvstore/<16 hex>` (else `~/.cache/...`): one cache per endpoint and URL."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    key = hashlib.sha256(f"{endpoint()}\n{url}".encode()).hexdigest()[:16]
    return Path(base) / "kvstore" / key


@dataclass(frozen=True)
class Location:
    """Where a store lives: a local directory (`path`) or an S3 URL (`url`) with its local cache (`cache`)."""

    url: Optional[str] = None  # normalized s3://bucket[/prefix]; None: a local store
    path: Optional[Path] = None  # the local store directory
    cache: Optional[Path] = None  # an S3 store's cache directory
    cache_size: Optional[int] = None  # bytes the cache may hold (None: unbounded)

    @property
    def remote(self) -> bool:
        return self.url is not None

    @property
    def target(self) -> str:
        """What `kvstore._core.Store` is opened with."""
        return self.url if self.url is not None else str(self.path)

    @property
    def local_dir(self) -> Path:
        """The directory on this machine: the store itself, or the S3 store's cache."""
        return self.cache if self.url is not None else self.path  # type: ignore[return-value]

    @property
    def sync(self) -> Path:
        """llama-server's `--slot-save-path` for this store."""
        return sync_dir(self.local_dir)

    def __str__(self) -> str:
        return self.target

    def open(self, **kw: Any):
        """Create the local directories and open the store (keyword arguments go to `kvstore._core.Store`)."""
        import shutil

        from kvstore._core import Store

        if self.url is None:
            self.sync.mkdir(parents=True, exist_ok=True)
            return Store(str(self.path), **kw)
        created = not self.local_dir.exists()
        try:
            store = Store(self.url, cache=str(self.cache), cache_size=self.cache_size, **kw)
        except BaseException:
            if created:  # an unreachable or refused bucket leaves nothing behind on this machine
                shutil.rmtree(self.local_dir, ignore_errors=True)
            raise
        self.sync.mkdir(parents=True, exist_ok=True)
        return store


def locate(store: Union[str, os.PathLike, None] = None, *, cache: Union[str, os.PathLike, None] = None,
           cache_size: Union[str, int, None] = None) -> Location:
    """The store named by `store` (else `$KVSTORE_DIR`, else ~/.local/share/kvstore): a directory or
    `s3://BUCKET/PREFIX`. `cache` and `cache_size` are an S3 store's (LocationError for a local one)."""
    value = os.fspath(store) if store is not None else os.environ.get("KVSTORE_DIR")
    if value and value.startswith(S3_SCHEME):
        bucket, prefix = parse_s3_url(value)
        url = f"{S3_SCHEME}{bucket}" + (f"/{prefix}" if prefix else "")
        cache_dir = Path(os.fspath(cache)).expanduser() if cache else default_cache_dir(url)
        return Location(url=url, cache=cache_dir.resolve(), cache_size=parse_size(cache_size))
    if value and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", value):
        raise LocationError(f"{value!r}: unsupported store URL (a directory or s3://BUCKET/PREFIX)")
    if cache is not None or cache_size is not None:
        raise LocationError("--cache and --cache-size are for an S3 store (s3://BUCKET/PREFIX); a local store "
                            "is its own cache")
    return Location(path=store_dir(value))


def temp_state_name() -> str:
    """A fresh file name for a state file in the sync directory (valid for llama-server's filename check)."""
    return f"{SYNC_TEMP_PREFIX}{uuid.uuid4().hex}.bin"


def api_key(arg: Optional[str] = None) -> Optional[str]:
    """`arg`, else `$KVSTORE_API_KEY`, else None: the key the CLI and `kvstore.save`/`restore` send."""
    return arg or os.environ.get("KVSTORE_API_KEY") or None


def server_url(arg: Optional[str] = None) -> str:
    """`arg`, else `$KVSTORE_SERVER`, else llama-server's default address."""
    return (arg or os.environ.get("KVSTORE_SERVER") or DEFAULT_SERVER).rstrip("/")
