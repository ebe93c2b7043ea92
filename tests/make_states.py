#!/usr/bin/env python3
"""Produce real llama.cpp slot-save files (`ggsq` v4) for the format tests.

    python3 tests/make_states.py OUT_DIR [NAME ...]        # all cases, or only the named ones
    KVSTORE_STATE_DIR=OUT_DIR cargo test ...                # then the Rust format tests read every *.bin there

Importable: `make_states(out_dir, which=None) -> list[Path]`.

Every file comes from an embedded llama-server (kvstore.engine.EmbeddedServer) driven over HTTP only:
POST /completion (id_slot, cache_prompt, temperature 0, a few predicted tokens), then
POST /slots/{id}?action=save / action=restore. Prompts are kept short (<= ~400 tokens) so that the
whole run takes a couple of minutes on two CPU cores.

Cases (file name = case name + ".bin"):
  {m}_fa_on         flash attention on, 1 slot                        (v_trans 0)
  {m}_fa_off        flash attention off, 1 slot                       (v_trans 1, transposed V)
  {m}_q8            q8_0/q8_0 cache, fa on                            (quantized rows, n_rot_k/n_rot_v != 0)
  {m}_np2_slot1     2-slot server, saved from slot 1                  (n_stream 2, cells in stream 1)
  {m}_empty         2-slot server, slot 0 never used                  (40-byte empty file)
  {m}_parent        article (~300 tokens)                             (gemma3: SCKP checkpoint appendix)
  {m}_child         parent restored via action=restore, then article + question
with m in {smollm2, gemma3}. The gemma3 parent/child files carry SCKP checkpoints (prompt > ~300 tokens).
"""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvstore.engine import EmbeddedServer, EngineConfig, wait_healthy  # noqa: E402
from kvstore.models import gemma3_path, smollm2_path  # noqa: E402

SHORT = "The quick brown fox jumps over the lazy dog. Write one more sentence about the fox:"

ARTICLE = (
    "Lighthouses have guided sailors along dangerous coasts for more than two thousand years. The most famous "
    "ancient example, the Pharos of Alexandria, stood on a small island at the entrance of the harbour and was "
    "counted among the seven wonders of the world. Its fire burned at the top of a tower that may have been over "
    "one hundred metres tall, and travellers described seeing its light from far out at sea. Medieval lighthouses "
    "were usually simple towers with an open fire or a few candles, and their light was weak and unreliable. The "
    "great change came in the early nineteenth century, when the French physicist Augustin Fresnel designed a lens "
    "made of many concentric rings of glass prisms. A Fresnel lens bent the light of a single lamp into a narrow, "
    "powerful beam that could be seen more than twenty miles away, and it was far lighter than a solid lens of the "
    "same size. Within a few decades nearly every major lighthouse in Europe and America used one. Keepers lived "
    "at the stations with their families, trimmed the wicks, wound the clockwork that turned the lens, and kept "
    "logbooks of the weather and passing ships. The work was lonely and often dangerous, especially on rock "
    "stations far from shore, where storms could cut a keeper off from the mainland for weeks. During the "
    "twentieth century electric lamps, automatic timers and radio beacons replaced most of these duties, and the "
    "last keepers left their towers. Today satellite navigation tells a ship its position within a few metres, "
    "yet many lighthouses still shine every night, as a backup for sailors and as a reminder of a long tradition."
)
QUESTION = " Question: Who designed the lens that made lighthouse beams visible from far away? Answer:"

ALL_CASES = [f"{m}_{c}" for m in ("smollm2", "gemma3")
             for c in ("fa_on", "fa_off", "q8", "np2_slot1", "empty", "parent", "child")]


def _post(url: str, body: dict, timeout: float = 600.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"POST {url} -> {e.code}: {e.read()[:500]!r}") from None


def _complete(url: str, prompt: str, slot: int, n_predict: int = 4) -> dict:
    return _post(url + "/completion", {"prompt": prompt, "id_slot": slot, "cache_prompt": True,
                                       "n_predict": n_predict, "temperature": 0.0, "seed": 1})


