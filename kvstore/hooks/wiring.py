"""What one running hooks server is made of: its configuration (`HooksConfig`) and the parts built together once
llama-server has answered (`Wired`).

Contract: `Wired` is made whole or not at all (`app.Hooks._connect_once`), so a handler never meets half a server:
until it exists every request is a 503 (`app.ready_middleware`). No aiohttp.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from kvstore.config import Location, locate

from .auth import Tenancy
from .bound import Bound
from .broker import Broker
from .slot_api import SlotApi
from .slots import SlotTable
from .store import AsyncStore
from .transfer import Transfer
from .upstream import FIRST_BYTE_TIMEOUT, IDLE_TIMEOUT, STALL_TIMEOUT, Upstream


@dataclass
class HooksConfig:
    upstream: str  # llama-server URL
    # A store directory, `s3://BUCKET/PREFIX` (with `cache`, `cache_size`) or a Location; llama-server's
    # --slot-save-path must be the location's `sync` (<store>/sync, or <cache>/sync for S3).
    store: Union[Path, str, Location]
    name_from_user: bool = False
    idle_save: float = 30.0  # seconds; <= 0 disables
    max_queue: int = 64
    fingerprint_extra: dict = field(default_factory=dict)  # added to the server fingerprint (e.g. swa_full)
    upstream_timeout: float = FIRST_BYTE_TIMEOUT  # seconds to a reply's first byte (a non-streamed reply: all of it)
    upstream_idle_timeout: float = IDLE_TIMEOUT  # seconds between two chunks of a reply
    # seconds without an answered /health probe: llama-server is stalled (504 for waiting requests, 503 for new
    # ones until it answers); <= 0: no probe
    upstream_stall_timeout: float = STALL_TIMEOUT
    watch_period: float = 2.0  # seconds between checks for a restarted llama-server (also after connection errors)
    sync_sweep: float = 60.0  # a foreign file in the sync dir is removed once this old (checked this often)
    tenancy: Tenancy = field(default_factory=Tenancy)  # API keys -> namespaces; none: single-tenant
    upstream_api_key: Optional[str] = None  # llama-server's own --api-key (the embedded server's is random)
    embedded: bool = False  # the upstream is kvstore serve's own (its prompt cache is off when keys are set)
    # SWA models: the server's SWA cache cells per slot (hooks/cut.py swa_cells), so a cut keeps a fresh
    # evaluation's cell layout; 0 when unknown (an external llama-server): the cut carries the window alone.
    swa_cells: int = 0
    # "checkpoint": a returning user's SWA state is restored whole and llama-server resumes at its own newest
    # checkpoint, as in the slot that kept it; "end": cut at its end, so only the new tokens are evaluated (cut.plan).
    resume_at: str = "checkpoint"
    # Models with a recurrent section: store the state where a named request's prompt leaves every stored state it
    # could continue, on the way, so that the next prompt leaving there continues it (hooks/fork.py).
    fork_states: bool = True
    cache: Optional[Path] = None  # an S3 store's cache directory (default: config.default_cache_dir)
    cache_size: Optional[int] = None  # bytes
    # The store's bound (hooks/bound.py): a cap in bytes, the fraction evicted down to, a default ttl (seconds),
    # how often expired names are looked for.
    max_size: Optional[int] = None
    low_water: float = 0.9
    default_ttl: Optional[float] = None
    evict_period: float = 5.0
    # Restore or recompute (hooks/cost.py): a fixed prefill rate in tokens/s instead of the measured one.
    assume_prefill_tps: Optional[float] = None
    restore_policy: str = "cost"  # "cost": restore only when predicted faster; "always": whatever the estimates
    # Ingest a state displaced for another request behind that request (hooks/behind.py); None: for a local store
    # (an S3 store acknowledges a save only once it is in the bucket, where other servers look for it).
    save_behind: Optional[bool] = None

    @property
    def saves_behind(self) -> bool:
        return self.save_behind if self.save_behind is not None else not self.location.remote

    @property
    def location(self) -> Location:
        if isinstance(self.store, Location):
            return self.store
        return locate(self.store, cache=self.cache, cache_size=self.cache_size)


@dataclass(frozen=True)
class Wired:
    """The parts that need llama-server's answer (its slot count and fingerprint), built together."""

    up: Upstream
    store: AsyncStore
    transfer: Transfer
    table: SlotTable
    broker: Broker
    slot_api: SlotApi
    n_slots: int
    bound: Bound
