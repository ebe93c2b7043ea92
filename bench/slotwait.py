"""How long llama-server takes to answer a slot save while its other slot is busy: the wait a restore path pays.

llama-server answers `/slots/{id}?action=save|restore` between two of its decode steps: while it decodes (a batch
of another slot's prompt, up to `-b` tokens, or one token of its generation) such a task waits (server-queue.cpp
`yield_to_queue` declines it until the step ends). A returning user's request moves a state out of and into its
slot with two such actions, where plain llama-server has only the completion itself, so under load its time to
first token pays up to two of the other slots' steps. Measured here on the embedded server, one slot holding a
saved prompt: a save with the server idle, while the other slot generates, and while it evaluates a long prompt.
"""
from __future__ import annotations

import random
import statistics
import threading
import time
from pathlib import Path

from kvstore.engine import EmbeddedServer, EngineConfig

from . import text
from .client import post_json


def _save_ms(url: str) -> float:
    t0 = time.perf_counter()
    post_json(url + "/slots/0?action=save", {"filename": "s.bin"})
    return (time.perf_counter() - t0) * 1000


def _while(url: str, body: dict, delay: float) -> tuple[float, float]:
    """A save of slot 0 `delay` s after slot 1 started `body`; (save ms, slot 1's prompt ms)."""
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(r=post_json(url + "/completion", {**body, "id_slot": 1})))
    th.start()
    time.sleep(delay)
    ms = _save_ms(url)
    th.join()
    return ms, float(out["r"]["timings"]["prompt_ms"])


def run(model: str, work: Path, ctx_size: int, prompt_words: int = 700, repeats: int = 3) -> dict:
    cfg = EngineConfig(model=model, parallel=2, ctx_size=ctx_size, slot_save_path=str(work), cache_ram=0)
    rng = random.Random(5)
    with EmbeddedServer(cfg) as srv:
        u = srv.url
        post_json(u + "/completion", {"prompt": text.paragraph(rng, 200), "n_predict": 0, "id_slot": 0,
                                      "cache_prompt": True})
        idle = [_save_ms(u) for _ in range(repeats)]
        generating = [_while(u, {"prompt": f"Tell a story, part {i}.", "n_predict": 48, "ignore_eos": True,
                                 "cache_prompt": False}, 0.15)[0] for i in range(repeats)]
        prompting = [_while(u, {"prompt": text.paragraph(random.Random(100 + i), prompt_words), "n_predict": 1,
                                "cache_prompt": False}, 0.05) for i in range(repeats)]
    med = lambda xs: round(statistics.median(xs), 1)  # noqa: E731
    return {"save_idle_ms": med(idle), "save_while_generating_ms": med(generating),
            "save_while_prompt_ms": med([p[0] for p in prompting]),
            "other_prompt_ms": med([p[1] for p in prompting]), "prompt_words": prompt_words, "n_batch": 2048}


def line(r: dict) -> str:
    return (f"\nllama-server's slot save (`bench/slotwait.py`): {r['save_idle_ms']} ms with the server idle, "
            f"{r['save_while_generating_ms']} ms while the other slot generates, {r['save_while_prompt_ms']} ms "
            f"while it evaluates a {r['prompt_words']}-word prompt (which took {r['other_prompt_ms']:.0f} ms): a slot "
            f"action waits for the other slots' decode step under way.")
