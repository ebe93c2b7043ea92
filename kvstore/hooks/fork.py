"""States saved at a fork, for models with a recurrent section (hybrid, recurrent): where a named request's prompt
leaves the stored states it shares the most with, the prompt up to that point is evaluated first and stored, so
that the next prompt leaving there continues it (docs/hooks.md "Recurrent models: states at a fork").

Contract: pure decisions and the state's name; nothing is evaluated, saved or restored here. `Broker` evaluates
the prompt's first `point(...)` (or, for a name's first prompt, `guess(...)`) tokens (n_predict 0) in the
request's slot, saves the slot under `name(...)` in the request's namespace (never over a stored name), then
forwards the request, which evaluates the rest.

Why: llama-server continues a recurrent state only at its end, or at a checkpoint it made while evaluating it (4
tokens before the end of each prompt, and at a chat's user-message starts): the state is one value for the whole
sequence, so the store cannot cut it where a prompt leaves it, as it cuts a sliding-window cache (cut.py). So
the questions of one article, named by the article or each by itself, would each evaluate the article again. A
name's first prompt, which leaves nothing stored, stores a state a block before its end on the way (`guess`);
the article's next question extends it all of, and evaluates from there. Where a prompt leaves a stored state a
block or more past what it extends all of (`point`), the state at that fork is stored on the way. Each costs one
save and no token (the prompt is evaluated in two parts); every later prompt leaving there restores it
(`Store.lookup(whole=True)` finds it) and evaluates its own tokens, plus at most a block.
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Optional, Sequence

# The name of a state stored at a fork: the prefix hash names it, so a prompt leaving at the same point finds the
# same name (`Broker` skips the save when it is stored) and the tokens it holds are the name's.
PREFIX = "fork-"


def applies(layout: Optional[str]) -> bool:
    """The server's layout (once known) has a recurrent section: the one test of it (`cut.py` asks it too: such a
    state is never cut)."""
    return "rec[" in (layout or "")


def point(n_prompt: int, shared: int, whole: int, block_size: int) -> Optional[int]:
    """Where to store a state on the way (P), or None. `shared`: the most tokens the prompt shares with a stored or
    resident state it leaves; `whole`: the tokens of the longest state it extends all of (what a restore serves).
    Worth it when the fork is at least two blocks in, a block past what is served whole (a second question's few
    shared words after the article, "Question: What", fork again just past the state at the article), and short
    of the prompt's end (llama-server evaluates at least the last token: the request evaluates the rest)."""
    at = min(shared, n_prompt - 1)
    if at < 2 * block_size or at - whole < block_size:
        return None
    return at


def guess(n_prompt: int, served: int, block_size: int) -> Optional[int]:
    """Where to store a state on the way for a name's first prompt, which leaves nothing stored yet (P), or None:
    a block before its end. The next prompt on the same text (the next question of an article) leaves this one
    where its own tail begins; while that tail is at most a block long, this state is one it extends all of, and
    it evaluates from here (a block at most, then its own tokens) instead of the whole article again. Costs one
    save, no token: the prompt is evaluated in two parts instead of one. Worth it as `point` says."""
    return point(n_prompt, n_prompt - 1 - block_size, served, block_size)


def name(tokens: Sequence[int]) -> str:
    """The stored name of the state holding exactly `tokens`."""
    return PREFIX + hashlib.blake2b(array("i", tokens).tobytes(), digest_size=10).hexdigest()
