"""One llama-server slot as the proxy sees it (`Slot`), a request's hold on one (`Lease`), and `common_prefix`.

Contract: fields of a `Slot` are written only by `slots.SlotTable` (and `Slot.hold`/`clear`, which it calls):
handlers and the broker report what happened through the table's methods. A `Lease` knows its table only as
`SlotEvents` (what a lease holder reports), so this module imports nothing of the proxy's.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Optional, Protocol, Sequence

if TYPE_CHECKING:  # a lease only carries the decision; slot.py imports nothing of the proxy's at run time
    from .cost import Decision

Key = tuple[str, str]  # (namespace, name)


@dataclass(eq=False)
class Slot:
    id: int
    name: Optional[str] = None
    namespace: str = ""
    tokens: list[int] = field(default_factory=list)
    dirty: bool = False
    last_used: float = 0.0
    parent: Optional[str] = None  # the name this state was built on (recorded at ingest)
    # The namespace whose KV cells the slot holds (None: empty as far as we know). Kept apart from the label: a
    # slot whose name was removed still holds its tenant's cells, and is erased before another namespace uses it.
    owner: Optional[str] = None
    # The prompt's tokens of the request under way in the slot (empty when idle or not tokenized) and its namespace
    # (set at once, before `owner`, which changes only after a displaced state is saved): what a waiting request of
    # the same namespace may share with it before it is evaluated (SlotTable: no prefix evaluated twice at once).
    inflight: list[int] = field(default_factory=list)
    inflight_namespace: Optional[str] = None
    # Bumped whenever llama-server's content of the slot changes or is lost (an evaluation, a restore, an erase, a
    # failure): a lease that finds it unchanged knows the slot still holds what it held when the lease began.
    version: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def key(self) -> Optional[Key]:
        return (self.namespace, self.name) if self.name is not None else None

    @property
    def busy(self) -> bool:
        return self.lock.locked()

    @property
    def empty(self) -> bool:
        return self.name is None and not self.tokens

    def hold(self, key: Optional[Key], *, parent: Optional[str] = None) -> None:
        """Label the slot as holding `key` (its content is kept; the caller restores or extends it)."""
        if key is None:
            self.namespace, self.name = "", None
        else:
            self.namespace, self.name = key
        self.parent = parent
        self.dirty = False

    def clear(self) -> None:
        """The slot's KV is gone (erase, failed restore): keep the label, forget the content."""
        self.version += 1
        self.tokens = []
        self.dirty = False
        self.owner = None

    def visible_to(self, viewer: Optional[str]) -> bool:
        """May a caller whose namespace is `viewer` (None: the operator or an admin, who see all) see what this
        slot holds? Only if no other namespace's cells are in it (`owner`) and its label is not another's."""
        if viewer is None:
            return True
        return self.owner in (None, viewer) and (self.name is None or self.namespace == viewer)

    def view(self, viewer: Optional[str]) -> dict[str, Any]:
        """`as_dict()` as `viewer` may see it: another namespace's slot shows only its id and whether it is busy."""
        if self.visible_to(viewer):
            return self.as_dict()
        return {"id": self.id, "busy": self.busy, "other_namespace": True}

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "namespace": self.namespace, "n_tokens": len(self.tokens),
                "dirty": self.dirty, "busy": self.busy, "last_used": self.last_used, "parent": self.parent,
                "owner": self.owner}


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share (the one definition: slot reuse, cuts, the bench)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def extends(held: Sequence[int], tokens: Sequence[int]) -> bool:
    """Does a prompt of `tokens` extend all of `held` (a slot's or a stored state's tokens)? The rule for using
    content in place where llama-server cannot roll back inside it cheaply (an SWA window, a recurrent state:
    `SlotTable.usable`, `cut.in_place`)."""
    return common_prefix(held, tokens) >= len(held)


class SlotEvents(Protocol):
    """What a lease holder reports to the table that leased it (`slots.SlotTable` implements it)."""

    def cleared(self, slot: Slot) -> None: ...

    def loaded(self, slot: Slot) -> None: ...


@dataclass
class Lease:
    """What `acquire` found: the slot, and how its current content relates to the request."""

    slot: Slot
    resident: bool = False  # the slot already holds the requested name
    parent_resident: bool = False  # the slot holds the requested parent (used in place)
    lcp: int = 0  # tokens the slot's content shares with the request's prompt (reused in place)
    decision: Optional[Decision] = None  # restore or recompute (hooks/cost.py), once a restore was weighed
    fork_evaluated: int = 0  # prompt tokens evaluated to store a state at a fork first (hooks/fork.py)
    # What the slot held when `acquire` relabelled it for this lease ((namespace, name, parent, tokens); None: not
    # relabelled), and its `version` then: `SlotTable.unchanged` puts the label back if the content is unchanged.
    before: Optional[tuple[str, Optional[str], Optional[str], list[int]]] = None
    version: int = -1
    table: Optional[SlotEvents] = field(default=None, repr=False)  # set by acquire: the table that leased it
    _tasks: list = field(default_factory=list, repr=False)

    async def shielded(self, coro: Awaitable[Any]) -> Any:
        """Run a save or restore so that a cancelled handler cannot interrupt it half-way.

        If the handler is cancelled, the slot stays locked until the operation has finished.
        """
        task = asyncio.ensure_future(coro)
        self._tasks.append(task)
        return await asyncio.shield(task)
