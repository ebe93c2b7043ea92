"""Bad files at the door: what is not a regular file (never opened blocking, never read), an empty slot, and real
slot files with flipped header bytes are refused with a FormatError that says where and what to do; the CLI
exits 2 with one line on stderr; nothing is stored."""
from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys

import pytest

from conftest import ROOT, tree_snapshot

from kvstore import FormatError
from kvstore.api import hash_file, inspect_state


def _limits():
    # A reader that does not stop fails here in seconds instead of exhausting the machine's memory.
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))


def kv(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, preexec_fn=_limits)


def refused_by_cli(store_dir, path, name="x") -> str:
    """`kvstore ingest PATH` exits 2 with exactly one line on stderr and nothing on stdout; returns the line."""
    r = kv("--store", store_dir, "ingest", path, "--name", name)
    assert r.returncode == 2, (path, r.returncode, r.stdout, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvstore: error: "), r.stderr
    assert r.stdout == ""
    return lines[0]


def assert_store_empty(store_dir):
    r = kv("--store", store_dir, "--json", "stats")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["names"] == 0
    assert not [k for k in tree_snapshot(store_dir / "objects") if not k.endswith("/")]


def test_what_is_not_a_regular_file_is_refused_without_reading(tmp_path, store):
    fifo = tmp_path / "fifo.bin"
    os.mkfifo(fifo)
    d = tmp_path / "dir.bin"
    d.mkdir()
    cases = {"/dev/zero": "character device", str(fifo): "FIFO", str(d): "directory"}
    for path, kind in cases.items():
        line = refused_by_cli(tmp_path / "store", path)  # a FIFO would block, /dev/zero would fill memory
        assert kind in line and path in line and "not a regular file" in line and "--slot-save-path" in line, line
        for call in (lambda: store.ingest("x", path), lambda: inspect_state(path), lambda: hash_file(path)):
            with pytest.raises(FormatError, match=kind):
                call()
    assert_store_empty(tmp_path / "store")
    assert store.get("x") is None


def test_a_large_file_of_something_else_costs_its_head(tmp_path, store):
    big = tmp_path / "zeros.bin"
    with open(big, "wb") as f:
        f.truncate(64 << 30)  # sparse: 64 GiB of zeros, more than this machine's memory
    line = refused_by_cli(tmp_path / "store", big)
    assert "not a llama.cpp slot file" in line, line
    with pytest.raises(FormatError, match="magic"):
        store.ingest("x", str(big))
    assert_store_empty(tmp_path / "store")


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_an_empty_slot_is_not_stored(model, state_files, tmp_path, store, oracle):
    src = state_files[f"{model}_empty"]
    assert oracle.parse(src.read_bytes())["tokens"]["n_tokens"] == 0
    line = refused_by_cli(tmp_path / "store", src)
    assert "0 tokens" in line and "empty slot" in line and "nothing to store" in line, line
    assert_store_empty(tmp_path / "store")
    for call in (lambda: store.ingest("e", str(src)), lambda: store.ingest_bytes("e", src.read_bytes())):
        with pytest.raises(FormatError, match="0 tokens"):
            call()
    assert store.get("e") is None and store.stats()["names"] == 0
    assert inspect_state(str(src))["n_tokens"] == 0  # still a valid file: only storing it is refused


def _flips(data: bytes, oracle) -> list[tuple[str, int, int]]:
    """(label, byte offset to flip, offset the error must name) for the layer-header fields of every section."""
    out = []
    for si, sec in enumerate(oracle.parse(data)["sections"]):
        for st in sec["streams"]:
            if not st["cell_count"]:
                continue
            first = st["K"][0]["hdr"]
            for b in range(4):  # n_rot_k, n_rot_v sit just before the first K header
                out.append((f"s{si} n_rot_k byte {b}", first - 8 + b, first - 8))
                out.append((f"s{si} n_rot_v byte {b}", first - 4 + b, first - 4))
            for kv_ in ("K", "V"):
                for li in (0, len(st[kv_]) - 1):
                    h = st[kv_][li]["hdr"]
                    for b in range(4):
                        out.append((f"s{si} {kv_}{li} type byte {b}", h + b, h))
                    out.append((f"s{si} {kv_}{li} size byte 0", h + 4, h + 4))
    return out


@pytest.mark.parametrize("case", ["smollm2_fa_on", "smollm2_fa_off", "gemma3_q8", "gemma3_np2_slot1"])
def test_flipped_header_bytes_are_refused_naming_the_offset(case, state_files, tmp_path, store, oracle):
    """K/V type codes llama.cpp does not define, row/element sizes that do not fit the type, rotations that are
    not a power of two dividing the layer: each single flipped byte (x ^ 0xFF) of those fields is refused."""
    data = state_files[case].read_bytes()
    flips = _flips(data, oracle)
    assert len(flips) >= 26
    f = tmp_path / "bad.bin"
    for label, at, named in flips:
        b = bytearray(data)
        b[at] ^= 0xFF
        f.write_bytes(bytes(b))
        for call in (lambda: store.ingest("bad", str(f)), lambda: store.ingest_bytes("bad", bytes(b))):
            with pytest.raises(FormatError) as e:
                call()
            assert f"at byte {named}:" in str(e.value), (case, label, str(e.value))
            assert "the file is damaged" in str(e.value), (case, label, str(e.value))
    assert store.get("bad") is None and store.stats()["names"] == 0
    # and through the command line, once per kind of field
    kinds = {}
    for label, at, named in flips:
        kind = "n_rot" if "n_rot" in label else "type" if "type" in label else "size"
        kinds.setdefault(kind, (label, at, named))
    for label, at, named in kinds.values():
        b = bytearray(data)
        b[at] ^= 0xFF
        f.write_bytes(bytes(b))
        line = refused_by_cli(tmp_path / "store", f)
        assert f"at byte {named}:" in line, (label, line)
    assert_store_empty(tmp_path / "store")


def test_a_type_code_changed_to_another_defined_type_of_another_size_is_refused(state_files, store, oracle):
    data = state_files["smollm2_fa_on"].read_bytes()
    h = oracle.parse(data)["sections"][0]["streams"][0]["K"][2]["hdr"]
    for code in (8, 12, 30 + 1, 4):  # q8_0 (34-byte blocks), q4_K, removed id 31, removed id 4
        b = bytearray(data)
        struct.pack_into("<i", b, h, code)
        with pytest.raises(FormatError, match=f"at byte ({h}|{h + 4}):"):
            store.ingest_bytes("bad", bytes(b))
    b = bytearray(data)
    struct.pack_into("<i", b, h, 30)  # bf16: also 2 bytes an element, so the file is well formed
    assert store.ingest_bytes("fine", bytes(b))["n_tokens"] > 0
