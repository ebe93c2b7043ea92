"""Helpers for the hooks tests: a real llama.cpp server (kvstore.engine), the hooks in a background thread,
and a small HTTP client. Everything talks over real HTTP."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvstore.config import sync_dir  # noqa: E402
from kvstore.engine import EmbeddedServer, EngineConfig, wait_healthy  # noqa: E402
from kvstore.models import gemma3_path, smollm2_path  # noqa: E402

MODEL_PATHS = {"smollm2": smollm2_path, "gemma3": gemma3_path}
MODELS = ("smollm2", "gemma3")
CTX = 2048  # 1024 per slot with 2 slots
THREADS = int(os.environ.get("KVSTORE_TEST_THREADS", "0"))


def engine(model: str, store: Optional[Path] = None, *, parallel: int = 2, cache_ram: int = 0,
           ctx: int = CTX, api_key: Optional[str] = None) -> EmbeddedServer:
    """An embedded llama-server; with `store`, its --slot-save-path is <store>/sync."""
    cfg = EngineConfig(model=str(MODEL_PATHS[model]()), parallel=parallel, ctx_size=ctx, cache_ram=cache_ram,
                       slot_save_path=str(sync_dir(store)) if store is not None else None, threads=THREADS,
                       api_key=api_key)
    srv = EmbeddedServer(cfg)
    wait_healthy(srv.url)
    return srv


def tiny_engine(arch: str, store: Path, models: Path) -> EmbeddedServer:
    """An embedded llama-server on a seeded tiny model of `arch` (tests/tinymodels.py: no hybrid or recurrent GGUF
    ships on PyPI), written into `models` unless $KVSTORE_TINY_MODELS holds it; its --slot-save-path is
    <store>/sync."""
    from tinymodels import tiny_model_path

    path = tiny_model_path(arch, Path(os.environ.get("KVSTORE_TINY_MODELS") or models))
    cfg = EngineConfig(model=str(path), parallel=2, ctx_size=2048, cache_ram=0, threads=2, ubatch_size=256,
                       slot_save_path=str(sync_dir(store)))
    srv = EmbeddedServer(cfg)
    wait_healthy(srv.url)
    return srv


def hooks(upstream: str, store: Path, **kw):
    """The hooks app on a free port, in a background thread. `.url`, `.close()` (saves dirty slots)."""
    from kvstore.hooks.app import HooksConfig
    from kvstore.hooks.serve import Running

    kw.setdefault("idle_save", 0)
    # The tests of the restore paths pin them: the measured rates of a loaded machine must not choose for them
    # (tests/hooks/test_hooks_cost.py tests the default policy, "cost").
    kw.setdefault("restore_policy", "always")
    return Running(HooksConfig(upstream=upstream, store=Path(store), **kw))


@dataclass
class Reply:
    status: int
    headers: Any
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def kind(self) -> Optional[str]:
        return self.headers.get("X-KV-Cache")

    @property
    def timings(self) -> dict:
        return self.json.get("timings") or {}

    @property
    def prompt_n(self) -> int:
        return int(self.timings["prompt_n"])


def request(url: str, method: str = "GET", body: Any = None, headers: Optional[dict] = None,
            timeout: float = 300) -> Reply:
    data = json.dumps(body).encode() if body is not None else None
    h = {"Content-Type": "application/json"} if data is not None else {}
    h.update(headers or {})
    req = urllib.request.Request(url, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Reply(r.status, r.headers, r.read())
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.headers, e.read())


def post(base: str, path: str, body: Any = None, headers: Optional[dict] = None) -> Reply:
    return request(base + path, "POST", body if body is not None else {}, headers)


def get(base: str, path: str, headers: Optional[dict] = None) -> Reply:
    return request(base + path, "GET", None, headers)


def tokens_for(seconds: float, upstream: str, headers: Optional[dict] = None, at_most: int = 1800) -> int:
    """How many tokens llama-server at `upstream` generates in about `seconds` now (from a short generation's
    `timings`, slot 0 erased after it), at least 100 and at most `at_most`. For a test that needs a request to run
    longer than some bound: a fixed count long enough for a fast machine runs for a minute on a slow one, and an
    abandoned request may go on that long after its client left."""
    r = post(upstream, "/completion", {"prompt": "Once upon a time", "n_predict": 48, "ignore_eos": True,
                                       "temperature": 0, "id_slot": 0}, headers)
    assert r.status == 200, r.body[:300]
    erased = post(upstream, "/slots/0?action=erase", {}, headers)
    assert erased.status == 200, erased.body[:300]
    return max(100, min(at_most, int(r.json["timings"]["predicted_per_second"] * seconds)))


def complete(base: str, prompt: Any, *, name: Optional[str] = None, parent: Optional[str] = None,
             n_predict: int = 8, headers: Optional[dict] = None, **extra) -> Reply:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1, "seed": 1}
    if name is not None:
        body["cache_prompt_name"] = name
    if parent is not None:
        body["cache_prompt_parent"] = parent
    body.update(extra)
    r = post(base, "/completion", body, headers)
    assert r.status == 200, (r.status, r.body[:500])
    return r


def kept_slot_continuation(base: str, prompt: str, reply: str, follow: str, n_predict: int, slot: int = 0) -> str:
    """What a plain llama-server that kept a conversation in its slot answers next: `prompt` answered in `slot` (the
    answer must be `reply`: the same settings answer a single request the same), then `follow` (prompt + reply +
    the next turn) in that slot. A restored state reproduces this path: its reply cells were computed while
    generating. A whole-prompt evaluation computes them in one batch instead, and splits from it at near ties:
    measured on a plain server alone, 2 of 16 conversations, at margins 0.0009 and 0.0055."""
    first = complete(base, prompt, n_predict=n_predict, id_slot=slot)
    assert first.json["content"] == reply, (first.json["content"], reply)
    return complete(base, follow, n_predict=n_predict, id_slot=slot).json["content"]


def wait_idle(table: Any, seconds: float = 30) -> None:
    """Until no slot of the hooks' table is busy: a reply's last bytes reach the client just before its handler
    marks the slot and ends its lease, so the table is read once every lease has ended."""
    deadline = time.monotonic() + seconds
    while any(s.busy for s in table.slots):
        assert time.monotonic() < deadline, "a slot stayed busy after every reply had arrived"
        time.sleep(0.02)


def tokenize(base: str, text: str) -> list[int]:
    r = post(base, "/tokenize", {"content": text, "add_special": True, "parse_special": True})
    assert r.status == 200, r.body
    return r.json["tokens"]


def metric(base: str, name: str, labels: str = "", headers: Optional[dict] = None) -> float:
    text = get(base, "/metrics", headers).body.decode()
    for line in text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.split()[-1])
    raise KeyError(name + labels)


@contextlib.contextmanager
def stack(*objs):
    """Close servers in reverse order, even on failure."""
    try:
        yield objs
    finally:
        for o in reversed(objs):
            with contextlib.suppress(Exception):
                o.close()


# ---- texts ------------------------------------------------------------------------------------------------------
_FACTS = [
    "keeps a small garden with tomatoes and basil behind the house",
    "learned to play the violin as a child and still practises every evening",
    "works at a library that opens early on weekdays",
    "once cycled from the coast to the mountains in a single summer",
    "collects old maps of harbour towns and frames the best ones",
    "bakes bread every Sunday morning for the neighbours",
    "is planning a trip to see the northern lights next winter",
    "volunteers at the animal shelter on Saturdays",
    "is learning to speak Portuguese with an app and a tutor",
    "repairs old radios in a workshop in the basement",
]
_PEOPLE = [("Alice", "teacher", "Lisbon"), ("Bruno", "carpenter", "Oslo"), ("Chen", "nurse", "Toronto"),
           ("Dana", "pilot", "Nairobi"), ("Emil", "chef", "Krakow"), ("Farah", "engineer", "Cairo"),
           ("Goran", "painter", "Zagreb"), ("Hana", "doctor", "Kyoto"), ("Ivan", "baker", "Sofia"),
           ("Julia", "lawyer", "Madrid"), ("Kofi", "farmer", "Accra"), ("Lena", "author", "Vienna")]
QUESTIONS = ["What is my name?", "Which city do I live in?", "What do I do on Sundays?",
             "Suggest a short name for my dog."]


def intro(i: int) -> str:
    name, job, city = _PEOPLE[i]
    facts = [_FACTS[(i * 3 + k) % len(_FACTS)] for k in range(3)]
    body = " ".join(f"{name} {f}." for f in facts)
    return (f"{name} is a {job} who lives in {city}. {body} "
            f"The following is a conversation between {name} and a helpful assistant.\n")


def turn_prompt(history: str, question: str) -> str:
    return f"{history}User: {question}\nAssistant:"
