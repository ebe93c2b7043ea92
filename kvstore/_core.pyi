"""Types of the compiled core (rust/src/py/). Every call releases the GIL while it works.

Checked against the compiled module by mypy's stubtest (tests/test_stub.py): keep the two in step.
"""
import builtins
from typing import Any, Callable, Mapping, Optional, Sequence, final

__all__ = [
    "KvStoreError", "FormatError", "CorruptObject", "FingerprintMismatch", "NameNotFound", "InvalidName",
    "StoreFull", "RemoteUnavailable", "GcLocked", "__version__", "DEFAULT_BLOCK_SIZE", "Store", "validate_name",
    "hash_file", "inspect_state", "layout_is_empty", "cut_state",
]

__version__: str
DEFAULT_BLOCK_SIZE: int
"""Tokens per block of a new store (an existing store keeps the block size it was created with)."""

class KvStoreError(Exception):
    """Base of every kvstore error; the message says what to do next."""

class FormatError(KvStoreError, ValueError):
    """The bytes are not a llama.cpp slot file this build understands (truncated, foreign, other version)."""

class CorruptObject(KvStoreError):
    """A stored object is missing or does not match its hash; run `kvstore verify`."""
    object_id: Optional[str]
    """The object's full hex id, or None (a corrupt index row)."""

class FingerprintMismatch(KvStoreError):
    """A state was asked for a server it cannot be restored into; the message names the differing key."""
    name: Optional[str]
    """The state as messages show it (`name`, `namespace/name` or `manifest 3fa2c1d0`)."""
    key: Optional[str]
    """The differing fingerprint key (`n_ctx_slot` when the server's slot context is too small)."""
    stored: Optional[str]
    """The state's value (for `n_ctx_slot`: its token count)."""
    server: Optional[str]
    """The server's value."""

class NameNotFound(KvStoreError, KeyError):
    """No state is stored under this (namespace, name)."""
    name: Optional[str]
    """None when an unknown manifest id was asked for."""
    namespace: Optional[str]

class InvalidName(KvStoreError, ValueError):
    """A name or namespace breaks the naming rules (empty, > 200 bytes, '/', '\\\\', '..', control characters)."""
    what: Optional[str]
    """'name' or 'namespace'."""
    value: Optional[str]
    """The string refused."""

class StoreFull(KvStoreError, OSError):
    """The disk or the LMDB map is full; nothing was committed."""
    path: Optional[str]  # type: ignore[assignment]
    """Where the write failed."""

class RemoteUnavailable(KvStoreError):
    """The store's bucket did not answer (down, unreachable, timed out); nothing was saved. Reads are served from
    the local cache where it holds the objects."""
    url: Optional[str]
    """The store, `s3://bucket/prefix`."""

class GcLocked(KvStoreError):
    """A bucket store's lock is held: another gc is running (a gc refuses), or a gc or saves in flight held it
    longer than the wait."""
    url: Optional[str]
    """The store, `s3://bucket/prefix`."""

def validate_name(name: str, what: str = "name") -> None: ...
def hash_file(path: str) -> str:
    """blake3 hex digest of a file's content."""
def inspect_state(path: str) -> dict[str, Any]:
    """Parse a slot file: {file_bytes, n_tokens, tokens, layout, n_stream, n_checkpoints, blocks}; raises FormatError."""
def cut_state(path: str, n_tokens: int, n_swa: int, out_path: str, *, extras: Sequence[str] = ...,
              n_stream: Optional[int] = None, fill_masked: int = 0) -> dict[str, Any]:
    """Write the first `n_tokens` of the slot file `path` as a slot file that llama-server resumes at exactly
    n_tokens (non-SWA rows [0, P), SWA rows of the window before P, a context checkpoint at P; docs/design.md
    "Prefix states"). `n_swa`: the model's sliding window (0 without SWA layers). SWA rows may also come from
    the slot files `extras` when their tokens and non-SWA rows agree. Returns {n_tokens, window: [start, end],
    origins: [[state, checkpoint|None, start, end], ...], file_bytes}, or {missing: [[start, end], ...]} and
    writes nothing when no source holds those rows. `fill_masked`: the server's SWA cache cells per slot, to keep
    a fresh evaluation's cell layout (0 = off). Raises FormatError for a bad file or n_tokens."""
