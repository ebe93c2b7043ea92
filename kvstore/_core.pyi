"""Types of the compiled core (rust/src/py.rs). Every call releases the GIL while it works."""
from typing import Any, Callable, Mapping, Optional, Sequence

__version__: str
BLOCK_SIZE_DEFAULT: int

class KvStoreError(Exception):
    """Base of every kvstore error; the message says what to do next."""

class FormatError(KvStoreError, ValueError):
    """The bytes are not a llama.cpp slot file this build understands (truncated, foreign, other version)."""

class CorruptObject(KvStoreError):
    """A stored object is missing or does not match its hash; run `kvstore verify`."""

class FingerprintMismatch(KvStoreError):
    """A state was asked for a server it cannot be restored into; the message names the differing key."""

class NameNotFound(KvStoreError, KeyError):
    """No state is stored under this (namespace, name)."""

class InvalidName(KvStoreError, ValueError):
    """A name or namespace breaks the naming rules (empty, > 200 bytes, '/', '\\\\', '..', control characters)."""

class StoreFull(KvStoreError, OSError):
    """The disk or the LMDB map is full; nothing was committed."""

def validate_name(name: str, what: str = "name") -> None: ...
def hash_file(path: str) -> str:
    """blake3 hex digest of a file's content."""
def inspect_state(path: str) -> dict[str, Any]:
    """Parse a slot file: {file_bytes, n_tokens, tokens, layout, n_stream, n_checkpoints, blocks}; raises FormatError."""
def cut_state(path: str, n_tokens: int, n_swa: int, out_path: str, *, extras: Sequence[str] = (),
              n_stream: Optional[int] = None) -> dict[str, Any]:
    """Write the first `n_tokens` of the slot file `path` as a slot file that llama-server resumes at exactly
    n_tokens (non-SWA rows [0, P), SWA rows of the window before P, a context checkpoint at P; docs/design.md
    "Prefix states"). `n_swa`: the model's sliding window (0 without SWA layers). SWA rows may also come from
    the slot files `extras` when their tokens and non-SWA rows agree. Returns {n_tokens, window: [start, end],
    origins: [[state, checkpoint|None, start, end], ...], file_bytes}, or {missing: [[start, end], ...]} and
    writes nothing when no source holds those rows. Raises FormatError for a bad file or n_tokens."""

class Store:
    path: str
    block_size: int
    def __init__(self, path: str, *, block_size: int = 32, level: int = 1, map_size_mib: int = 65536) -> None: ...
    def ingest(self, name: str, path: str, *, namespace: str = "", fingerprint: Optional[Mapping[str, str]] = None,
               parent: Optional[str] = None, remove_file: bool = False) -> dict[str, Any]:
        """Store a slot file under a name (replacing the previous state of that name).
        `parent` (a name in the same namespace, or a manifest id) is recorded as lineage only; an unknown parent is
        recorded as none, so a save is never lost over lineage. A `layout` key in `fingerprint` (the server's, learned
        from an earlier save) must equal the file's layout, else FingerprintMismatch; it is not stored as identity.
        Returns {name, namespace, manifest_id, n_tokens, file_bytes, blocks, new_objects, new_raw_bytes,
        new_stored_bytes, reused_bytes, parent_manifest, elapsed_s}."""
    def ingest_bytes(self, name: str, data: bytes, *, namespace: str = "",
                     fingerprint: Optional[Mapping[str, str]] = None, parent: Optional[str] = None) -> dict[str, Any]: ...
    def materialize(self, name: str, out_path: str, *, namespace: str = "", expect: Optional[Mapping[str, str]] = None,
                    n_stream: Optional[int] = None, durable: bool = False) -> dict[str, Any]:
        """Write the named state as a slot file (temp + rename). Byte-exact unless n_stream differs.
        Returns {manifest_id, n_tokens, file_bytes, objects_read, read_raw_bytes, read_stored_bytes, elapsed_s}."""
    def materialize_prefix(self, name: Optional[str], n_tokens: int, out_path: str, *, namespace: str = "",
                           manifest_id: Optional[str] = None, expect: Optional[Mapping[str, str]] = None,
                           n_stream: Optional[int] = None, fill_masked: int = 0) -> dict[str, Any]:
        """The first n_tokens of a stored state (`name`, or `manifest_id` with name None) as a slot file that
        llama-server resumes at exactly n_tokens: non-SWA rows [0, P), the SWA window before P, a context
        checkpoint at P (docs/design.md "Prefix states"). Window rows the state lacks are taken from other live
        states of the namespace with the same fingerprint and identical rows. `fill_masked`: the server's SWA
        cache cells per slot, to keep a fresh evaluation's cell layout (0 = off). Returns {manifest_id, n_tokens,
        file_bytes, window, origins: [[manifest_id, checkpoint|None, start, end]], objects_read, elapsed_s}, or
        {manifest_id, n_tokens, missing: [[start, end]], reason} and writes nothing when it cannot be emitted."""
    def materialize_manifest(self, manifest_id: str, out_path: str, *, expect: Optional[Mapping[str, str]] = None,
                             n_stream: Optional[int] = None, durable: bool = False) -> dict[str, Any]: ...
    def lookup(self, tokens: Sequence[int], *, namespace: str = "", fingerprint: Optional[Mapping[str, str]] = None
               ) -> Optional[dict[str, Any]]:
        """Longest stored token prefix: {manifest_id, name, n_tokens, n_common} or None."""
    def get(self, name: str, *, namespace: str = "") -> Optional[dict[str, Any]]:
        """{name, namespace, manifest_id, n_tokens, file_bytes, file_hash, fingerprint, layout, parent, created,
        last_used}, or None."""
    def tokens(self, name: str, *, namespace: str = "") -> list[int]: ...
    def list(self, *, namespace: Optional[str] = None) -> list[dict[str, Any]]: ...
    def remove(self, name: str, *, namespace: str = "") -> bool: ...
    def touch(self, name: str, *, namespace: str = "") -> None: ...
    def gc(self, *, grace_seconds: float = 3600.0, dry_run: bool = False) -> dict[str, Any]:
        """{live_objects, dead_objects, freed_bytes, kept_young, removed_temp, dry_run}."""
    def verify(self, *, progress: Optional[Callable[[int, int], None]] = None) -> dict[str, Any]:
        """Re-hash every object: {objects_checked, corrupt: [id], missing: [id], names_affected: [..]}."""
    def stats(self) -> dict[str, Any]:
        """{names, manifests, objects, logical_bytes, unique_raw_bytes, stored_bytes, dedup_ratio,
        compression_ratio, total_ratio, block_size}."""
