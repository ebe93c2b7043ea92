"""The benchmark command keeps working: `python -m bench smoke` end to end on the real server (SmolLM2).

Token counts are stable, so the smoke run also checks the claims the README table makes, at a small scale:
with named parents kvstore evaluates about the ideal number of prompt tokens; storage round-trips byte-exactly
(bench/storage.py asserts it) and stores a parent + children family in far fewer bytes than the raw files.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT


# The whole bench command (every target started fresh) takes ~5 min on 2 idle cores; the subprocess has its
# own 900 s bound, so pytest's per-test default (600 s) must not cut it first on a loaded machine.
@pytest.mark.timeout(1000)
def test_bench_smoke(tmp_path):
    out = tmp_path / "smoke.json"
    r = subprocess.run([sys.executable, "-m", "bench", "smoke", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = {(w["workload"], w["target"]): w for w in res["models"]["smollm2"]["workloads"]}
    assert "| W1 | kvstore serve |" in r.stdout  # the table is printed
    for order in ("article-major", "question-major"):
        kv = rows[(f"W2 {order} +parents", "kvstore serve")]
        assert kv["prompt_n"] <= 1.1 * kv["ideal"], kv
    w1 = rows[("W1", "kvstore serve")]
    assert w1["prompt_n"] <= 1.05 * w1["ideal"], w1
    # The same users as chat clients send them (the model's template, the reply carried back as text), on OpenAI's
    # chat completions and Anthropic's Messages API: every returning turn continues its stored state.
    for api in ("chat completions", "Messages API"):
        kv = rows[(f"W1 {api}", "kvstore serve")]
        assert kv["prompt_n"] <= 1.05 * kv["ideal"], kv
        assert kv["kv_cache"].get("miss", 0) <= kv["requests"] - kv["returning"], kv
        assert rows[(f"W1 {api}", "llama-server")]["prompt_n"] > kv["prompt_n"], kv
    st = res["models"]["smollm2"]["storage"]
    assert st["raw_over_stored"] > 2.0, st
    sw = res["models"]["smollm2"]["slotwait"]  # llama-server's slot save: idle, beside a generation, a prompt
    assert all(sw[k] > 0 for k in ("save_idle_ms", "save_while_generating_ms", "save_while_prompt_ms")), sw
    assert "llama-server's slot save" in r.stdout
