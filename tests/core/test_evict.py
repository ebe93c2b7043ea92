"""Eviction to a size on real slot files: `kvstore gc --max-size` plans (a dry run lists the victims and changes
nothing), then evicts least recently used names down to the low-water mark; a parent whose blocks its children share
outlives an unrelated older name; pins and a pin over the cap; and an evictor killed with SIGKILL at any point leaves
every kept name byte-exact, `verify` clean, and a re-run finishes."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

import kvstore
from kvstore import StoreFull

# Distinct states (no two share their blocks: other models or cache types), oldest first.
DISTINCT = ["smollm2_fa_on", "gemma3_fa_on", "smollm2_q8", "gemma3_q8"]
# Plus states sharing most blocks with one of them (the same prompt saved from a two-slot server).
CASES = DISTINCT + ["smollm2_np2_slot1", "gemma3_np2_slot1"]

EVICT_CHILD = r"""
import sys
import kvstore
st = kvstore.open_store(sys.argv[1])
print("ready", flush=True)
r = st.evict(max_bytes=int(sys.argv[2]))
print("done", len(r["plan"]["victims"]), flush=True)
"""


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def fill(st, state_files, cases=DISTINCT) -> dict:
    names = {}
    for c in cases:
        st.ingest(c, str(state_files[c]))
        names[c] = state_files[c]
        time.sleep(0.01)  # distinct last_used
    return names


def test_gc_max_size_plans_then_evicts_oldest_and_keeps_the_rest_exact(state_files, tmp_path):
    d = tmp_path / "store"
    st = kvstore.open_store(d)
    names = fill(st, state_files)
    st.touch("smollm2_fa_on")  # the oldest is now the most recently used
    used = st.stats()["stored_bytes"]
    cap = used // 2
    dry = cli("--store", str(d), "--json", "gc", "--max-size", str(cap), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["plan"]
    victims = [v["name"] for v in plan["victims"]]
    assert victims and victims[0] == "gemma3_fa_on" and "smollm2_fa_on" not in victims, victims
    assert len(st.list()) == len(DISTINCT), "a dry run changes nothing"
    text = cli("--store", str(d), "gc", "--max-size", str(cap))
    assert text.returncode == 0, text.stderr
    assert "names evicted" in text.stdout and "gemma3_fa_on" in text.stdout, text.stdout
    kept = {i["name"] for i in st.list()}
    assert kept == set(names) - set(victims), (kept, victims)
    assert st.stats()["stored_bytes"] <= cap * 0.9
    for n in kept:
        out = tmp_path / f"{n}.bin"
        st.materialize(n, str(out))
        assert out.read_bytes() == names[n].read_bytes(), n
    bad = cli("--store", str(d), "gc", "--max-size", "lots")
    assert bad.returncode != 0 and "--max-size" in bad.stderr, bad.stderr
    assert {i["name"] for i in st.list()} == kept, "a bad input changes nothing"


def test_a_parent_its_children_share_outlives_an_unrelated_older_name(state_files, tmp_path):
    st = kvstore.open_store(tmp_path / "store")
    st.ingest("unrelated", str(state_files["gemma3_fa_on"]))
    time.sleep(0.01)
    st.ingest("article", str(state_files["smollm2_parent"]))
    time.sleep(0.01)
    st.ingest("question", str(state_files["smollm2_child"]), parent="article")
    used = st.stats()["stored_bytes"]
    plan = st.evict(max_bytes=used - 1, dry_run=True)["plan"]
    # The question owns its own tokens' blocks; the article owns almost nothing while the question is kept.
    assert [v["name"] for v in plan["victims"]][:1] == ["unrelated"], plan["victims"]
    everything = st.evict(max_bytes=1, dry_run=True)["plan"]["victims"]
    order = [v["name"] for v in everything]
    assert order.index("question") < order.index("article"), order


def test_pins_survive_and_a_pin_over_the_cap_is_refused(state_files, tmp_path):
    d = tmp_path / "store"
    st = kvstore.open_store(d)
    fill(st, state_files)
    r = cli("--store", str(d), "pin", "smollm2_fa_on")
    assert r.returncode == 0, r.stderr
    assert st.get("smollm2_fa_on")["pinned"] is True
    one = st.evict(max_bytes=1, dry_run=True)["plan"]["pinned_bytes"]
    with pytest.raises(StoreFull, match="over the store's cap"):
        st.set_retention("gemma3_fa_on", pinned=True, max_bytes=one + 1)
    assert st.get("gemma3_fa_on")["pinned"] is False
    refused = cli("--store", str(d), "pin", "gemma3_fa_on", "--max-size", str(one + 1))
    assert refused.returncode != 0 and "unpin another name" in refused.stderr, refused.stderr
    r = st.evict(max_bytes=1)
    assert r["plan"]["unmet"] is True
    assert [i["name"] for i in st.list()] == ["smollm2_fa_on"]
    assert cli("--store", str(d), "unpin", "smollm2_fa_on").returncode == 0
    st.evict(max_bytes=1)
    assert st.list() == []
    assert cli("--store", str(d), "pin", "nope").returncode != 0


def test_an_evictor_killed_at_any_point_loses_no_kept_name(state_files, tmp_path):
    d = tmp_path / "store"
    st = kvstore.open_store(d)
    rng = random.Random(15)
    kills = landed = 0
    for rnd in range(22):
        names = fill(st, state_files, rng.sample(CASES, 4))
        files = {i["name"]: state_files[i["name"]] for i in st.list()}
        cap = st.stats()["stored_bytes"] // 3
        p = subprocess.Popen([sys.executable, "-c", EVICT_CHILD, str(d), str(cap)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        time.sleep(rng.uniform(0, 0.03))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate(timeout=60)
        kills += 1
        landed += "done" not in out
        v = st.verify()
        assert v["corrupt"] == [] and v["missing"] == [], (rnd, v)
        for i in st.list():  # every name left is whole
            o = tmp_path / "check.bin"
            st.materialize(i["name"], str(o))
            assert o.read_bytes() == files[i["name"]].read_bytes(), (rnd, i["name"])
        del names
    assert kills >= 20 and landed >= 5, (kills, landed)
    # A re-run finishes and the store is within the cap.
    cap = st.stats()["stored_bytes"] // 3
    r = st.evict(max_bytes=cap)
    assert r["plan"]["after_bytes"] <= cap and st.stats()["stored_bytes"] <= cap
    assert cli("--store", str(d), "verify").returncode == 0
