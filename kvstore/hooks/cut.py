"""Which stored state to cut for a prompt, and where: the SWA prefix decision (docs/design.md "Prefix states").

Contract: pure decisions plus the store reads they need (a stored state's tokens); no slot is written and
nothing is restored here: `Broker` restores the chosen `Cut` through `Transfer.restore_cut` and records lineage.

On an SWA model (Gemma 2/3, ...) a restored state helps only if llama-server finds a context checkpoint at or
before the point where the prompt leaves it; otherwise it re-evaluates the whole prompt. So among the request's
own name, its parent and the longest stored prefix (any state of the namespace), the state sharing the most
tokens with the prompt is cut at that common prefix P (`Store.materialize_prefix`), with a checkpoint at P, and
llama-server evaluates only the tokens after P where the prompt leaves the state. A prompt that extends all of
its own state (a returning user) restores it whole, unless `--resume-at end` asks for a cut at its end (`plan`).
A cut that cannot be emitted (window rows not stored) is never handed to llama-server; the caller then serves the
request as before and counts it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from kvstore.errors import NameNotFound

from . import fork
from .naming import Naming
from .slot import Lease, common_prefix
from .store import AsyncStore

# Order of preference among equal common prefixes: the request's own state, its parent, any other state.
KINDS = ("restored", "parent", "prefix")


@dataclass(frozen=True)
class Candidate:
    kind: str  # one of KINDS: the X-KV-Cache value when it wins
    name: Optional[str]  # a stored name, or None for a bare manifest (lookup hit without a live name)
    manifest_id: Optional[str]
    n_tokens: int  # tokens of the stored state
    n_common: int  # common prefix with the prompt


@dataclass(frozen=True)
class Cut:
    """The decision: cut `source` at `at` tokens (P)."""

    source: Candidate
    at: int


def applies(fingerprint: Mapping[str, str], layout: Optional[str]) -> bool:
    """Cut only an attention-only SWA cache: the model has a sliding window, and the server's layout (once known)
    has no recurrent section, whose state is one value for the whole sequence (docs/design.md "Recurrent and
    hybrid models"; the store refuses such a cut too)."""
    return int(fingerprint.get("n_swa") or 0) > 0 and not fork.applies(layout)


def extension_only(fingerprint: Mapping[str, str], layout: Optional[str]) -> bool:
    """Can llama-server use a slot's content in place only when the prompt extends all of it? So on an SWA model
    (a fork inside the window rolls back to a checkpoint before it, or re-evaluates everything) and with a
    recurrent section (its state is one value for the whole sequence: no rolling back at all). On a
    full-attention model any common prefix is kept (the cells past it are simply dropped)."""
    return int(fingerprint.get("n_swa") or 0) > 0 or fork.applies(layout)


def forks_served(fingerprint: Mapping[str, str], layout: Optional[str]) -> bool:
    """Can a stored or resident state serve a prompt that leaves it before its end? In place on a full-attention
    model, cut at the fork on an SWA one (`applies`); never with a recurrent section."""
    return not extension_only(fingerprint, layout) or applies(fingerprint, layout)


def best(candidates: Sequence[Candidate], min_tokens: int) -> Optional[Candidate]:
    """The candidate with the longest common prefix (at least `min_tokens`), preferring KINDS' order on ties."""
    usable = [c for c in candidates if c.n_common >= max(1, min_tokens)]
    if not usable:
        return None
    return max(usable, key=lambda c: (c.n_common, -KINDS.index(c.kind)))


def cut_point(c: Candidate, n_prompt: int) -> int:
    """P: where the chosen state is cut (never beyond the state, and short of the prompt's end: llama-server
    evaluates at least the prompt's last token, so a cut at the prompt's end would need a checkpoint before it)."""
    return min(c.n_common, c.n_tokens, n_prompt - 1)


def end_cut(n_own: int, n_prompt: int, min_tokens: int) -> Optional[int]:
    """Where `plan` with `at_end` cuts a request's own stored state of `n_own` tokens that its prompt of `n_prompt`
    extends (a returning user), when that state is the candidate it takes: None for one `best` would not take."""
    own = Candidate("restored", None, None, n_own, n_own)
    return cut_point(own, n_prompt) if best([own], min_tokens) is not None else None


def swa_cells(n_swa: int, n_ubatch: int, n_ctx_slot: int, kv_unified: bool, swa_full: bool, n_seq: int) -> int:
    """llama.cpp's SWA cache size in cells per stream (llama_kv_cache_iswa): what a filled cut may hold.

    0 when it is not known to be a per-slot ring (unified cache or --swa-full): the cut then carries the window
    alone, which restores everywhere."""
    if n_swa <= 0 or kv_unified or swa_full:
        return 0
    return (min(n_ctx_slot, n_swa + n_ubatch) + 255) // 256 * 256  # GGML_PAD(..., 256), llama-kv-cache-iswa.cpp


async def choose(store: AsyncStore, namespace: str, name: Optional[str], parent: Optional[str],
                 tokens: Sequence[int], hint: Optional[dict], min_tokens: int) -> Optional[Candidate]:
    """The stored state to cut for a prompt: the request's own name, its parent, or the lookup `hint` (the longest
    stored prefix of the namespace), whichever shares the most tokens."""
    cands: list[Candidate] = []
    for kind, n in (("restored", name), ("parent", parent)):
        if not n:
            continue
        try:
            st = await store.tokens(n, namespace=namespace)
        except NameNotFound:
            continue
        cands.append(Candidate(kind, n, None, len(st), common_prefix(st, tokens)))
    if hint is not None:
        cands.append(Candidate("prefix", hint.get("name") or None, hint["manifest_id"], int(hint["n_tokens"]),
                               int(hint["n_common"])))
    return best(cands, min_tokens)


def in_place(lease: Lease) -> int:
    """The tokens llama-server keeps of a slot reused in place: the lease's `lcp`, which the slot table sets to 0
    where the prompt leaves the slot's content before its end on an SWA model (`SlotTable.usable`: llama-server
    would roll back to a checkpoint before the fork or re-evaluate everything), so a cut of the stored state
    (saved when the slot was relabelled) is worth more (bench W2 article-major without parents, README)."""
    return lease.lcp


async def plan(store: AsyncStore, lease: Lease, naming: Naming, tokens: Sequence[int], hint: Optional[dict],
               min_tokens: int, *, at_end: bool = False) -> Optional[Cut]:
    """The cut worth restoring into the leased slot for this prompt, or None when nothing beats the slot's own
    content: the caller then goes on as on any other model. `at_end` (`kvstore serve --resume-at end`): cut a
    returning user's own state at its end too."""
    c = await choose(store, naming.namespace, naming.name, naming.parent, tokens, hint, min_tokens)
    if c is None or c.n_common <= in_place(lease) or (c.n_common >= c.n_tokens and c.kind == "restored"
                                                      and not at_end):
        # A prompt that extends the whole of its own state restores it whole by default: llama-server then resumes
        # at its own newest checkpoint, made 4 tokens before the end of the last prompt (evaluating the last reply
        # again while the conversation is shorter than the window), exactly as in the slot that kept the state, so
        # a returning user's reply is token for token the one it would have had (tests/hooks/test_hooks_users.py).
        # With `at_end` it is cut at its end, like a parent or another stored state: a checkpoint at P, so only the
        # new tokens are evaluated; the reply may then differ from the kept slot's where llama-server's
        # re-evaluation of the last reply would have tipped a near tie (measured: 2 of 18 turns; a fresh
        # evaluation of the whole prompt differed in 4: docs/hooks.md "Sliding-window models").
        return None
    p = cut_point(c, len(tokens))
    if p <= in_place(lease):
        return None
    return Cut(c, p)
