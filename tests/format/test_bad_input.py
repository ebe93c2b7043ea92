"""Bad input: damaged, foreign or absurd files raise FormatError and change nothing; bad names raise InvalidName."""
from __future__ import annotations

import os
import struct

import pytest

from conftest import tree_snapshot

from kvstore import FormatError, InvalidName, KvStoreError
from kvstore.api import inspect_state, validate_name

BAD_NAMES = ["a/b", "../x", "..", "a\\b", "nul\x00byte", "x" * 10_000, "", "tab\tname", "line\nname"]


def _variants(data: bytes, oracle) -> dict[str, bytes]:
    info = oracle.parse(data)
    sec = info["sections"][0]
    cell_count_off = sec["start"] + 4  # u32 n_stream, then stream 0's u32 cell_count
    meta_off = sec["streams"][0]["meta_off"]
    v = {
        "empty": b"",
        "magic-only": data[:4],
        "header-only": data[:12],
        "cut-in-tokens": data[:12 + 4 * 3],
        "cut-in-cell-meta": data[:meta_off + 10],
        "cut-in-rows-third": data[: len(data) // 3],
        "cut-in-rows-half": data[: len(data) // 2],
        "cut-last-byte": data[:-1],
        "wrong-magic": b"ggsq" + data[4:],  # the bytes of the magic in the wrong order
        "version-3": data[:4] + struct.pack("<I", 3) + data[8:],
        "version-5": data[:4] + struct.pack("<I", 5) + data[8:],
        "huge-token-count": data[:8] + struct.pack("<I", 0xFFFFFFF0) + data[12:],
        "huge-cell-count": data[:cell_count_off] + struct.pack("<I", 0x7FFFFFFF) + data[cell_count_off + 4:],
        "cell-count-plus-one": data[:cell_count_off]
        + struct.pack("<I", struct.unpack_from("<I", data, cell_count_off)[0] + 1) + data[cell_count_off + 4:],
        "zero-streams": data[:sec["start"]] + struct.pack("<I", 0) + data[sec["start"] + 4:],
        "huge-streams": data[:sec["start"]] + struct.pack("<I", 0xFFFFFFFF) + data[sec["start"] + 4:],
        "random": os.urandom(4096),
        "png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + os.urandom(2000),
        "zeros": bytes(100_000),
    }
    # flipped bytes in the header fields (magic, version, token word count)
    for off in (0, 3, 4, 7, 11):
        b = bytearray(data)
        b[off] ^= 0xFF
        v[f"flip-{off}"] = bytes(b)
    return v


@pytest.fixture(scope="module")
def variants(state_files, oracle):
    return _variants(state_files["smollm2_fa_on"].read_bytes(), oracle)


def test_bad_files_are_refused_and_change_nothing(store, state_files, variants, tmp_path):
    good = state_files["smollm2_np2_slot1"]
    store.ingest("good", str(good))
    before_stats = store.stats()
    store_dir = tmp_path / "store"
    before_objects = tree_snapshot(store_dir / "objects")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    outside_before = None
    for label, data in variants.items():
        f = inputs / f"{label}.bin"
        f.write_bytes(data)
        if outside_before is None:
            outside_before = tree_snapshot(tmp_path, exclude=("store", "inputs"))
        for how, call in (("ingest", lambda: store.ingest("bad", str(f))),
                          ("ingest+remove", lambda: store.ingest("bad", str(f), remove_file=True)),
                          ("ingest_bytes", lambda: store.ingest_bytes("bad", data)),
                          ("inspect_state", lambda: inspect_state(str(f)))):
            try:
                call()
            except FormatError:
                pass
            else:
                pytest.fail(f"{label}: {how} accepted a bad file")
        assert f.read_bytes() == data, f"{label}: a refused file must not be removed"
        assert store.get("bad") is None, label
        assert store.stats() == before_stats, label
        assert tree_snapshot(store_dir / "objects") == before_objects, label
    assert sorted(p.name for p in inputs.iterdir()) == sorted(f"{k}.bin" for k in variants)
    assert tree_snapshot(tmp_path, exclude=("store", "inputs")) == outside_before
    out = tmp_path / "good.bin"
    store.materialize("good", str(out))
    assert out.read_bytes() == good.read_bytes()


def test_missing_file(store, tmp_path):
    with pytest.raises((OSError, KvStoreError)) as e:
        store.ingest("x", str(tmp_path / "nope.bin"))
    assert "nope.bin" in str(e.value)
    assert store.get("x") is None


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: repr(n[:20]))
def test_invalid_names(name, store, state_files, tmp_path):
    src = state_files["smollm2_fa_on"]
    before = store.stats()
    with pytest.raises(InvalidName):
        validate_name(name)
    with pytest.raises(InvalidName):
        store.ingest(name, str(src))
    if name:  # "" is the default namespace
        with pytest.raises(InvalidName):
            store.ingest("ok", str(src), namespace=name)
    with pytest.raises(InvalidName):
        store.materialize(name, str(tmp_path / "o.bin"))
    assert store.stats() == before
    assert not (tmp_path / "o.bin").exists()
    assert not list((tmp_path / "store" / "sync").iterdir())


def test_valid_unusual_names(store, state_files, tmp_path):
    """Names are data, never paths: spaces, unicode and dots inside are fine and round-trip."""
    src = state_files["smollm2_fa_on"]
    for name in ("user 42", "été", "a.b", "x" * 200, "with:colon"):
        store.ingest(name, str(src), namespace="t")
        assert store.get(name, namespace="t")["name"] == name
    assert {e["name"] for e in store.list(namespace="t")} == {"user 42", "été", "a.b", "x" * 200, "with:colon"}
