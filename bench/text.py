"""Seeded, deterministic English-like text, so every target sees the same prompts."""
from __future__ import annotations

import random

_WORDS = (
    "the of and to in is was that for on as with by it at from his an were are which this be or has had not "
    "but one their they its first new after two other been more also who all would when city during over only "
    "into under between most time year people river school team village town state world about many some "
    "known these years including through where while later then there those government early system because "
    "same part used since than each both work several number second three could high well family music "
    "history house water north south near long small large local public national station line church war "
    "game series album film book company area place member group season field power center road market "
    "island council region design model study report energy light stone bridge garden harbor valley forest"
).split()


def sentence(rng: random.Random, n_min: int = 8, n_max: int = 18) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(n_min, n_max))]
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


def paragraph(rng: random.Random, n_words: int) -> str:
    """About `n_words` words (roughly 1.3 tokens each for these models)."""
    out, count = [], 0
    while count < n_words:
        s = sentence(rng)
        out.append(s)
        count += s.count(" ") + 1
    return " ".join(out)


def question(rng: random.Random) -> str:
    return "What does the text say about the " + rng.choice(_WORDS) + " and the " + rng.choice(_WORDS) + "?"