def layout_is_empty(layout: str) -> bool:
    """Whether a layout is an empty slot's (it carries no layers, so it matches any server: never compare or
    learn it)."""

@final
class Store:
    """A content-addressed, deduplicating store of slot states. Thread-safe: share one across threads.

    `namespace` defaults to "" (the default namespace) wherever it is a keyword; `block_size` (tokens per block,
    recorded when the store is created) to DEFAULT_BLOCK_SIZE.
    """
    path: str
    """The store's directory (a bucket store: its cache directory)."""
    block_size: int
    remote: Optional[str]
    """`s3://bucket/prefix` of a bucket store, else None."""
    cache_dir: Optional[str]
    """The local cache directory of a bucket store, else None."""
    def bucket_requests(self) -> Optional[dict[str, int]]:
        """Requests sent to the bucket since the store was opened, by kind (get, get_range, head, list, put,
        delete; a listing counts once); None for a local store. Sends none itself."""
    def settle(self) -> None:
        """Wait for what the store does behind its calls: a bucket store's restore returns once its file is in
        place and verified, and writes what it fetched into its cache after that (a read of those objects
        meanwhile takes them from memory; gc, stats and eviction wait for it). For a caller that times the two
        apart."""
    def __new__(cls, location: str, *, cache: Optional[str] = None, cache_size: Optional[int] = None,
                block_size: int = ..., level: int = 1, map_size_mib: int = 65536) -> Store:
        """`location`: a local directory, or `s3://bucket/prefix` (endpoint and credentials from the AWS_*
        environment variables); a bucket store needs `cache` (its local cache directory) and takes `cache_size`
        (bytes, None = unbounded). A local store refuses `cache`/`cache_size`."""
    def sync(self, namespace: Optional[str] = None) -> dict[str, Any]:
        """Bucket stores: bring the local index up to date with the bucket's names (one namespace, or all):
        {names, updated, removed, manifests_fetched, elapsed_s}."""
    def reindex(self) -> dict[str, Any]:
        """Bucket stores: rebuild the local index from the bucket (same report as `sync`)."""
    def ingest(self, name: str, path: str, *, namespace: str = ..., fingerprint: Optional[Mapping[str, str]] = None,
               parent: Optional[str] = None, remove_file: bool = False, force: bool = False) -> dict[str, Any]:
        """Store a slot file under a name (replacing the previous state of that name).
        A file missing a section is refused (FormatError): with `n_layer` (and `n_swa`) in `fingerprint` it is
        checked against the model's layer count. A file whose layout differs from the states already stored under
        the same fingerprint in the namespace is refused (FingerprintMismatch, key "layout") unless `force`.
        `parent` (a name in the same namespace, or a manifest id of a state saved in it) is recorded as lineage only; an unknown parent is
        recorded as none, so a save is never lost over lineage. A `layout` key in `fingerprint` (the server's, learned
        from an earlier save) must equal the file's layout, else FingerprintMismatch; it is not stored as identity.
        Returns {name, namespace, manifest_id, n_tokens, file_bytes, layout, blocks, new_objects, new_raw_bytes,
        new_stored_bytes, reused_bytes, parent_manifest, elapsed_s} (`layout` as `get` reports it)."""
    def ingest_bytes(self, name: str, data: bytes, *, namespace: str = ...,
                     fingerprint: Optional[Mapping[str, str]] = None, parent: Optional[str] = None,
                     force: bool = False) -> dict[str, Any]: ...
    def materialize(self, name: str, out_path: str, *, namespace: str = ..., expect: Optional[Mapping[str, str]] = None,
                    n_stream: Optional[int] = None, durable: bool = False) -> dict[str, Any]:
        """Write the named state as a slot file (temp + rename). Byte-exact unless n_stream differs.
        Returns {manifest_id, n_tokens, file_bytes, objects_read, read_raw_bytes, read_stored_bytes, elapsed_s}."""
    def materialize_prefix(self, name: Optional[str], n_tokens: int, out_path: str, *, namespace: str = ...,
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
    def lookup(self, tokens: Sequence[int], *, namespace: str = ..., fingerprint: Optional[Mapping[str, str]] = None,
               whole: bool = False) -> Optional[dict[str, Any]]:
        """Longest stored token prefix: {manifest_id, name, n_tokens, n_common} or None. `whole`: the longest stored
        state that `tokens` extends all of (n_common == n_tokens), as a recurrent state must be to serve a prompt."""
    def get(self, name: str, *, namespace: str = ...) -> Optional[dict[str, Any]]:
        """{name, namespace, manifest_id, n_tokens, file_bytes, file_hash, fingerprint, layout, parent,
        created, last_used, displaced}, or None. `empty`: an empty slot (see `layout_is_empty`). A bucket store
        reads the name's record from the bucket; `displaced`: manifest ids a concurrent save on another machine
        committed and this name's later save replaced (kept by gc)."""
    def held(self, name: str, *, namespace: str = ...) -> bool:
        """Whether this machine's index names the state (no request: on a bucket store it may be behind another
        machine's save or removal; a restore confirms against the name's record)."""
    def tokens(self, name: str, *, namespace: str = ...) -> list[int]: ...
    def list(self, *, namespace: Optional[str] = None) -> list[dict[str, Any]]: ...
    def remove(self, name: str, *, namespace: str = ...) -> bool: ...
    def touch(self, name: str, *, namespace: str = ...) -> None: ...
    def gc(self, *, grace_seconds: float = 3600.0, dry_run: bool = False) -> dict[str, Any]:
        """{live_objects, dead_objects, freed_bytes, kept_young, kept_packed, kept_packed_bytes, removed_temp,
        dead_manifests, dry_run}.
        A dry run only plans (nothing changes); otherwise the plan is carried out under the store's exclusive lock."""
    def evict(self, *, max_bytes: Optional[int] = None, low_water: float = 0.9,
              quotas: Optional[dict[str, int]] = None, protect: Optional[Sequence[tuple[str, str]]] = None,
              dry_run: bool = False, ceiling_bytes: Optional[int] = None) -> dict[str, Any]:
        """Keep the store within limits: expired names first, then namespaces over their quota, then the cap
        (the namespace furthest over its share loses its least recently used name that owns its bytes).
        {plan: {used_bytes, garbage_bytes, after_bytes, max_bytes, target_bytes, pinned_bytes, victims: [{namespace,
        name, reason, frees_bytes, last_used}], unmet, namespaces: [...]}, evicted, freed_bytes, dead_objects,
        kept_packed_bytes, dry_run}. A dry run only plans; otherwise under the store's exclusive lock, then a sweep
        within `ceiling_bytes` (default `max_bytes`: a bucket leaves dead objects in packs it could not rewrite
        below it, `kept_packed_bytes`, and evicts more while they pass `max_bytes`)."""
    def owned_bytes(self) -> builtins.list[tuple[str, str, int]]:
        """[(namespace, name, bytes)]: the stored bytes of each name's objects that no other name references, what
        evicting it now would free (counted as the cap counts them)."""
    def set_retention(self, name: str, namespace: str = ..., *, ttl_seconds: Optional[float] = None,
                      pinned: bool = False, max_bytes: Optional[int] = None) -> None:
        """Set a name's ttl (seconds after its last use; None: never) and pin. With `max_bytes`, a pin that would
        put the pinned states' bytes over it raises StoreFullError and changes nothing."""
    def verify(self, *, progress: Optional[Callable[[int, int], None]] = None, where: str = ...) -> dict[str, Any]:
        """Re-hash every object: {objects_checked, unscoped, corrupt: [id], missing: [id], names_affected: [..]}
        (`unscoped`: objects no known manifest references that match their id in no known namespace's scope).
        A bucket store checks `where` = "bucket", "cache" (objects it lacks are not missing) or "both" (default);
        a local store takes only the default."""
    def stats(self, *, namespace: Optional[str] = None) -> dict[str, Any]:
        """{names, manifests, objects, logical_bytes, unique_raw_bytes, stored_bytes, dedup_ratio,
        compression_ratio, total_ratio, block_size, bucket_objects, bucket_bytes, cache_bytes, cache_limit}
        (the last four None for a local store). `namespace`: that namespace's figures only (its names, the
        objects they reference; the last four None): what a tenant may see, and bytes it alone holds."""
