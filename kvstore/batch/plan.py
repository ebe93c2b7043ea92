"""Which token prefixes a batch shares, and the order that evaluates each of them once.

Contract: feed every request's prompt tokens to `Planner.add` (first pass), then `Planner.finish()` returns a
`Plan`: for each request the chain of shared prefixes it extends (`Prefix` nodes, outermost first; empty when it
shares nothing worth a restore) and the order to send requests in (depth first through the prefixes, so the
requests of one prefix follow one another and its state is still in a slot or freshly stored). Tokens are kept
on disk (a spool file), never all in memory: what stays in memory is a count per distinct `CHUNK`-token block
prefix, one record per request and, per chosen prefix, its tokens.

The rule. Prefixes are counted at block granularity (`CHUNK` tokens; a block's key hashes everything before it).
Along a request's chain, a block is a *branch point* where the number of requests through it drops at the next
block (or the chain ends) while it is shared by at least two. A branch point becomes a `Prefix` if the tokens it
saves, (requests through it - 1) x (its depth - the previous chosen prefix's depth), reach `min_saving`; its exact
tokens are the longest common prefix of every request through it (at least its block depth). Each `Prefix` is
primed once (with the previous one as its parent) and its requests carry it as their parent.

`ideal` is the number of distinct token prefixes of all prompts (a perfect cache evaluates each once): exact,
from the prompts sorted as token strings, when there are at most `IDEAL_LIMIT` requests; else None.
"""
from __future__ import annotations

import array
import hashlib
import os
import struct
import tempfile
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator, Optional

CHUNK = 16
IDEAL_LIMIT = 20_000


def chain(tokens: array.array) -> Iterator[tuple[int, bytes]]:
    """(depth, key) for every whole CHUNK-token block: key(k) hashes tokens[:depth]."""
    h = hashlib.blake2b(digest_size=16)
    raw = tokens.tobytes()
    width = tokens.itemsize * CHUNK
    for k in range(len(tokens) // CHUNK):
        h.update(raw[k * width:(k + 1) * width])
        yield (k + 1) * CHUNK, h.copy().digest()


def common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(eq=False)
class Prefix:
    ordinal: int  # order of first appearance: the plan's send order follows it
    depth: int  # block depth of the branch point
    parent: Optional["Prefix"]
    tokens: array.array = field(default_factory=lambda: array.array("i"))
    n_requests: int = 0

    def absorb(self, tokens: array.array) -> None:
        if self.n_requests == 0:
            self.tokens = tokens[: self.depth + CHUNK]  # members diverge within the next block (a branch point)
        else:
            del self.tokens[common_prefix(self.tokens, tokens):]
        self.n_requests += 1


@dataclass
class Plan:
    order: list[int]  # request indices in send order
    prefixes: list[Prefix]
    of: list[Optional[Prefix]]  # per request: the innermost prefix it extends (its parent), or None
    ideal: Optional[int]
    prompt_tokens: int


class Planner:
    def __init__(self, min_saving: int = 128, spool_dir: Optional[str] = None):
        self.min_saving = min_saving
        self._spool: BinaryIO = tempfile.TemporaryFile(dir=spool_dir, prefix="kvstore-batch-")
        self._offsets = array.array("q")  # per request: where its tokens are in the spool
        self._counts: dict[bytes, int] = {}
        self.prompt_tokens = 0

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, tokens: list[int]) -> int:
        """Record a request's prompt tokens; returns its index."""
        arr = array.array("i", tokens)
        self._offsets.append(self._spool.tell())
        self._spool.write(struct.pack("<I", len(arr)) + arr.tobytes())
        self.prompt_tokens += len(arr)
        for _, key in chain(arr):
            self._counts[key] = self._counts.get(key, 0) + 1
        return len(self._offsets) - 1

    def _all_tokens(self) -> Iterator[array.array]:
        self._spool.flush()
        self._spool.seek(0)
        for _ in range(len(self._offsets)):
            (n,) = struct.unpack("<I", self._spool.read(4))
            arr = array.array("i")
            arr.frombytes(self._spool.read(4 * n))
            yield arr

    def finish(self) -> Plan:
        nodes: dict[bytes, Prefix] = {}
        of: list[Optional[Prefix]] = []
        keys: list[tuple] = []
        for index, tokens in enumerate(self._all_tokens()):
            links = list(chain(tokens))
            counts = [self._counts[key] for _, key in links]
            chosen: Optional[Prefix] = None
            path: list[int] = []
            for j, (depth, key) in enumerate(links):
                c = counts[j]
                if c < 2 or (j + 1 < len(links) and counts[j + 1] == c):
                    continue  # shared by one request only, or the same requests go on sharing the next block
                base = chosen.depth if chosen else 0
                if (c - 1) * (depth - base) < self.min_saving:
                    continue
                node = nodes.get(key)
                if node is None:
                    node = nodes[key] = Prefix(len(nodes), depth, chosen)
                node.absorb(tokens)
                chosen = node
                path.append(node.ordinal)
            of.append(chosen)
            keys.append((tuple(path), index))
        keys.sort()
        prefixes = sorted(nodes.values(), key=lambda p: p.ordinal)
        return Plan([i for _, i in keys], prefixes, of, self._ideal(), self.prompt_tokens)

    def _ideal(self) -> Optional[int]:
        if len(self._offsets) > IDEAL_LIMIT:
            return None
        # Big-endian unsigned ints compare as bytes like the token lists they encode.
        strings = sorted(struct.pack(f">{len(t)}I", *t) for t in self._all_tokens())
        total, prev = 0, b""
        for s in strings:
            shared = 0
            while shared < min(len(s), len(prev)) // 4 and s[4 * shared:4 * shared + 4] == prev[4 * shared:4 * shared + 4]:
                shared += 1
            total += len(s) // 4 - shared
            prev = s
        return total

    def tokens(self, index: int) -> array.array:
        self._spool.seek(self._offsets[index])
        (n,) = struct.unpack("<I", self._spool.read(4))
        arr = array.array("i")
        arr.frombytes(self._spool.read(4 * n))
        self._spool.seek(0, os.SEEK_END)
        return arr

    def close(self) -> None:
        self._spool.close()
