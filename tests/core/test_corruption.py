"""Corruption: a damaged or missing object is found by verify, fails only the states that use it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, manifests_by_name, object_path

from kvstore import CorruptObject


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def _unique_objects(store_dir, mine: str, other: str) -> list[str]:
    m = manifests_by_name(store_dir)
    theirs = set(m[other]["blocks"]) | {m[other]["skeleton"], m[other]["_id"]}
    return [o for o in m[mine]["blocks"] if o not in theirs]


@pytest.mark.parametrize("damage", ["flip-payload", "flip-header", "truncate", "delete"])
def test_damaged_object(damage, store, state_files, tmp_path):
    d = tmp_path / "store"
    x, y = state_files["smollm2_fa_on"], state_files["gemma3_np2_slot1"]
    store.ingest("x", str(x))
    store.ingest("y", str(y))
    assert store.verify()["corrupt"] == [] and store.verify()["missing"] == []
    victim = _unique_objects(d, "x", "y")[0]
    p = object_path(d, victim)
    assert p.is_file()
    os.chmod(p, 0o644)
    data = bytearray(p.read_bytes())
    if damage == "flip-payload":
        data[16 + (len(data) - 16) // 2] ^= 0x01
        p.write_bytes(bytes(data))
    elif damage == "flip-header":
        data[8] ^= 0x01  # raw_len
        p.write_bytes(bytes(data))
    elif damage == "truncate":
        p.write_bytes(bytes(data[: len(data) // 2]))
    else:
        p.unlink()

    r = store.verify()
    bad = (r["corrupt"] if damage != "delete" else r["missing"])
    assert victim in bad, r
    assert any("x" == n or (isinstance(n, dict) and n.get("name") == "x") or "x" in str(n)
               for n in r["names_affected"]), r
    cli = _cli("--store", str(d), "verify")
    assert cli.returncode == 1, (cli.stdout, cli.stderr)
    assert victim[:8] in cli.stdout
    cli_json = _cli("--store", str(d), "--json", "verify")
    assert cli_json.returncode == 1

    out = tmp_path / "x.bin"
    with pytest.raises(CorruptObject) as e:
        store.materialize("x", str(out))
    assert "verify" in str(e.value) or victim[:8] in str(e.value)
    assert not out.exists()
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".tmp") or f.name.startswith("x.bin")]
    out_y = tmp_path / "y.bin"
    # A local store's restore is checked by the file's xxh3 (store/file_check.rs), which found the damage above.
    assert store.materialize("y", str(out_y))["verified_by"] == "file xxh3"
    assert out_y.read_bytes() == y.read_bytes()


def test_corrupt_object_is_repaired_by_the_next_ingest_of_the_same_content(store, state_files, tmp_path):
    """Content addressing would keep reusing a corrupt file (the id is present, so the write is skipped);
    a failed read moves it aside, so saving the same state again rewrites it and the name restores again."""
    src = state_files["smollm2_fa_on"]
    store.ingest("a", str(src))
    objects = [p for p in Path(store.path, "objects").glob("??/*") if p.is_file()]
    victim = max(objects, key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[-10] ^= 0xFF
    os.chmod(victim, 0o644)
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptObject) as e:
        store.materialize("a", str(tmp_path / "x.bin"))
    assert "quarantine" in str(e.value)
    assert not victim.exists() and any(Path(store.path, "objects", ".quarantine").iterdir())
    report = store.ingest("a", str(src))
    assert report["new_objects"] >= 1
    store.materialize("a", str(tmp_path / "y.bin"))
    assert (tmp_path / "y.bin").read_bytes() == src.read_bytes()
    assert not store.verify()["corrupt"] and not store.verify()["missing"]


def test_object_that_decodes_to_other_bytes_is_found_by_the_file_hash(store, state_files, tmp_path):
    """A local materialize verifies a state by its file hash rather than hashing every object as well; an object
    that still decodes, but to other bytes (here the file of another block of the same raw length in its place), makes
    that hash fail, and the objects are then read again hashed: the bad one is quarantined and named."""
    src = state_files["smollm2_child"]
    store.ingest("a", str(src))
    d = Path(store.path)
    blocks = manifests_by_name(d)["a"]["blocks"]
    by_size: dict = {}
    for b in dict.fromkeys(blocks):
        raw_len = object_path(d, b).read_bytes()[8:16]  # the KVOB header's raw length
        by_size.setdefault(raw_len, []).append(b)
    victim, other = next(v for v in by_size.values() if len(v) >= 2)[:2]
    p = object_path(d, victim)
    os.chmod(p, 0o644)
    p.write_bytes(object_path(d, other).read_bytes())
    out = tmp_path / "a.bin"
    with pytest.raises(CorruptObject) as e:
        store.materialize("a", str(out))
    assert e.value.object_id == victim and "quarantine" in str(e.value)
    assert not out.exists() and not [f for f in tmp_path.iterdir() if f.name.startswith(".")]
    assert not p.exists() and any((d / "objects" / ".quarantine").iterdir())
    store.ingest("a", str(src))  # the same content repairs it
    store.materialize("a", str(out))
    assert out.read_bytes() == src.read_bytes()
