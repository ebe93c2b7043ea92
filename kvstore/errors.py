"""kvstore's exceptions.

The store's exceptions are defined by the compiled core (`kvstore._core`, rust/src/py.rs) and re-exported here;
`ServerError` is raised by the Python side when llama-server (or `kvstore serve`) cannot be reached or refuses
a request.

If the core is not built, pure-Python stand-ins with the same hierarchy are defined so that `import kvstore`
still works (the configuration, the server client and `kvstore --help` need no core); any use of `Store` then
says how to build it.
"""
from __future__ import annotations

from typing import Optional

try:
    from kvstore._core import (  # noqa: F401
        CorruptObject,
        FingerprintMismatch,
        FormatError,
        InvalidName,
        KvStoreError,
        NameNotFound,
        StoreFull,
    )

    CORE_IMPORT_ERROR: Optional[ImportError] = None
except ImportError as exc:  # the extension is not built (or not importable on this platform)
    CORE_IMPORT_ERROR = exc

    class KvStoreError(Exception):  # type: ignore[no-redef]
        """Base of every kvstore error; the message says what to do next."""

    class FormatError(KvStoreError, ValueError):  # type: ignore[no-redef]
        """The bytes are not a llama.cpp slot file this build understands."""

    class CorruptObject(KvStoreError):  # type: ignore[no-redef]
        """A stored object is missing or does not match its hash; run `kvstore verify`."""

    class FingerprintMismatch(KvStoreError):  # type: ignore[no-redef]
        """A state was asked for a server it cannot be restored into."""

    class NameNotFound(KvStoreError, KeyError):  # type: ignore[no-redef]
        """No state is stored under this (namespace, name)."""

    class InvalidName(KvStoreError, ValueError):  # type: ignore[no-redef]
        """A name or namespace breaks the naming rules."""

    class StoreFull(KvStoreError, OSError):  # type: ignore[no-redef]
        """The disk or the LMDB map is full; nothing was committed."""


class ServerError(KvStoreError):
    """llama-server (or `kvstore serve`) was unreachable or refused a request.

    The message names the URL, the HTTP status (if any) and the server's own error text.
    """

    def __init__(self, message: str, *, url: str = "", status: Optional[int] = None, detail: str = ""):
        super().__init__(message)
        self.url = url
        self.status = status
        self.detail = detail


def error_message(exc: BaseException) -> str:
    """One line for the user: KeyError-derived exceptions otherwise print their message in quotes."""
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


__all__ = [
    "KvStoreError", "FormatError", "CorruptObject", "FingerprintMismatch", "NameNotFound", "InvalidName",
    "StoreFull", "ServerError", "CORE_IMPORT_ERROR", "error_message",
]