def _save(url: str, slot: int, name: str) -> dict:
    return _post(f"{url}/slots/{slot}?action=save", {"filename": name})


def _restore(url: str, slot: int, name: str) -> dict:
    return _post(f"{url}/slots/{slot}?action=restore", {"filename": name})


class _Server:
    def __init__(self, model: Path, out: Path, **kw):
        cfg = EngineConfig(model=str(model), slot_save_path=str(out), cache_ram=0, threads=2,
                           ubatch_size=256, **kw)
        self.srv = EmbeddedServer(cfg)
        wait_healthy(self.srv.url)
        self.url = self.srv.url

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.srv.close()


def make_states(out_dir, which=None) -> list[Path]:
    """Write the requested cases (default: all of ALL_CASES) into out_dir; return the files written."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    want = set(ALL_CASES if which is None else which)
    unknown = want - set(ALL_CASES)
    if unknown:
        raise ValueError(f"unknown case(s) {sorted(unknown)}; known: {ALL_CASES}")
    written: list[Path] = []

    def done(name: str, reply: dict) -> None:
        p = out / name
        if not p.is_file():
            raise RuntimeError(f"save of {name} reported {reply} but no file appeared")
        written.append(p)
        print(f"  {name}: {p.stat().st_size} bytes, n_saved {reply.get('n_saved')}", flush=True)

    for m, path_fn in (("smollm2", smollm2_path), ("gemma3", gemma3_path)):
        cases = {c[len(m) + 1:] for c in want if c.startswith(m + "_")}
        if not cases:
            continue
        model = path_fn()
        print(f"{m}: {model}", flush=True)
        # fa on, 2 slots: slot-1 save, empty slot 0, parent/child in slot 1 (slot 0 stays empty until the end)
        if cases & {"fa_on", "np2_slot1", "empty", "parent", "child"}:
            with _Server(model, out, parallel=2, ctx_size=4096, flash_attn="on") as s:
                if "empty" in cases:
                    done(f"{m}_empty.bin", _save(s.url, 0, f"{m}_empty.bin"))
                if "np2_slot1" in cases:
                    _complete(s.url, SHORT, 1, n_predict=8)
                    done(f"{m}_np2_slot1.bin", _save(s.url, 1, f"{m}_np2_slot1.bin"))
                if cases & {"parent", "child"}:
                    _complete(s.url, ARTICLE, 1, n_predict=4)
                    done(f"{m}_parent.bin", _save(s.url, 1, f"{m}_parent.bin"))
                    if "child" in cases:
                        _complete(s.url, SHORT, 1, n_predict=2)  # clobber the slot, then restore the parent
                        r = _restore(s.url, 1, f"{m}_parent.bin")
                        if not r.get("n_restored"):
                            raise RuntimeError(f"restore of the parent failed: {r}")
                        _complete(s.url, ARTICLE + QUESTION, 1, n_predict=6)
                        done(f"{m}_child.bin", _save(s.url, 1, f"{m}_child.bin"))
            if "fa_on" in cases:
                with _Server(model, out, parallel=1, ctx_size=2048, flash_attn="on") as s:
                    _complete(s.url, SHORT, 0, n_predict=8)
                    done(f"{m}_fa_on.bin", _save(s.url, 0, f"{m}_fa_on.bin"))
        if "fa_off" in cases:
            with _Server(model, out, parallel=1, ctx_size=2048, flash_attn="off") as s:
                _complete(s.url, SHORT, 0, n_predict=8)
                done(f"{m}_fa_off.bin", _save(s.url, 0, f"{m}_fa_off.bin"))
        if "q8" in cases:
            with _Server(model, out, parallel=1, ctx_size=2048, flash_attn="on",
                         cache_type_k="q8_0", cache_type_v="q8_0") as s:
                _complete(s.url, SHORT, 0, n_predict=8)
                done(f"{m}_q8.bin", _save(s.url, 0, f"{m}_q8.bin"))
    return written


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    files = make_states(argv[0], argv[1:] or None)
    print(f"wrote {len(files)} file(s) to {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
