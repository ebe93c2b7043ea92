"""Round trips: every real slot file comes back byte for byte, and a materialized state continues exactly like
the original in a fresh llama-server, also re-emitted for another slot count."""
from __future__ import annotations

import shutil

import pytest

from conftest import MODELS, complete, copy_state, http, oracle_tokens, post_ok, tokenize
from make_states import ALL_CASES

import kvstore
from kvstore.api import inspect_state


@pytest.mark.parametrize("case", ALL_CASES)
def test_ingest_materialize_byte_exact(case, state_files, store, tmp_path, oracle):
    src = state_files[case]
    data = src.read_bytes()
    toks = oracle_tokens(oracle, src)
    if not toks:  # an empty slot: a valid file, but not a state (tests/test_bad_files.py)
        with pytest.raises(kvstore.FormatError, match="0 tokens"):
            store.ingest(case, str(src))
        assert inspect_state(str(src))["file_bytes"] == len(data) and store.get(case) is None
        return
    rep = store.ingest(case, str(src))
    assert rep["n_tokens"] == len(toks)
    assert rep["file_bytes"] == len(data)
    assert src.is_file(), "ingest without remove_file must leave the file"
    assert store.tokens(case) == toks
    info = inspect_state(str(src))
    assert info["n_tokens"] == len(toks) and info["file_bytes"] == len(data)
    assert [int(t) for t in info["tokens"]] == toks
    got = store.get(case)
    assert got["n_tokens"] == len(toks) and got["file_bytes"] == len(data)

    out = tmp_path / "out.bin"
    m = store.materialize(case, str(out))
    assert m["n_tokens"] == len(toks) and m["file_bytes"] == len(data)
    assert out.read_bytes() == data, f"{case}: materialized bytes differ from the original"
    # a second ingest of identical bytes stores no new block: at most a new manifest (it has its own time)
    rep2 = store.ingest_bytes(case + "-again", data)
    assert rep2["new_raw_bytes"] <= 65536 + 16 * len(toks), rep2
    out2 = tmp_path / "out2.bin"
    store.materialize(case + "-again", str(out2))
    assert out2.read_bytes() == data


def test_oracle_cli_agrees(state_files, store, tmp_path, oracle):
    """The oracle's command line (tests/slotfile.py, as CI runs it) reads what we materialize like the original;
    re-emitted for one stream, every K/V row of every layer is still there, bit for bit."""
    import subprocess
    import sys

    from conftest import ORACLE

    src = state_files["gemma3_parent"]
    store.ingest("p", str(src))
    out = tmp_path / "p.bin"
    store.materialize("p", str(out))
    a = subprocess.run([sys.executable, str(ORACLE), "info", str(src)], capture_output=True, text=True, check=True)
    b = subprocess.run([sys.executable, str(ORACLE), "info", str(out)], capture_output=True, text=True, check=True)
    assert a.stdout.replace(str(src), "F") == b.stdout.replace(str(out), "F")
    assert "appendix" in a.stdout and "n_stream 2" in a.stdout, a.stdout
    one = tmp_path / "one.bin"
    store.materialize("p", str(one), n_stream=1)
    info = oracle.parse(one.read_bytes())
    assert [s["n_stream"] for s in info["sections"]] == [1, 1]
    d = oracle.diff(src.read_bytes(), one.read_bytes())
    n_rows = len(oracle.rows(src.read_bytes()))
    assert len(d) == n_rows > 0
    assert all(x["identical"] == x["common"] > 0 for x in d), [x for x in d if x["identical"] != x["common"]]


@pytest.mark.parametrize("served", MODELS, indirect=True)
def test_restore_continues_identically(served, start_server, tmp_path, oracle):
    """Save slot 1 of a 2-slot server, continue there (the reference); then in fresh servers: the materialized
    (byte-exact) file restored into slot 0 of a same-config server, and the file re-emitted with n_stream=1
    restored into a 1-slot server, both continue with exactly the same greedy text. Without the re-emit the
    1-slot server refuses the file."""
    model = served.model
    url = served.url
    prompt = f"Write a short note about {model} and the sea. The note:"
    complete(url, prompt, 1, n_predict=4)
    post_ok(f"{url}/slots/1?action=save", {"filename": "roundtrip.bin"})
    orig = tmp_path / "orig.bin"
    shutil.move(str(served.sync / "roundtrip.bin"), orig)
    toks = oracle_tokens(oracle, orig)
    cont = toks + tokenize(url, " In the morning the boats")
    ref = complete(url, cont, 1, n_predict=8)
    assert ref["content"], ref

    st = kvstore.open_store(tmp_path / "store")
    st.ingest("rt", str(orig))

    # same config, fresh server, another slot
    c_dir = tmp_path / "c-sync"
    c = start_server(model, c_dir, parallel=2, ctx_size=2048, flash_attn="on")
    st.materialize("rt", str(c_dir / "same.bin"))
    assert (c_dir / "same.bin").read_bytes() == orig.read_bytes()
    r = post_ok(f"{c.url}/slots/0?action=restore", {"filename": "same.bin"})
    assert r["n_restored"] == len(toks)
    got = complete(c.url, cont, 0, n_predict=8)
    assert got["content"] == ref["content"]
    assert got["timings"]["cache_n"] > 0, "the restored state was not used"

    # 1-slot server: the 2-stream file is refused, the re-emitted one continues identically
    b_dir = tmp_path / "b-sync"
    b = start_server(model, b_dir, parallel=1, ctx_size=1024, flash_attn="on")
    copy_state(orig, b_dir / "two.bin")
    status, doc = http(f"{b.url}/slots/0?action=restore", {"filename": "two.bin"})
    assert status != 200, f"a 2-stream file restored into a 1-slot server: {doc}"
    m = st.materialize("rt", str(b_dir / "one.bin"), n_stream=1)
    assert m["n_tokens"] == len(toks)
    assert inspect_state(str(b_dir / "one.bin"))["n_stream"] == 1
    r = post_ok(f"{b.url}/slots/0?action=restore", {"filename": "one.bin"})
    assert r["n_restored"] == len(toks)
    got = complete(b.url, cont, 0, n_predict=8)
    assert got["content"] == ref["content"]
    assert got["timings"]["cache_n"] > 0
