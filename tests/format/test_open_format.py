"""The on-disk format is open (docs/design.md): LMDB tables readable with the `lmdb` package, objects with
`zstandard`, without kvstore's code."""
from __future__ import annotations

import json
import struct

import zstandard

from conftest import dump_index, object_path, oracle_tokens

from kvstore.api import hash_file


def read_object(path) -> bytes:
    data = path.read_bytes()
    magic, version, codec, planes, pad, raw_len = struct.unpack_from("<4sBBBBQ", data, 0)
    assert magic == b"KVOB" and version == 1 and pad == 0, (magic, version, pad)
    dctx = zstandard.ZstdDecompressor()
    if codec == 2:  # stored as is (compression would have saved too little)
        assert planes == 1
        raw = data[16:]
    elif codec == 0:
        raw = dctx.decompress(data[16:], max_output_size=raw_len)
    else:
        assert codec == 1 and planes >= 1
        lens = struct.unpack_from(f"<{planes}Q", data, 16)
        off = 16 + 8 * planes
        parts = []
        for n in lens:
            parts.append(dctx.decompress(data[off:off + n], max_output_size=raw_len))
            off += n
        assert off == len(data)
        raw = bytearray(raw_len)
        for p, part in enumerate(parts):
            raw[p::planes] = part
        raw = bytes(raw)
    assert len(raw) == raw_len
    return raw


def test_lmdb_and_objects_are_readable(store, state_files, tmp_path, oracle):
    src = state_files["gemma3_parent"]
    fp = {"model": "test-model", "n_ctx_slot": "2048"}
    store.ingest("doc", str(src), namespace="team", fingerprint=fp)
    store.ingest("doc", str(src), namespace="", fingerprint=fp)  # the default namespace: unkeyed ids
    d = tmp_path / "store"
    idx = dump_index(d)

    meta = {bytes.fromhex(k).decode(): bytes.fromhex(v).decode() for k, v in idx["meta"].items()}
    assert meta["schema_version"] == "1"
    assert int(meta["block_size"]) == store.block_size

    key = b"team\0doc".hex()
    assert key in idx["names"], list(idx["names"])
    entry = json.loads(bytes.fromhex(idx["names"][key]))
    mid = entry["manifest"]
    man_bytes = bytes.fromhex(idx["manifests"][mid])
    man = json.loads(man_bytes)
    data = src.read_bytes()
    assert man["version"] == 1
    assert man["file_bytes"] == len(data)
    assert man["file_hash"] == hash_file(str(src))
    assert man["n_tokens"] == len(oracle_tokens(oracle, data))
    assert man["tokens"] == oracle_tokens(oracle, data)
    assert man["fingerprint"]["model"] == "test-model"
    assert man["block_size"] == store.block_size

    # every object the manifest names: header, zstd frames, raw length, and its id: in the default namespace the
    # blake3 of the raw bytes; in "team" (the manifest's `scope`) keyed blake3 under derive_key("kvstore object
    # scope v1", "team") of the same bytes (docs/design.md "Objects"; Python's hashlib has no blake3 to recompute it)
    plain = json.loads(bytes.fromhex(idx["manifests"][json.loads(bytes.fromhex(idx["names"][b"\0doc".hex()]))
                                                     ["manifest"]]))
    assert man["scope"] == "team" and "scope" not in plain, (man.get("scope"), plain.get("scope"))
    ids = [man["skeleton"]] + list(man["blocks"])
    plain_ids = [plain["skeleton"]] + list(plain["blocks"])
    assert not set(ids) & set(plain_ids)  # the same bytes under two scopes: two ids
    raw_lens = {}
    codecs = set()
    for oid, plain_oid in dict(zip(ids, plain_ids)).items():
        codecs.add(object_path(d, oid).read_bytes()[5])
        raw = read_object(object_path(d, oid))
        assert read_object(object_path(d, plain_oid)) == raw
        tmp = tmp_path / "raw.bin"
        tmp.write_bytes(raw)
        assert hash_file(str(tmp)) == plain_oid
        row = bytes.fromhex(idx["objects"][oid])
        raw_len, stored_len = struct.unpack(">QQ", row)
        assert raw_len == len(raw) and stored_len == object_path(d, oid).stat().st_size
        raw_lens[oid] = len(raw)
    # KV rows are stored raw, the skeleton compressed: both layouts were read above
    assert 2 in codecs and codecs & {0, 1}, codecs
    # the file is its skeleton plus its blocks (referenced as often as they occur): no bytes are elsewhere
    assert sum(raw_lens[o] for o in ids) >= len(data) * 0.9
    # the manifest object holds the same bytes as the LMDB row
    mpath = object_path(d, mid)
    if mpath.exists():
        assert read_object(mpath) == man_bytes
    # prefix keys point at the manifest
    assert any(k.endswith(mid) for k in idx["prefixes"]), "no prefix key for the manifest"
